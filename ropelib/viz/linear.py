"""The weights of linear attention with RoPE (RoFormer eq. (19)) next to the plain ones.

Linear attention's output for query m is ``sum_n a[m, n] v_n``. Without positions the weights
``a[m, n] = phi(q_m)^T phi(k_n) / sum_n' phi(q_m)^T phi(k_n')`` are positive and each row sums
to one. RoFormer rotates the features of the numerator only, so its weights can be negative
and their rows no longer sum to one. ``draw_linear_weights`` shows both: one query's weights
against the key position, and every row's sum against the query position. Inputs may be
NumPy arrays, nested lists or torch tensors (detached and copied to the CPU here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["draw_linear_weights"]


def _as_matrix(name: str, weights: Any) -> np.ndarray:
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().numpy()
    matrix = np.asarray(weights, dtype=float)
    if matrix.ndim != 2 or 0 in matrix.shape:
        raise ValueError(f"{name} must be a non-empty 2-D (queries, keys) matrix, got shape "
                         f"{matrix.shape}; select one batch element and one head first")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} must be finite, got a matrix with NaN or inf")
    return matrix


def draw_linear_weights(fig: Figure, plain: Any, rope: Any, *, query: int,
                        labels: Sequence[str] = ("without positions", "RoPE, eq. (19)")
                        ) -> tuple[Axes, Axes]:
    """Two panels: row ``query`` of both weight matrices, and the row sums of both.

    Args:
        fig: an empty Figure to draw on.
        plain: ``(queries, keys)`` weights of linear attention without positions.
        rope: ``(queries, keys)`` weights with RoPE in the numerator, same shape.
        query: the row shown in the left panel (0 <= query < queries).
        labels: legend entries of ``plain`` and ``rope``.

    Returns:
        The two Axes: weights of one query against the key position n, and the sum of each
        row against the query position m (a dotted line marks 1).
    """
    a, b = _as_matrix("plain", plain), _as_matrix("rope", rope)
    if a.shape != b.shape:
        raise ValueError(f"plain and rope must have the same shape, got {a.shape} and {b.shape}")
    if isinstance(query, bool) or not isinstance(query, (int, np.integer)):
        raise TypeError(f"query must be an int, got {type(query).__name__}")
    if not 0 <= query < a.shape[0]:
        raise ValueError(f"query must be in [0, {a.shape[0]}), got {query}")
    if len(labels) != 2:
        raise ValueError(f"labels must name plain and rope (2 entries), got {len(labels)}")
    left, right = fig.subplots(1, 2)
    keys = np.arange(a.shape[1])
    left.plot(keys, a[query], ".-", color="0.45", label=labels[0])
    left.plot(keys, b[query], ".-", color="C0", label=labels[1])
    left.axhline(0.0, color="0.3", linewidth=0.8)
    negative = b[query] < 0
    left.plot(keys[negative], b[query][negative], "o", color="C3", markersize=5,
              label="negative weights")
    left.axvline(query, color="0.6", linestyle=":", linewidth=1)
    left.set_xlabel("key position n")
    left.set_ylabel(f"weight $a_{{mn}}$, query m = {query}")
    left.legend(fontsize="small")
    queries = np.arange(a.shape[0])
    right.plot(queries, a.sum(axis=1), ".-", color="0.45", label=labels[0])
    right.plot(queries, b.sum(axis=1), ".-", color="C0", label=labels[1])
    right.axhline(1.0, color="0.3", linestyle=":", linewidth=1)
    right.set_xlabel("query position m")
    right.set_ylabel(r"row sum $\sum_n a_{mn}$")
    right.legend(fontsize="small")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    return left, right
