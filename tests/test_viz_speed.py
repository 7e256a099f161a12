"""ropelib.viz.speed: byte counting, the speed bars, the roofline and the table."""

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from ropelib.viz.speed import (  # noqa: E402
    draw_roofline,
    draw_speed_bars,
    memory_traffic,
    speed_table_html,
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


def test_speed_table_has_one_row_per_entry_with_ratios():
    table = speed_table_html({"fp32": {"clone": 2e-3, "copy_": 1e-3, "ropelib": 3e-3}},
                             {"fp32": 4_000_000}, traffic={"fp32": {"ropelib": 2.5}})
    assert table.count("<tr>") + table.count("<tr style") == 5  # header, section, 3 entries
    assert "<td>ropelib</td><td>2.50</td><td>3,000</td><td>1.50</td><td>3.00</td><td>1.3</td>" in table
    with pytest.raises(ValueError, match="has no entry 'clone'"):
        speed_table_html({"fp32": {"copy_": 1e-3}}, {"fp32": 8})
