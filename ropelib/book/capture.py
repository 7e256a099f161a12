"""What stops a CUDA graph from holding a step (chapter 15): reads of tensor values by the host.

A CUDA graph records the kernels a piece of code launches, with their pointers and shapes, and
replays them with one launch. Code that needs a tensor's value on the host (``.item()``,
``int(t)``, ``if t:``, a shape that depends on values such as ``nonzero`` or boolean
indexing) makes the host wait for the GPU, which a capture cannot do: the capture fails, or
records one branch for good. ``host_reads`` runs a function under a PyTorch dispatch mode and
lists the operators that do such a read; on CPU tensors the same operators run, so a CPU
run finds the reads a GPU capture would trip on. Reads that bypass the dispatcher on CPU
tensors, ``.tolist()`` and ``.numpy()``, are not seen.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = {
    "aten::_local_scalar_dense": "a tensor's value read on the host (.item(), int(), float(), "
                                 "bool(), if t:)",
    "aten::nonzero": "an output whose shape depends on values (nonzero)",
    "aten::masked_select": "an output whose shape depends on values (boolean indexing)",
    "aten::unique_dim": "an output whose shape depends on values (unique)",
    "aten::_unique2": "an output whose shape depends on values (unique)",
    "aten::unique_consecutive": "an output whose shape depends on values (unique_consecutive)",
    "aten::repeat_interleave.Tensor": "an output whose shape depends on values "
                                      "(repeat_interleave by a tensor)",
}
"""ATen operators that make the host wait for a tensor's values, and why."""

BOOL_INDEXING = ("aten::index.Tensor", "aten::index_put_", "aten::index_put")
"""Indexing operators that read the host when an index is a boolean mask (``x[mask]``: the
output's shape is the mask's count of True)."""


class _Reads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name in HOST_READS:
            self.found.append(name)
        elif name in BOOL_INDEXING and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in (args[1] if len(args) > 1 else ())):
            self.found.append(f"{name} (boolean mask)")
        return func(*args, **(kwargs or {}))


def host_reads(fn: Callable[[], object]) -> list[str]:
    """The host reads ``fn()`` makes, in call order: operator names (keys of ``HOST_READS``,
    or an indexing operator of ``BOOL_INDEXING`` followed by " (boolean mask)").

    Example::

        host_reads(lambda: int(positions.max()))   # ['aten::_local_scalar_dense']
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    with _Reads() as mode:
        fn()
    return mode.found
