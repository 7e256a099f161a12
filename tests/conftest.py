"""Shared fixtures: the device and backend parametrizations, seeding, the hypothesis profile,
and the built book with a headless Chromium for the browser tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from ropelib import native

settings.register_profile(
    "ropelib", max_examples=30, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.load_profile("ropelib")


def pytest_configure(config) -> None:
    """book/_ext on the path, for the tests of kernel_watchdog (book/conftest.py
    has nbval use it on the chapters)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "book" / "_ext"))


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> torch.device:
    """Every available device; the CUDA cases skip cleanly on a machine without a GPU."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available on this machine")
    if request.param == "cuda":  # with its index, as tensors report it (cuda:0 != cuda)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(request.param)


@pytest.fixture(params=["native", "eager"])
def backend(request):
    """Run a test with ropelib's compiled CPU kernel and again with its eager paths.

    A missing compiler fails the native case rather than skipping it: the project's machines
    have one, and a silent fallback would leave the kernel untested.
    """
    if request.param == "native":
        assert native.unavailable_reason() is None, native.unavailable_reason()
    previous = native.set_enabled(request.param == "native")
    yield request.param
    native.set_enabled(previous)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def html_dir(tmp_path_factory) -> Path:
    """The book's HTML: $BOOK_HTML when set (``make test`` builds the book first, exactly as
    ``make book`` does), otherwise built once into a temporary folder."""
    if os.environ.get("BOOK_HTML"):
        return Path(os.environ["BOOK_HTML"]).resolve()
    out = tmp_path_factory.mktemp("book")
    root = Path(__file__).resolve().parent.parent
    subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(root),
                    "--path-output", str(out), "-W", "-n", "--keep-going"], check=True,
                   timeout=1800)
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium (Debian's, driven by Playwright) with a fresh profile, for one test
    module (Playwright's sync API runs one instance at a time: tests/test_lab_browser.py
    starts its own)."""
    from chromium import launch
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = launch(p, str(tmp_path_factory.mktemp("chromium-profile")))
        yield context
        context.close()
