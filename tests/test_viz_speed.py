"""ropelib.viz.speed: byte counting, the speed bars, the roofline and the table."""

import re

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from ropelib.viz.speed import (  # noqa: E402
    Traffic,
    draw_clock_quantiles,
    draw_roofline,
    draw_speed_bars,
    memory_traffic,
    speed_table_html,
    traffic_in_copies,
)


def test_clone_reads_and_writes_the_tensor_once():
    x = torch.randn(4, 8)
    traffic = memory_traffic(x.clone)
    assert traffic.names == ["aten::clone"]
    assert traffic.read == traffic.written == 4 * 8 * 4


def test_broadcast_operand_counts_once_and_views_move_nothing():
    x, row = torch.randn(4, 8), torch.randn(8)
    traffic = memory_traffic(lambda: x.view(-1)[:5].unsqueeze(0))
    assert traffic.ops == []
    traffic = memory_traffic(lambda: x * row)
    assert (traffic.read, traffic.written) == ((32 + 8) * 4, 32 * 4)


def test_copy_into_a_buffer_reads_only_its_source_and_empty_moves_nothing():
    x = torch.randn(16, dtype=torch.float64)
    buffer = torch.empty_like(x)
    traffic = memory_traffic(lambda: buffer.copy_(x))
    assert (traffic.read, traffic.written) == (16 * 8, 16 * 8)
    assert memory_traffic(lambda: torch.empty_like(x)).total == 0


def test_memory_traffic_rejects_a_non_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        memory_traffic(3)


def test_speed_bars_are_ratios_to_the_baseline():
    fig, ax = plt.subplots()
    ratios = draw_speed_bars(ax, {"clone": 2.0, "copy_": 1.0, "ropelib": 1.5, "peer": 6.0})
    assert ratios == {"clone": 2.0, "copy_": 1.0, "ropelib": 1.5, "peer": 6.0}
    assert [round(p.get_width(), 6) for p in ax.patches] == [2.0, 1.0, 1.5, 6.0]
    with pytest.raises(ValueError, match="has no entry 'copy_'"):
        draw_speed_bars(ax, {"clone": 1.0})
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        draw_speed_bars(ax, {"copy_": 1.0, "x": -1.0})
    plt.close(fig)


def test_roofline_balance_and_roofs():
    fig, ax = plt.subplots()
    balance = draw_roofline(ax, peak_flops=100e9, bandwidth=10e9, points={"rope": (0.25, 2e9)})
    assert balance == pytest.approx(10.0)
    intensity, gflops = ax.lines[0].get_data()
    assert gflops.max() == pytest.approx(100.0)
    assert gflops[0] == pytest.approx(intensity[0] * 10.0)
    with pytest.raises(ValueError, match="peak_flops and bandwidth must be > 0"):
        draw_roofline(ax, 0.0, 1.0, {})
    plt.close(fig)


def test_roofline_draws_a_point_on_top_of_another_smaller():
    """Two formulations at the same intensity and rate (ropelib's loop in both layouts) must
    both stay visible: the second marker is drawn inside the first, not hidden under it."""
    fig, ax = plt.subplots()
    draw_roofline(ax, 100e9, 10e9, {"half": (0.35, 2.0e9), "interleaved": (0.36, 2.1e9),
                                    "elsewhere": (0.07, 0.4e9)})
    marks = {line.get_label(): line for line in ax.lines if line.get_label() in
             ("half", "interleaved", "elsewhere")}
    first, second = marks["half"].get_markersize(), marks["interleaved"].get_markersize()
    assert second < 0.7 * first
    assert marks["elsewhere"].get_markersize() == first      # apart: full size
    assert marks["half"].get_marker() != marks["interleaved"].get_marker()
    plt.close(fig)


