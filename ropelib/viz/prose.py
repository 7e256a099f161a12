"""Numbers for the prose: computed in a cell, shown in the text with MyST's ``{eval}`` role.

A chapter's markdown says ``{eval}`s20``` where a code cell above set
``s20 = shown(value, ".3f")``. The HTML book evaluates the name while it executes the
notebook (Jupyter Book's inline execution), and JupyterLab with ``jupyterlab-myst``
evaluates the same name in the live kernel, so both show the same computed text.
"""

from __future__ import annotations


class Shown(str):
    """Text of a computed number whose ``repr`` is the text itself (no quotes), because an
    evaluated name is shown through its plain-text representation."""

    def __repr__(self) -> str:
        return str(self)


def shown(value: object, spec: str = "") -> Shown:
    """``format(value, spec)`` as prose text, e.g. ``shown(1.90906, ".3f")`` -> ``1.909``.

    Tensors and NumPy scalars with one element are formatted as Python numbers.
    """
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    return Shown(format(value, spec))
