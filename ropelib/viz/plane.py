"""RoPE in two dimensions: a query and a key rotated in the plane by m*theta and n*theta.

``draw_rotation_plane(fig, theta=..., m=..., n=...)`` follows the ``draw(fig, **params)``
contract of :func:`ropelib.viz.live_slider` and :func:`ropelib.viz.scrubber`. It draws two
panels into ``fig``:

- left, the plane: q and k (dashed), the rotated query R_m q and key R_n k (solid), the angle
  between the rotated vectors and their dot product;
- right, the score as a function of the gap m - n, with the current gap marked. The curve is
  the same for every (m, n): the score depends on the positions only through m - n.

The numbers behind the picture come from :func:`plane_state` (plain float64 NumPy), so a test or
a chapter can check exactly what the figure shows. Artists carry a ``gid`` ("q", "k", "q_rot",
"k_rot", "angle_arc", "dot_text", "score_curve", "current_score") so they can be found again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Arc

DEFAULT_Q: tuple[float, float] = (1.0, 0.25)
DEFAULT_K: tuple[float, float] = (0.45, 0.75)
Q_COLOR, K_COLOR, ANGLE_COLOR = "tab:blue", "tab:orange", "tab:green"


@dataclass(frozen=True)
class PlaneState:
    """Everything the figure shows, in float64.

    ``angle`` is the signed angle from R_n k to R_m q, wrapped to (-pi, pi]; ``dot`` is the
    score <R_m q, R_n k> = |q| |k| cos(angle).
    """

    theta: float
    m: float
    n: float
    q: np.ndarray
    k: np.ndarray
    q_rot: np.ndarray
    k_rot: np.ndarray
    angle: float
    dot: float


def rotation_matrix(angle: float) -> np.ndarray:
    """The 2x2 matrix [[cos a, -sin a], [sin a, cos a]] that rotates counterclockwise by ``angle``."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]], dtype=np.float64)


