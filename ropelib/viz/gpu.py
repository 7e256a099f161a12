"""Chapter 15's figures and tables: the steps of a GPU kernel against their byte budget, and
one program's tile.

- ``draw_step_ratios``: each step's measured time (in copies) against the time its traffic
  predicts at the copy's rate (also in copies). On the diagonal the bytes explain the time;
  above it something else costs time; below it some of the bytes came from a cache.
- ``draw_program_tile``: which (head, token) rows of q and k one program of a kernel wrote,
  among the rows of every other program, and which rows of the tables it read (from a trace
  of the kernel in Triton's interpreter, ``ropelib.book.triton_probe``).
- ``ratio_table_html``: rows of text and numbers as an HTML table (no pandas).
- ``draw_machine``: the path a byte takes on a GPU, from its memory (HBM) through the L2
  cache to the streaming multiprocessors (SMs) that run a kernel's programs.
- ``draw_launch_grid``: a launch's grid of programs over (token block, head) and the tiles
  one program loads: its tokens' two halves of each row and their cos and sin rows.

The data are measured or traced elsewhere; these functions only draw and format.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, NullLocator

__all__ = ["draw_launch_grid", "draw_machine", "draw_program_tile", "draw_step_ratios", "ratio_table_html"]

DTYPE_MARKERS = {"bfloat16": "o", "float32": "s"}
LAYOUT_SHIFT = {"half": 1 / 1.02, "interleaved": 1.02}


def draw_step_ratios(ax: Axes, points: Sequence, *, steps: Sequence[str]) -> None:
    """Measured time against predicted time, both in copies, log-log.

    Args:
        ax: the axes.
        points: objects with ``step``, ``dtype`` ("bfloat16" or "float32"), ``layout``
            ("half" or "interleaved"), ``predicted`` (the traffic in copies), ``measured``
            (the ratios measured over the launches timed) and ``shown`` (the ratio drawn as
            the point); the range of ``measured`` is drawn as a vertical bar.
        steps: the step names in the legend's order (every point's step among them).
    """
    if not points:
        raise ValueError("points is empty: nothing to draw")
    unknown = {p.step for p in points} - set(steps)
    if unknown:
        raise ValueError(f"points of steps not in steps: {sorted(unknown)}")
    colours = {step: f"C{i}" for i, step in enumerate(steps)}
    for p in points:
        if p.dtype not in DTYPE_MARKERS or p.layout not in LAYOUT_SHIFT:
            raise ValueError(f"dtype must be one of {list(DTYPE_MARKERS)} and layout one of "
                             f"{list(LAYOUT_SHIFT)}, got {p.dtype!r}, {p.layout!r}")
        x = p.predicted * LAYOUT_SHIFT[p.layout]
        low, high = min(p.measured), max(p.measured)
        colour = colours[p.step]
        ax.plot([x, x], [low, high], color=colour, lw=2, alpha=0.6, solid_capstyle="butt")
        ax.plot([x], [p.shown], marker=DTYPE_MARKERS[p.dtype], ms=8, color=colour,
                markerfacecolor=colour if p.layout == "half" else "white", mew=1.6,
                linestyle="none")
    highs = [max(p.measured) for p in points]
    top = max(2.5, 1.3 * max(highs))
    right = 1.15 * max(p.predicted for p in points)
    line = np.geomspace(0.9, right, 50)
    ax.plot(line, line, color="0.3", lw=1, zorder=0)
    ax.axhline(1.0, color="0.5", lw=1, ls="--", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.93, right)
    ax.set_ylim(0.9, top)
    ticks = [t for t in (1, 1.25, 1.5, 2, 3, 5, 10, 20) if t <= top]
    for axis, values in ((ax.xaxis, [t for t in ticks if t <= right]), (ax.yaxis, ticks)):
        axis.set_major_locator(FixedLocator(values))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(lambda v, _pos: f"{v:g}")
    ax.set_xlabel("predicted: bytes asked for / bytes of a copy")
    ax.set_ylabel("measured: time / time of copy_")
    at = math.sqrt(right * 1.5) if right > 1.6 else math.sqrt(right)
    ax.text(at, at / 1.04, "time = bytes at\nthe copy's rate", ha="left", va="top",
            fontsize="small", color="0.3")
    ax.text(right / 1.02, 1.01, "copy_", ha="right", va="bottom", fontsize="small",
            color="0.4")
    handles = [Line2D([], [], color=colours[s], lw=3, label=s) for s in steps
               if any(p.step == s for p in points)]
    handles += [Line2D([], [], marker=m, color="0.3", linestyle="none", label=d)
                for d, m in DTYPE_MARKERS.items() if any(p.dtype == d for p in points)]
    handles += [Line2D([], [], marker="o", color="0.3", markerfacecolor=face, linestyle="none",
                       label=f"{layout} layout")
                for layout, face in (("half", "0.3"), ("interleaved", "white"))
                if any(p.layout == layout for p in points)]
    ax.legend(handles=handles, loc="upper left", fontsize="small", frameon=False)


def draw_program_tile(ax_x: Axes, ax_table: Axes, owner: torch.Tensor, selected: int,
                      table_rows: torch.Tensor, heads_q: int, *, title: str = "",
                      labels: Sequence[str] | None = None) -> None:
    """One program's tile among all programs' tiles, tokens along x in both panels.

    Args:
        ax_x: axes for the (head, token) rows of q then k of one batch entry.
        ax_table: axes for the table (pairs x tokens), below ``ax_x``.
        owner: ``(heads_q + heads_k, seq)`` integers: the program that wrote each row
            (-1: none).
        selected: the program to highlight (a value of ``owner``).
        table_rows: ``(seq, pairs)`` bools: the table entries the selected program read.
        heads_q: how many of the heads are q's (the rest are k's).
        title: the upper panel's title.
        labels: a label per program (indexed by the values of ``owner``), written in the
            middle of its tile; None for none.
    """
    owner = torch.as_tensor(owner)
    table_rows = torch.as_tensor(table_rows)
    if owner.dim() != 2 or table_rows.dim() != 2 or table_rows.shape[0] != owner.shape[1]:
        raise ValueError(f"owner must be (heads, seq) and table_rows (seq, pairs), got "
                         f"{tuple(owner.shape)} and {tuple(table_rows.shape)}")
    if not (owner == selected).any():
        raise ValueError(f"selected program {selected} owns no row of owner")
    heads, seq = owner.shape
    others = ListedColormap(["white", "#dfe7f2", "#f2e6d8"])
    shade = torch.where(owner < 0, 0, 1 + owner % 2).numpy()
    ax_x.imshow(shade, cmap=others, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    mine = (owner == selected).numpy()
    ax_x.imshow(np.ma.masked_where(~mine, mine), cmap=ListedColormap(["C3"]), aspect="auto",
                interpolation="nearest")
    for value in owner.unique().tolist():  # outline every program's tile
        if value < 0:
            continue
        rows, cols = np.nonzero((owner == value).numpy())
        ax_x.add_patch(Rectangle((cols.min() - 0.5, rows.min() - 0.5),
                                 cols.max() - cols.min() + 1, rows.max() - rows.min() + 1,
                                 fill=False, lw=2.5 if value == selected else 0.8,
                                 edgecolor="black" if value == selected else "0.45"))
        if labels is not None:
            ax_x.text((cols.min() + cols.max()) / 2, (rows.min() + rows.max()) / 2,
                      labels[value], ha="center", va="center", fontsize="small",
                      color="white" if value == selected else "0.2")
    ax_x.axhline(heads_q - 0.5, color="black", lw=1.5)
    ax_x.set_yticks(range(heads), [f"q{h}" if h < heads_q else f"k{h - heads_q}"
                                   for h in range(heads)])
    ax_x.set_ylabel("head")
    ax_x.set_title(title)
    ax_x.tick_params(labelbottom=False)
    read = table_rows.T.numpy()
    ax_table.imshow(np.where(read, 1, 0), cmap=ListedColormap(["#f4f4f4", "C3"]), vmin=0,
                    vmax=1, aspect="auto", interpolation="nearest")
    ax_table.set_ylabel("pair i")
    ax_table.set_xlabel("token")
    ax_table.set_title("cos table: the entries it reads (sin alike)")
    pairs = table_rows.shape[1]
    ax_table.set_yticks([0, pairs - 1], ["0", str(pairs - 1)])
    for ax in (ax_x, ax_table):
        ax.set_xlim(-0.5, seq - 0.5)


def ratio_table_html(header: Sequence[str], rows: Sequence[Sequence[object]], *,
                     caption: str = "") -> str:
    """An HTML table: ``header`` cells, then ``rows`` (strings as they are, floats with two
    decimals, None as an empty cell)."""
    def cell(value: object) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.2f}"
        return html.escape(str(value))

    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"every row needs {len(header)} cells (the header's), got "
                             f"{len(row)}: {row!r}")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    top = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{top}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def draw_machine(ax: Axes, *, hbm_gb: float, hbm_tbps: float, l2_mb: float, sms: int) -> None:
    """A GPU as a kernel sees it: HBM, the L2 cache, and a grid of SMs, one of them
    running a program on its tile in registers.

    Args:
        ax: the axes (its axis is turned off).
        hbm_gb: the memory's size in GB; hbm_tbps: its peak bandwidth in TB/s.
        l2_mb: the L2 cache's size in MB.
        sms: the number of streaming multiprocessors, one small square each.
    """
    for name, value in (("hbm_gb", hbm_gb), ("hbm_tbps", hbm_tbps), ("l2_mb", l2_mb),
                        ("sms", sms)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if int(sms) != sms:
        raise ValueError(f"sms must be a whole number, got {sms!r}")
    sms = int(sms)
    boxes = {"hbm": (0.0, 0.15, 0.22, 0.7, "C0"), "l2": (0.36, 0.25, 0.16, 0.5, "C1")}
    for x, y, w, h, colour in boxes.values():
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=0.25, edgecolor=colour,
                               gid="unit"))
    ax.text(0.11, 0.5, f"HBM (DRAM)\n{hbm_gb:g} GB", ha="center", va="center",
            fontsize="small")
    ax.text(0.44, 0.5, f"L2 cache\n{l2_mb:g} MB", ha="center", va="center",
            fontsize="small")
    ax.annotate("", xy=(0.36, 0.5), xytext=(0.22, 0.5),
                arrowprops={"arrowstyle": "<->", "lw": 1.5})
    ax.text(0.29, 0.56, f"{hbm_tbps:g} TB/s", ha="center", va="bottom", fontsize="small")
    columns = math.ceil(math.sqrt(sms))
    rows = math.ceil(sms / columns)
    left, bottom, width, height = 0.66, 0.15, 0.3, 0.7
    cell_w, cell_h = width / columns, height / rows
    for index in range(sms):
        row, column = divmod(index, columns)
        ax.add_patch(Rectangle((left + column * cell_w, bottom + height - (row + 1) * cell_h),
                               0.8 * cell_w, 0.8 * cell_h,
                               facecolor="C2" if index else "C3", alpha=0.6, gid="sm"))
    ax.annotate("", xy=(left, 0.5), xytext=(0.52, 0.5),
                arrowprops={"arrowstyle": "<->", "lw": 1.5})
    ax.text(left + width / 2, bottom - 0.03,
            f"{sms} SMs: each runs programs, a tile in its registers",
            ha="center", va="top", fontsize="small")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()


def draw_launch_grid(ax_grid: Axes, ax_tile: Axes, *, seq: int, block_s: int, heads: int,
                     head_dim: int, selected: tuple[int, int]) -> None:
    """The grid of a launch with one program per block of tokens of one head, and the tiles
    one program loads (half layout).

    Args:
        ax_grid: axes for the grid: tokens along x, heads along y, one outlined box per
            program ``(t, h)`` (its ``block_s`` tokens of head ``h``); the lanes of the last
            block past ``seq`` are hatched (masked off).
        ax_tile: axes for the tiles of the program ``selected``: ``a`` (channels
            ``0 .. head_dim/2 - 1``) and ``b`` (the other half) of its tokens' rows, and
            the rows of cos and sin, each ``block_s`` tokens by ``head_dim / 2`` pairs.
        seq, block_s, heads, head_dim: the tokens, the tokens a program, the heads (rows of
            the grid) and the channels of a head (even).
        selected: the program ``(t, h)`` filled red and drawn in ``ax_tile``.
    """
    for name, value in (("seq", seq), ("block_s", block_s), ("heads", heads),
                        ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (pairs of channels), got {head_dim}")
    blocks = math.ceil(seq / block_s)
    t_sel, h_sel = selected
    if not (0 <= t_sel < blocks and 0 <= h_sel < heads):
        raise ValueError(f"selected must be a program (t, h) with t < {blocks} and "
                         f"h < {heads}, got {selected!r}")
    for t in range(blocks):
        for h in range(heads):
            mine = (t, h) == (t_sel, h_sel)
            ax_grid.add_patch(Rectangle((t * block_s, h), block_s, 1,
                                        facecolor="C3" if mine else "#dfe7f2",
                                        edgecolor="black", lw=2 if mine else 0.8,
                                        gid="program"))
            ax_grid.text((t + 0.5) * block_s, h + 0.5, f"({t}, {h})", ha="center",
                         va="center", fontsize="small", color="white" if mine else "0.2")
    if blocks * block_s > seq:
        ax_grid.add_patch(Rectangle((seq, 0), blocks * block_s - seq, heads, fill=False,
                                    hatch="///", edgecolor="0.5", lw=0, gid="masked"))
    ax_grid.set_xlim(0, blocks * block_s)
    ax_grid.set_ylim(heads, 0)
    ax_grid.set_xticks([t * block_s for t in range(blocks)] + [seq])
    ax_grid.set_yticks([h + 0.5 for h in range(heads)], [str(h) for h in range(heads)])
    ax_grid.set_xlabel("token")
    ax_grid.set_ylabel("head h")
    ax_grid.set_title("the grid: program (t, h)")
    half = head_dim // 2
    gap = max(1, half // 4)
    tiles = (("a", "C0"), ("b", "C0"), ("cos", "C1"), ("sin", "C1"))
    for index, (name, colour) in enumerate(tiles):
        left = index * half + (gap if index >= 2 else 0)
        ax_tile.add_patch(Rectangle((left, 0), half, block_s, facecolor=colour, alpha=0.3,
                                    edgecolor=colour, lw=1.5, gid="tile"))
        for token in range(1, block_s):
            ax_tile.plot([left, left + half], [token, token], color=colour, lw=0.3)
        ax_tile.text(left + half / 2, block_s / 2, name, ha="center", va="center")
    first = t_sel * block_s
    ax_tile.set_xlim(-0.5, 4 * half + gap + 0.5)
    ax_tile.set_ylim(block_s, 0)
    ax_tile.set_xticks([0, half, 2 * half + gap, 3 * half + gap],
                       ["0", f"{half}", "0", "0"])
    ax_tile.set_yticks([0.5, block_s - 0.5], [str(first), str(first + block_s - 1)])
    ax_tile.set_xlabel("channel of x | pair i")
    ax_tile.set_ylabel("token")
    ax_tile.set_title(f"the tiles of program {selected}")
