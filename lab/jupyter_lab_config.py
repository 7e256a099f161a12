"""JupyterLab set up for this book (used by ``make lab`` and tests/test_lab_browser.py).

Both run JupyterLab with JUPYTER_CONFIG_DIR=lab, so Jupyter reads this file and
lab/custom/custom.css from here, and no configuration from the user's home.

Everything JupyterLab reads or writes stays in the project, not in the user's home:
the defaults in lab/settings/overrides.json5 (no news pop-up, widget state saved in the
notebook, every cell rendered), lab/custom/custom.css (references that jupyterlab-myst
cannot resolve), and the reader's own settings, workspaces and notebook trust under .venv/lab/.
Runs as root only where it is root (containers); binds to $LAB_IP (default 127.0.0.1).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

c.ServerApp.root_dir = str(ROOT / "book")
c.ServerApp.ip = os.environ.get("LAB_IP", "127.0.0.1")
c.ServerApp.port = int(os.environ.get("LAB_PORT", "8888"))
c.ServerApp.allow_root = os.geteuid() == 0
c.ServerApp.open_browser = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                or sys.platform == "darwin")
c.LabApp.app_settings_dir = str(ROOT / "lab" / "settings")
c.LabApp.user_settings_dir = str(ROOT / ".venv" / "lab" / "user-settings")
c.LabApp.workspaces_dir = str(ROOT / ".venv" / "lab" / "workspaces")
c.NotebookNotary.data_dir = str(ROOT / ".venv" / "lab" / "trust")
Path(c.NotebookNotary.data_dir).mkdir(parents=True, exist_ok=True)
c.LabApp.custom_css = True
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
