"""Sphinx extension: the book's source as one download, so that a reader of
the HTML can run the chapters live.

When the HTML is written, ``_static/rope-book.zip`` receives the project's
files: those git tracks or would track (``git ls-files --cached --others
--exclude-standard``), or, outside a git checkout, every file but the build,
the virtual environment and caches. Unpacked, it is the folder ``rope-book/``
where ``make lab`` sets everything up (the landing page says so and links
it).
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

ARCHIVE = "rope-book.zip"
FOLDER = "rope-book"
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "_build",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
    ".hypothesis",
}


def project_files(root: Path) -> list[Path]:
    """The files of the project at ``root``, relative to it, sorted."""
    try:
        listed = subprocess.run(
            [
                "git",
                "ls-files",
                "--cached",
                "--others",
                "--exclude-standard",
                "-z",
            ],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        files = [Path(name) for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        files = [
            path.relative_to(root)
            for path in root.rglob("*")
            if path.is_file()
            and not SKIPPED_DIRS & set(path.relative_to(root).parts)
        ]
    return sorted(path for path in files if (root / path).is_file())


def write_archive(root: Path, target: Path) -> int:
    """Zip the project's files under ``FOLDER/`` into ``target``; returns
    how many."""
    files = project_files(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(
        target, "w", compression=zipfile.ZIP_DEFLATED
    ) as archive:
        for path in files:
            archive.write(root / path, f"{FOLDER}/{path.as_posix()}")
    return len(files)


def _write(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        write_archive(Path(app.srcdir), Path(app.outdir) / "_static" / ARCHIVE)


def setup(app):
    app.connect("build-finished", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