def test_speed_table_has_one_row_per_entry_with_ratios():
    table = speed_table_html({"fp32": {"clone": 2e-3, "copy_": 1e-3, "ropelib": 3e-3}},
                             {"fp32": 4_000_000}, traffic={"fp32": {"ropelib": 2.5}})
    assert table.count("<tr>") + table.count("<tr style") == 5  # header, section, 3 entries
    assert "<td>ropelib</td><td>2.50</td><td>3,000</td><td>1.50</td><td>3.00</td><td>1.3</td>" in table
    with pytest.raises(ValueError, match="has no entry 'clone'"):
        speed_table_html({"fp32": {"copy_": 1e-3}}, {"fp32": 8})


# ---- more cases: operator kinds, colours and labels, exact roofs, table cells ----------------

def agg_axes():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


# ---- memory_traffic -------------------------------------------------------------------------

def test_views_and_allocations_move_nothing():
    x = torch.randn(8, 16)
    traffic = memory_traffic(lambda: (x[:, ::2], x.view(16, 8), x.t(), torch.empty_like(x),
                                      torch.view_as_complex(x.view(8, 8, 2))))
    assert traffic.ops == []
    assert traffic.total == 0


def test_functional_in_place_and_out_variants():
    x, y = torch.randn(10, 6), torch.randn(6)           # y broadcasts: counted once
    out = torch.empty(10, 6)
    e = 4
    assert memory_traffic(lambda: x * y).total == e * (60 + 6 + 60)
    assert memory_traffic(lambda: torch.mul(x, y, out=out)).total == e * (60 + 6 + 60)
    z = x.clone()
    traffic = memory_traffic(lambda: z.mul_(y))           # reads z and y, writes z
    assert (traffic.read, traffic.written) == (e * 66, e * 60)
    traffic = memory_traffic(lambda: z.addcmul_(x, y, value=-1))
    assert (traffic.read, traffic.written) == (e * (60 + 60 + 6), e * 60)
    assert memory_traffic(lambda: z.fill_(1.0)).read == 0
    assert memory_traffic(lambda: z.zero_()).read == 0


def test_dtype_conversions_and_lists_of_tensors():
    x = torch.randn(32, dtype=torch.bfloat16)
    assert memory_traffic(lambda: x.float()).total == 32 * 2 + 32 * 4
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    traffic = memory_traffic(lambda: torch.cat((a, b), -1))
    assert (traffic.read, traffic.written) == (96, 96)
    assert traffic.names == ["aten::cat"]


def test_the_rotate_half_formula_counts_five_copies_plus_tables():
    from ropelib.book import bench
    x = torch.randn(2, 3, 16, 8)
    c, s = torch.randn(16, 8), torch.randn(16, 8)
    traffic = memory_traffic(lambda: bench.hf_rotate_half(x, c, s))
    n = x.numel()
    assert traffic.names == ["aten::neg", "aten::cat", "aten::mul.Tensor", "aten::mul.Tensor",
                             "aten::add.Tensor"]
    assert traffic.total == 4 * (10 * n + 2 * c.numel())


def test_memory_traffic_runs_the_function_once():
    calls = []
    memory_traffic(lambda: calls.append(1))
    assert calls == [1]


def test_traffic_sums():
    t = Traffic([("a", 1, 2), ("b", 3, 4)])
    assert (t.read, t.written, t.total, t.names) == (4, 6, 10, ["a", "b"])


# ---- draw_speed_bars ------------------------------------------------------------------------

MEDIANS = {"clone": 2e-3, "copy_": 1e-3, "ropelib": 3e-3, "peer": 12e-3}


