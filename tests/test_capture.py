"""ropelib.book.capture.host_reads finds the reads that stop a CUDA graph capture."""

from __future__ import annotations

import pytest
import torch

from ropelib.book.capture import host_reads


def test_host_reads_lists_value_reads_and_value_dependent_shapes():
    p = torch.tensor([3, 5, 7])
    x = torch.zeros(3)
    assert host_reads(lambda: int(p.max())) == ["aten::_local_scalar_dense"]
    assert host_reads(lambda: p.sum().item()) == ["aten::_local_scalar_dense"]
    assert host_reads(lambda: bool((p > 4).any())) == ["aten::_local_scalar_dense"]
    assert host_reads(lambda: p.nonzero()) == ["aten::nonzero"]
    assert host_reads(lambda: p[p > 4]) == ["aten::index.Tensor (boolean mask)"]
    assert host_reads(lambda: x.__setitem__(p > 4, 1.0)) == ["aten::index_put_ (boolean mask)"]
    assert host_reads(lambda: p.unique()) == ["aten::_unique2"]


def test_device_side_work_reads_nothing():
    p = torch.tensor([3, 5, 7])
    table = torch.randn(8, 4)
    assert host_reads(lambda: table[p]) == []
    assert host_reads(lambda: torch._assert_async((p < 8).all())) == []
    assert host_reads(lambda: torch.where(p > 4, p, 0)) == []
    assert host_reads(lambda: p.masked_fill(p > 4, 0)) == []


def test_host_reads_wants_a_callable():
    with pytest.raises(TypeError, match="callable"):
        host_reads(3)