def _vector(name: str, value: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        v = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a 2-vector of numbers like (1.0, 0.5), got {value!r}") from err
    if v.shape != (2,):
        raise ValueError(f"{name} must have shape (2,) (a vector in the plane), got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite, got {v.tolist()}")
    return v


def _scalar(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _wrap(angle: float) -> float:
    """angle reduced to (-pi, pi]."""
    wrapped = math.remainder(angle, 2 * math.pi)
    return math.pi if wrapped == -math.pi else wrapped


def plane_state(theta: float, m: float, n: float, q: Sequence[float] | np.ndarray = DEFAULT_Q,
                k: Sequence[float] | np.ndarray = DEFAULT_K) -> PlaneState:
    """Rotate q by m*theta and k by n*theta and measure the angle and the dot product between them.

    Args:
        theta: rotation frequency (radians per position).
        m: position of the query.
        n: position of the key.
        q, k: the unrotated query and key, 2-vectors.

    Returns:
        A :class:`PlaneState` with ``q_rot = R(m theta) q``, ``k_rot = R(n theta) k``, the
        signed angle from ``k_rot`` to ``q_rot`` and ``dot = q_rot . k_rot``.
    """
    theta, m, n = _scalar("theta", theta), _scalar("m", m), _scalar("n", n)
    qv, kv = _vector("q", q), _vector("k", k)
    q_rot = rotation_matrix(m * theta) @ qv
    k_rot = rotation_matrix(n * theta) @ kv
    angle = _wrap(math.atan2(q_rot[1], q_rot[0]) - math.atan2(k_rot[1], k_rot[0]))
    return PlaneState(theta=theta, m=m, n=n, q=qv, k=kv, q_rot=q_rot, k_rot=k_rot,
                      angle=angle, dot=float(q_rot @ k_rot))


def _label_position(tip: np.ndarray, radius: float) -> tuple[float, float]:
    """Just beyond the arrow's tip (a fixed distance out), kept inside the axes."""
    length = float(np.linalg.norm(tip))
    direction = tip / length if length > 0 else np.array([1.0, 0.0])
    x, y = tip + 0.14 * radius * direction
    limit = 0.92 * radius
    return float(np.clip(x, -limit, limit)), float(np.clip(y, -limit, limit))


def _arrow(ax: Axes, end: np.ndarray, color: str, gid: str, *, dashed: bool = False) -> None:
    style = {"arrowstyle": "-|>", "color": color, "lw": 1.2 if dashed else 2.2,
             "shrinkA": 0, "shrinkB": 0, "alpha": 0.55 if dashed else 1.0,
             "linestyle": "--" if dashed else "-", "mutation_scale": 12}
    ax.annotate("", xy=(float(end[0]), float(end[1])), xytext=(0.0, 0.0),
                arrowprops=style, gid=gid)


def draw_rotation_plane(fig: Figure, theta: float, m: float, n: float,
                        q: Sequence[float] | np.ndarray = DEFAULT_Q,
                        k: Sequence[float] | np.ndarray = DEFAULT_K, *, max_gap: int = 12
                        ) -> PlaneState:
    """Draw q, k, R_m q, R_n k, the angle between the rotated vectors and the score into ``fig``.

    Usable as ``live_slider(draw_rotation_plane, theta=..., m=..., n=...)`` or
    ``scrubber(draw_rotation_plane, "m", values, fixed={...})``; to move m and n together,
    wrap it, e.g. ``lambda fig, m: draw_rotation_plane(fig, theta, m, m - 3)``.

    Args:
        fig: an empty matplotlib figure (two axes are added).
        theta: rotation frequency (radians per position).
        m: position of the query.
        n: position of the key.
        q, k: the unrotated query and key.
        max_gap: the right panel shows the score for gaps m - n in [-max_gap, max_gap],
            widened to [-|m - n|, |m - n|] (rounded up) when the current gap lies outside,
            so the marker of the current gap is always inside the panel.

    Returns:
        The :class:`PlaneState` that was drawn.
    """
    state = plane_state(theta, m, n, q, k)
    if isinstance(max_gap, bool) or not isinstance(max_gap, int) or max_gap < 1:
        raise ValueError(f"max_gap must be a positive int, got {max_gap!r}")
    gap_range = max(max_gap, math.ceil(abs(state.m - state.n)))
    plane, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.25]})

    radius = 1.35 * max(float(np.linalg.norm(state.q)), float(np.linalg.norm(state.k)), 1e-9)
    for vec, color in ((state.q, Q_COLOR), (state.k, K_COLOR)):
        ring = np.linspace(0.0, 2 * math.pi, 121)
        r = float(np.linalg.norm(vec))
        plane.plot(r * np.cos(ring), r * np.sin(ring), color=color, lw=0.6, alpha=0.3)
    _arrow(plane, state.q, Q_COLOR, "q", dashed=True)
    _arrow(plane, state.k, K_COLOR, "k", dashed=True)
    _arrow(plane, state.q_rot, Q_COLOR, "q_rot")
    _arrow(plane, state.k_rot, K_COLOR, "k_rot")
    for label, tip, color, alpha in (("$q$", state.q, Q_COLOR, 0.6), ("$k$", state.k, K_COLOR, 0.6),
                                     ("$R_m q$", state.q_rot, Q_COLOR, 1.0),
                                     ("$R_n k$", state.k_rot, K_COLOR, 1.0)):
        plane.text(*_label_position(tip, radius), label, color=color, alpha=alpha,
                   ha="center", va="center", fontsize="small")

    k_dir = math.degrees(math.atan2(state.k_rot[1], state.k_rot[0]))
    span = math.degrees(state.angle)
    start, end = (k_dir, k_dir + span) if span >= 0 else (k_dir + span, k_dir)
    arc = Arc((0.0, 0.0), 0.6 * radius, 0.6 * radius, theta1=start, theta2=end,
              color=ANGLE_COLOR, lw=1.8, gid="angle_arc")
    plane.add_patch(arc)

    plane.set_xlim(-radius, radius)
    plane.set_ylim(-radius, radius)
    plane.set_aspect("equal")
    plane.axhline(0.0, color="0.8", lw=0.6, zorder=0)
    plane.axvline(0.0, color="0.8", lw=0.6, zorder=0)
    plane.set_xticks([])
    plane.set_yticks([])
    # titles as plain text: set_title re-measures the axes on every draw (slow in animations)
    plane.text(0.5, 1.02, f"m = {state.m:g}, n = {state.n:g}, θ = {state.theta:.2f}",
               transform=plane.transAxes, ha="center", va="bottom", fontsize="medium")
    plane.text(0.5, -0.03, f"angle = {state.angle:+.2f} rad\n"
               f"$\\langle R_m q, R_n k\\rangle$ = {state.dot:.3f}", transform=plane.transAxes,
               fontsize="small", ha="center", va="top", color="0.15", gid="dot_text")

    norm = float(np.linalg.norm(state.q) * np.linalg.norm(state.k))
    alpha = math.atan2(state.q[1], state.q[0]) - math.atan2(state.k[1], state.k[0])
    gaps = np.linspace(-gap_range, gap_range, 8 * gap_range + 1)
    curve.plot(gaps, norm * np.cos(alpha + gaps * state.theta), color="0.6", lw=1.0)
    integer_gaps = np.arange(-gap_range, gap_range + 1)
    curve.plot(integer_gaps, norm * np.cos(alpha + integer_gaps * state.theta), "o",
               color="0.45", ms=3, gid="score_curve")
    curve.plot([state.m - state.n], [state.dot], "o", color=ANGLE_COLOR, ms=9,
               gid="current_score")
    curve.axhline(0.0, color="0.8", lw=0.6, zorder=0)
    curve.set_xlim(-gap_range - 0.5, gap_range + 0.5)
    top = norm if norm > 0 else 1.0  # a zero q or k: flat curve, keep a visible range
    curve.set_ylim(-1.15 * top, 1.15 * top)
    curve.set_xlabel("gap m − n")
    curve.set_ylabel("score")
    curve.text(0.5, 1.02, "score against the gap", transform=curve.transAxes, ha="center",
               va="bottom", fontsize="medium")
    step = max(1, gap_range // 2)
    curve.set_xticks(np.arange(-(gap_range // step) * step, gap_range + 1, step))
    curve.set_yticks([-top, 0.0, top], [f"{-top:.2f}", "0", f"{top:.2f}"])
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.2, top=0.9, wspace=0.3)
    return state
