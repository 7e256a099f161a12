"""Headless Chromium for the browser tests: Debian's build, driven by Playwright.

``tests/run_all.sh`` installs Debian's ``chromium``; Playwright never downloads a browser here.
"""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def launch(playwright, profile: str):
    """A persistent Chromium context with a fresh profile folder ``profile``."""
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
