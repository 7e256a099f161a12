"""The core package: ``import ropelib`` loads only torch, numpy and ropelib's core modules.

Book support (``ropelib.book``) and plotting (``ropelib.viz``) are separate subpackages that
the core never imports.
"""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_core_import_loads_no_book_support_or_plotting():
    loaded = _modules_after("import ropelib")
    assert "ropelib.rotation" in loaded  # the probe sees ropelib's own modules
    for absent in ("ropelib.book", "ropelib.viz", "matplotlib", "ipywidgets", "IPython"):
        assert not any(m == absent or m.startswith(absent + ".") for m in loaded), absent


def test_book_support_lives_in_its_own_subpackage():
    loaded = _modules_after("import ropelib.book.toy, ropelib.book.bench, ropelib.book.baselines, "
                            "ropelib.book.timing, ropelib.book.layer")
    assert {"ropelib.book.toy", "ropelib.book.bench", "ropelib.book.baselines",
            "ropelib.book.timing", "ropelib.book.layer"} <= loaded