def test_speed_bars_draw_ratios_in_order_with_colours_and_labels():
    fig, ax = agg_axes()
    ratios = draw_speed_bars(ax, MEDIANS, title="float32, half")
    assert ratios == pytest.approx({"clone": 2.0, "copy_": 1.0, "ropelib": 3.0, "peer": 12.0})
    bars = ax.patches
    assert [b.get_width() for b in bars] == pytest.approx([2.0, 1.0, 3.0, 12.0])
    colours = [tuple(np.round(b.get_facecolor()[:3], 3)) for b in bars]
    assert colours[0] == colours[1]                      # baselines alike (grey)
    assert len({colours[0], colours[2], colours[3]}) == 3  # baseline, ropelib, peer differ
    assert [t.get_text() for t in ax.get_yticklabels()] == list(MEDIANS)
    assert [t.get_text() for t in ax.texts] == ["2.0", "1.0", "3.0", "12.0"]
    assert ax.get_xscale() == "log"
    assert ax.get_title() == "float32, half"
    assert ax.get_xlabel() == "time / time of copy_"
    assert ax.get_xlim()[1] >= 2.5 * 12.0
    assert any(line.get_xdata()[0] == 1.0 for line in ax.get_lines())   # the ratio-1 line
    fig.canvas.draw()


