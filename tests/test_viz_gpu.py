"""ropelib.viz.gpu: chapter 15's step figure, the program tile and the HTML table."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from ropelib.viz.gpu import (  # noqa: E402
    draw_launch_grid,
    draw_machine,
    draw_program_tile,
    draw_step_ratios,
    ratio_table_html,
)

STEPS = ("one", "two")


def point(step="one", dtype="bfloat16", layout="half", predicted=2.0, measured=(1.9, 2.1),
          shown=2.0):
    return SimpleNamespace(step=step, dtype=dtype, layout=layout, predicted=predicted,
                           measured=measured, shown=shown)


def test_step_ratios_draws_each_point_its_range_and_the_diagonal():
    fig, ax = plt.subplots()
    points = [point(), point("two", "float32", "interleaved", 1.5, (3.0, 9.0), 6.0)]
    draw_step_ratios(ax, points, steps=STEPS)
    markers = [line for line in ax.lines if line.get_marker() in ("o", "s")
               and len(line.get_xdata()) == 1]
    assert len(markers) == 2
    square = next(m for m in markers if m.get_marker() == "s")
    assert square.get_ydata()[0] == 6.0 and square.get_markerfacecolor() == "white"
    assert square.get_xdata()[0] == pytest.approx(1.5 * 1.02)  # interleaved: shifted right
    bars = [line for line in ax.lines if len(line.get_xdata()) == 2
            and line.get_xdata()[0] == line.get_xdata()[1]]
    assert sorted(tuple(b.get_ydata()) for b in bars) == [(1.9, 2.1), (3.0, 9.0)]
    diagonal = max(ax.lines, key=lambda line: len(line.get_xdata()))
    np.testing.assert_allclose(diagonal.get_xdata(), diagonal.get_ydata())
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_ylim()[1] >= 9.0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["one", "two"] and "float32" in labels
    plt.close(fig)


@pytest.mark.parametrize("points, steps, match", [
    ([], STEPS, "empty"),
    ([point(step="three")], STEPS, "not in steps"),
    ([point(dtype="float16")], STEPS, "dtype must be"),
])
def test_step_ratios_refuses_what_it_cannot_draw(points, steps, match):
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=match):
        draw_step_ratios(ax, points, steps=steps)
    plt.close(fig)


def test_program_tile_outlines_every_tile_and_fills_the_selected_one():
    owner = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3]])
    rows = torch.zeros(4, 2, dtype=torch.bool)
    rows[2:] = True
    fig, (ax_x, ax_t) = plt.subplots(2, 1)
    draw_program_tile(ax_x, ax_t, owner, 1, rows, 2, title="t",
                      labels=["a", "b", "c", "d"])
    assert [t.get_text() for t in ax_x.texts] == ["a", "b", "c", "d"]
    outlines = {(p.get_x(), p.get_y(), p.get_width(), p.get_height(), p.get_linewidth())
                for p in ax_x.patches}
    assert (1.5, -0.5, 2, 2, 2.5) in outlines  # program 1: columns 2-3, rows 0-1, thick
    assert len(outlines) == 4
    mine = ax_x.images[1].get_array()
    assert (~mine.mask).sum() == 4  # the selected program's 4 cells
    np.testing.assert_array_equal(ax_t.images[0].get_array(), rows.T.numpy().astype(int))
    assert [t.get_text() for t in ax_x.get_yticklabels()] == ["q0", "q1", "k0"]
    plt.close(fig)


def test_program_tile_refuses_mismatched_shapes_and_an_absent_program():
    fig, (ax_x, ax_t) = plt.subplots(2, 1)
    owner = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="table_rows"):
        draw_program_tile(ax_x, ax_t, owner, 0, torch.zeros(3, 2, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="owns no row"):
        draw_program_tile(ax_x, ax_t, owner, 5, torch.zeros(4, 2, dtype=torch.bool), 1)
    plt.close(fig)


def test_ratio_table_formats_and_escapes():
    html = ratio_table_html(["a", "b<"], [["x&y", 1.234], [None, 2]], caption="c")
    assert html.startswith("<table><caption>c</caption>")
    assert "<th>b&lt;</th>" in html and "<td>x&amp;y</td><td>1.23</td>" in html
    assert "<td></td><td>2</td>" in html
    with pytest.raises(ValueError, match="2 cells"):
        ratio_table_html(["a", "b"], [["only one"]])


def test_machine_draws_one_square_per_sm_and_names_its_numbers():
    fig, ax = plt.subplots()
    draw_machine(ax, hbm_gb=141, hbm_tbps=4.8, l2_mb=50, sms=132)
    squares = [p for p in ax.patches if p.get_gid() == "sm"]
    assert len(squares) == 132
    assert len({(p.get_x(), p.get_y()) for p in squares}) == 132  # none drawn twice
    text = " ".join(t.get_text() for t in ax.texts)
    for part in ("141 GB", "4.8 TB/s", "50 MB", "132 SMs"):
        assert part in text
    plt.close(fig)


@pytest.mark.parametrize("kwargs, match", [
    ({"sms": 0}, "sms must be positive"),
    ({"sms": 2.5}, "sms must be a whole number"),
    ({"l2_mb": -1}, "l2_mb must be positive"),
])
def test_machine_refuses_what_is_not_a_machine(kwargs, match):
    fig, ax = plt.subplots()
    args = {"hbm_gb": 141, "hbm_tbps": 4.8, "l2_mb": 50, "sms": 132} | kwargs
    with pytest.raises(ValueError, match=match):
        draw_machine(ax, **args)
    plt.close(fig)


def test_launch_grid_draws_a_box_per_program_and_the_selected_tiles():
    fig, (ax_grid, ax_tile) = plt.subplots(1, 2)
    draw_launch_grid(ax_grid, ax_tile, seq=40, block_s=16, heads=3, head_dim=8,
                     selected=(1, 2))
    boxes = [p for p in ax_grid.patches if p.get_gid() == "program"]
    assert len(boxes) == 3 * 3  # ceil(40 / 16) blocks x 3 heads
    red = [b for b in boxes if b.get_facecolor()[:3] != boxes[0].get_facecolor()[:3]]
    assert [(b.get_x(), b.get_y(), b.get_width()) for b in red] == [(16, 2, 16)]
    masked = [p for p in ax_grid.patches if p.get_gid() == "masked"]
    assert [(m.get_x(), m.get_width()) for m in masked] == [(40, 8)]  # lanes 40-47
    assert "(1, 2)" in [t.get_text() for t in ax_grid.texts]
    tiles = [p for p in ax_tile.patches if p.get_gid() == "tile"]
    assert [(p.get_width(), p.get_height()) for p in tiles] == [(4, 16)] * 4
    assert [t.get_text() for t in ax_tile.texts] == ["a", "b", "cos", "sin"]
    assert [t.get_text() for t in ax_tile.get_yticklabels()] == ["16", "31"]
    plt.close(fig)


def test_launch_grid_without_a_partial_block_hatches_nothing():
    fig, (ax_grid, ax_tile) = plt.subplots(1, 2)
    draw_launch_grid(ax_grid, ax_tile, seq=32, block_s=16, heads=1, head_dim=4,
                     selected=(0, 0))
    assert not [p for p in ax_grid.patches if p.get_gid() == "masked"]
    plt.close(fig)


@pytest.mark.parametrize("kwargs, match", [
    ({"seq": 0}, "seq must be a positive int"),
    ({"block_s": 2.0}, "block_s must be a positive int"),
    ({"head_dim": 7}, "head_dim must be even"),
    ({"selected": (3, 0)}, "selected must be a program"),
    ({"selected": (0, 3)}, "selected must be a program"),
])
def test_launch_grid_refuses_bad_arguments(kwargs, match):
    args = {"seq": 40, "block_s": 16, "heads": 3, "head_dim": 8, "selected": (0, 0)}
    fig, (ax_grid, ax_tile) = plt.subplots(1, 2)
    with pytest.raises(ValueError, match=match):
        draw_launch_grid(ax_grid, ax_tile, **{**args, **kwargs})
    plt.close(fig)