@pytest.mark.parametrize("smallest", [0.5, 1e-2, 1e-4])
def test_speed_bars_labels_stay_inside_their_axes(smallest):
    """A label past the axes would widen the saved figure (its text then shrinks on the
    page): the axis leaves room for the longest bar's label whatever the values span."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6.4, 2.4))
    for ax in axes:
        draw_speed_bars(ax, {"whole": 1.0, "mlp": 0.6, "rope": smallest}, baseline="whole",
                        value_format=".1%")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        right = ax.get_window_extent(renderer).x1
        assert all(t.get_window_extent(renderer).x1 <= right for t in ax.texts)
    plt.close(fig)


def test_speed_bars_label_format():
    _, ax = agg_axes()
    draw_speed_bars(ax, MEDIANS, baseline="peer", value_format=".1%")
    assert [t.get_text() for t in ax.texts] == ["16.7%", "8.3%", "25.0%", "100.0%"]


def test_speed_bars_other_baseline_fixed_xmax_and_no_annotations():
    _, ax = agg_axes()
    ratios = draw_speed_bars(ax, MEDIANS, baseline="clone", xmax=100.0, annotate=False)
    assert ratios["clone"] == 1.0 and ratios["copy_"] == 0.5
    assert ax.get_xlim() == pytest.approx((0.4, 100.0))
    assert len(ax.texts) == 0


@pytest.mark.parametrize("medians, match", [
    ({}, "at least one"),
    ({"clone": 1.0}, "no entry 'copy_'"),
    ({"copy_": 1.0, "x": 0.0}, "positive"),
    ({"copy_": 1.0, "x": float("nan")}, "positive"),
])
def test_speed_bars_reject_bad_medians(medians, match):
    _, ax = agg_axes()
    with pytest.raises(ValueError, match=match):
        draw_speed_bars(ax, medians)


# ---- draw_roofline --------------------------------------------------------------------------

def test_roofline_is_the_minimum_of_the_two_roofs():
    fig, ax = agg_axes()
    peak, bandwidth = 100e9, 10e9
    balance = draw_roofline(ax, peak, bandwidth, {"rope": (0.375, 2e9), "matmul": (80.0, peak)})
    assert balance == pytest.approx(10.0)
    roof = ax.get_lines()[0]
    x, y = roof.get_xdata(), roof.get_ydata()
    np.testing.assert_allclose(y, np.minimum(100.0, x * 10.0))          # GFLOP/s
    assert x[0] == pytest.approx(1 / 16) and x[-1] == pytest.approx(256)
    points = {line.get_label(): (line.get_xdata()[0], line.get_ydata()[0])
              for line in ax.get_lines()[2:]}
    assert points == {"rope": (0.375, 2.0), "matmul": (80.0, 100.0)}
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "roofline: 10 GB/s, 100 GFLOP/s"
    assert "10.0 flop/byte" in ax.texts[0].get_text()
    fig.canvas.draw()


def test_roofline_draws_more_memory_roofs_under_the_same_compute_roof():
    fig, ax = agg_axes()
    balance = draw_roofline(ax, 100e9, 10e9, {"rope": (0.375, 2e9)}, label="memory",
                            more_roofs={"cache": 50e9})
    assert balance == pytest.approx(10.0)                # the balance of the first roof
    lines = ax.get_lines()
    x, y = lines[2].get_xdata(), lines[2].get_ydata()
    np.testing.assert_allclose(y, np.minimum(100.0, x * 50.0))
    assert lines[2].get_linestyle() == "--"
    assert (lines[3].get_label(), lines[3].get_xdata()[0]) == ("rope", 0.375)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["memory: 10 GB/s, 100 GFLOP/s", "cache: 50 GB/s"]
    with pytest.raises(ValueError, match="more_roofs\\['cache'\\] must be a bandwidth > 0"):
        draw_roofline(ax, 100e9, 10e9, {}, more_roofs={"cache": 0.0})
    fig.canvas.draw()


def test_roofline_points_stay_visible_when_they_overlap():
    """Points at the same place are hollow, each in its own colour and shape, so the one
    drawn first still shows as a ring around the one drawn over it."""
    fig, ax = agg_axes()
    draw_roofline(ax, 100e9, 10e9, {f"p{i}": (0.375, 2e9) for i in range(7)})
    points = ax.get_lines()[2:]
    assert len(points) == 7
    assert all(line.get_markerfacecolor() == "none" for line in points)
    colours = {to_hex(line.get_markeredgecolor()) for line in points}
    assert len(colours) == 7
    assert len({line.get_marker() for line in points}) == 7
    fig.canvas.draw()


@pytest.mark.parametrize("args, kwargs, match", [
    ((0.0, 1.0, {}), {}, "must be > 0"),
    ((1.0, 1.0, {"a": (0.0, 1.0)}), {}, "intensity > 0"),
    ((1.0, 1.0, {}), {"intensity_range": (2.0, 1.0)}, "intensity_range"),
])
def test_roofline_rejects_bad_inputs(args, kwargs, match):
    _, ax = agg_axes()
    with pytest.raises(ValueError, match=match):
        draw_roofline(ax, *args, **kwargs)


# ---- speed_table_html -----------------------------------------------------------------------

def cells(row_html):
    return re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row_html)


def test_table_rows_ratios_bandwidth_and_traffic():
    sections = {"float32, half": MEDIANS, "no copy <b>": {"clone": 1e-3, "x": 4e-3}}
    nbytes = {"float32, half": 2_000_000, "no copy <b>": 1_000_000}
    html = speed_table_html(sections, nbytes, traffic={"float32, half": {"ropelib": 2.5}})
    assert html.startswith("<style>") and html.endswith("</table>")
    assert html.count("<table") == 1
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html)
    assert cells(rows[0]) == ["formulation", "traffic / copy", "median (µs)", "/ clone",
                              "/ copy_", "GB/s"]
    assert cells(rows[1]) == ["float32, half"]
    assert cells(rows[4]) == ["ropelib", "2.50", "3,000", "1.50", "3.00", "0.7"]
    assert cells(rows[2]) == ["clone", "", "2,000", "1.00", "2.00", "1.0"]
    assert 'font-weight:bold' in rows[4] and 'font-weight:bold' not in rows[5]
    assert cells(rows[6]) == ["no copy &lt;b&gt;"]                    # escaped
    assert cells(rows[8]) == ["x", "", "4,000", "4.00", "", "0.2"]    # no copy_: blank ratio
    assert len(rows) == 1 + 1 + 4 + 1 + 2


@pytest.mark.parametrize("sections, nbytes, match", [
    ({}, {}, "at least one section"),
    ({"a": {"copy_": 1.0}}, {"a": 1}, "no entry 'clone'"),
    ({"a": {"clone": 1.0}}, {}, "nbytes"),
    ({"a": {"clone": -1.0}}, {"a": 1}, "positive"),
])
def test_table_rejects_bad_inputs(sections, nbytes, match):
    with pytest.raises(ValueError, match=match):
        speed_table_html(sections, nbytes)


def test_table_leaves_out_columns_blank_in_every_row():
    html = speed_table_html({"fwd+bwd": {"clone": 2e-3, "ropelib": 3e-3}}, {"fwd+bwd": 2_000_000})
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html)
    assert cells(rows[0]) == ["formulation", "median (µs)", "/ clone", "GB/s"]
    assert 'colspan="4"' in rows[1]
    assert cells(rows[3]) == ["ropelib", "3,000", "1.50", "0.7"]


def test_table_marks_modelled_traffic_with_a_star():
    html = speed_table_html({"f": MEDIANS}, {"f": 2_000_000},
                            traffic={"f": {"ropelib": 1.03, "peer": 5.06}},
                            modelled=("ropelib", "clone"))
    rows = {cells(row)[0]: cells(row) for row in re.findall(r"<tr[^>]*>.*?</tr>", html)}
    assert rows["ropelib"][1] == "1.03*"   # a model: starred
    assert rows["peer"][1] == "5.06"       # a count: plain
    assert rows["clone"][1] == ""          # no traffic given: nothing to star


@torch.library.custom_op("ropelib_test::scale_then_add", mutates_args=())
def _scale_then_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2.0 + y


def test_memory_traffic_opens_custom_operators():
    """A torch.library operator is counted by the ATen operators its implementation runs."""
    x, y = torch.zeros(1000), torch.zeros(1000)
    counted = memory_traffic(lambda: _scale_then_add(x, y))
    assert counted.names == ["aten::mul.Tensor", "aten::add.Tensor"]
    assert counted.read == 4 * (1000 + 2000) and counted.written == 4 * 2000


def test_memory_traffic_counts_nothing_for_an_input_handed_back():
    x = torch.zeros(1000)
    assert memory_traffic(lambda: x.to(torch.float32)).ops == []    # x itself comes back
    assert memory_traffic(lambda: x.to(torch.float64)).total == 4 * 1000 + 8 * 1000
    assert memory_traffic(lambda: x.mul_(2.0)).total == 2 * 4 * 1000  # in place: counted


def test_traffic_in_copies_counts_or_takes_the_model():
    x = torch.randn(4, 8)
    buffer = torch.empty_like(x)
    copy = 2 * x.numel() * 4
    got = traffic_in_copies({"clone": x.clone, "twice": lambda: (x * 2) + 1,
                             "modelled": lambda: buffer.copy_(x)}, copy,
                            modelled={"modelled": 3 * copy})
    assert got == {"clone": 1.0, "twice": 2.0, "modelled": 3.0}
    with pytest.raises(ValueError, match=r"modelled names cases that do not exist: \['y'\]"):
        traffic_in_copies({"clone": x.clone}, copy, modelled={"y": 1})
    with pytest.raises(ValueError, match="copy_bytes must be a positive int, got 0"):
        traffic_in_copies({"clone": x.clone}, 0)


def test_clock_quantiles_draw_both_clocks_sorted_and_return_medians():
    fig, ax = plt.subplots()
    wall, cpu = [3e-3, 1e-3, 2e-3], [1e-3, 0.5e-3, 0.9e-3]
    medians = draw_clock_quantiles(ax, {"copy_": (wall, cpu)})
    assert medians == {"copy_": (2e-3, 0.9e-3)}
    solid, dashed = ax.lines
    np.testing.assert_allclose(solid.get_ydata(), [500, 900, 1000])     # sorted, in us
    np.testing.assert_allclose(dashed.get_ydata(), [1000, 2000, 3000])
    np.testing.assert_allclose(solid.get_xdata(), [1 / 3, 2 / 3, 1])
    assert dashed.get_linestyle() == "--" and solid.get_color() == dashed.get_color()
    with pytest.raises(ValueError, match="must be finite and > 0"):
        draw_clock_quantiles(ax, {"x": ([1.0], [0.0])})
    with pytest.raises(ValueError, match="one non-zero length"):
        draw_clock_quantiles(ax, {"x": ([1.0, 2.0], [1.0])})
    plt.close(fig)
