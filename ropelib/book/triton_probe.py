"""Looking inside a Triton kernel without a GPU (chapter 15).

- ``trace_memory``: while Triton's interpreter runs a kernel on CPU tensors, record every
  element each program loads and stores (the interpreter runs the programs one after
  another and hands every masked load and store to one builder object, whose two methods
  are wrapped here). ``MemoryTrace.bytes`` counts the traffic a kernel asks for, per
  tensor; ``MemoryTrace.touched`` says which elements of a tensor one program touched.
- ``ptx_loads``: compile a kernel for an NVIDIA GPU (compute capability 9.0: H100, H200)
  on this machine, with Triton's own compiler, and count the global-memory load and store
  instructions of its PTX by width: a scalar ``ld.global.b16`` moves 2 bytes, a vector
  ``ld.global.v4.b32`` 16 bytes.
- ``resources``: compile a kernel the same way and read the registers per thread and the
  shared memory per program that NVIDIA's assembler gave it, from the compiled binary
  (``cuobjdump -res-usage``, the tool Triton's wheel ships beside ``ptxas``).

All three lean on Triton 3.9's internals (the interpreter's builder; ``triton.compile`` of an
``ASTSource``), pinned in requirements.txt; a Triton without them raises a RuntimeError
that says so.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import triton

TARGET = ("cuda", 90, 32)
"""The GPU ``ptx_loads`` compiles for: CUDA, compute capability 9.0 (Hopper: H100, H200),
warps of 32 threads."""


@dataclass
class MemoryTrace:
    """Every masked load and store of a traced launch: ``accesses[(x, y, z)]`` lists, for
    program (x, y, z), tuples ``(kind, addresses, itemsize)`` with kind "load" or "store"
    and the byte addresses of the elements accessed (masked-off lanes left out)."""

    accesses: dict[tuple[int, int, int], list[tuple[str, np.ndarray, int]]] = field(
        default_factory=lambda: defaultdict(list))

    def programs(self) -> list[tuple[int, int, int]]:
        """The programs that accessed memory, in the order they ran."""
        return list(self.accesses)

    def bytes(self, tensor: torch.Tensor, kind: str | None = None,
              program: tuple[int, int, int] | None = None) -> int:
        """Bytes of ``tensor``'s memory accessed (``kind`` "load", "store" or None for
        both; ``program`` one program or None for all), every access counted."""
        start, end = _span(tensor)
        total = 0
        for p in ([program] if program is not None else self.accesses):
            for k, addresses, itemsize in self.accesses.get(p, []):
                if kind in (None, k):
                    total += int(((addresses >= start) & (addresses < end)).sum()) * itemsize
        return total

    def touched(self, tensor: torch.Tensor, program: tuple[int, int, int],
                kind: str | None = None) -> torch.Tensor:
        """A bool tensor shaped like ``tensor``: the elements ``program`` accessed."""
        start, end = _span(tensor)
        flat = torch.zeros(tensor.numel(), dtype=torch.bool)
        for k, addresses, itemsize in self.accesses.get(program, []):
            if kind in (None, k):
                inside = addresses[(addresses >= start) & (addresses < end)]
                flat[torch.from_numpy(((inside - start) // itemsize).astype(np.int64))] = True
        return flat.reshape(tensor.shape)

    def owners(self, tensor: torch.Tensor, kind: str = "store") -> torch.Tensor:
        """For every row of ``tensor`` (its last dim), the index in ``programs()`` of the
        program that accessed it (``kind``), or -1: ``tensor.shape[:-1]``, int64. A row
        accessed by two programs raises ValueError (the programs' tiles overlap)."""
        owner = torch.full(tensor.shape[:-1], -1, dtype=torch.int64)
        for index, program in enumerate(self.programs()):
            rows = self.touched(tensor, program, kind).any(-1)
            if (owner[rows] >= 0).any():
                raise ValueError(f"program {program} accessed rows another program accessed")
            owner[rows] = index
        return owner


@contextlib.contextmanager
def trace_memory() -> Iterator[MemoryTrace]:
    """Record the loads and stores of the kernels Triton's interpreter runs in the block.

    Example::

        with trace_memory() as trace:
            out = gpu_steps.per_head(x, cos, sin)      # x, cos, sin on the CPU
        trace.bytes(cos, "load")                       # bytes of cos the programs loaded
    """
    try:
        from triton.runtime.interpreter import _get_np_dtype, interpreter_builder
        builder_load = type(interpreter_builder).create_masked_load
        builder_store = type(interpreter_builder).create_masked_store
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"trace_memory needs Triton 3.9's interpreter internals "
                           f"(requirements.txt pins triton==3.9.0), got triton "
                           f"{triton.__version__}: {error}") from error
    trace = MemoryTrace()

    def record(kind: str, ptrs, mask) -> None:
        itemsize = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        taken = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        trace.accesses[tuple(interpreter_builder.grid_idx)].append(
            (kind, addresses[taken].astype(np.int64), itemsize))

    def load(ptrs, mask, other, cache_policy, is_volatile):
        record("load", ptrs, mask)
        return builder_load(interpreter_builder, ptrs, mask, other, cache_policy, is_volatile)

    def store(ptrs, value, mask, cache_policy):
        record("store", ptrs, mask)
        return builder_store(interpreter_builder, ptrs, value, mask, cache_policy)

    interpreter_builder.create_masked_load = load
    interpreter_builder.create_masked_store = store
    try:
        yield trace
    finally:
        del interpreter_builder.create_masked_load, interpreter_builder.create_masked_store


def ptx_loads(kernel, signature: dict[str, str], constants: dict[str, object], *,
              num_warps: int = 4) -> Counter:
    """Compile ``kernel`` (a ``triton.jit`` function) for ``TARGET`` and count the
    global-memory load and store instructions of its PTX by form, e.g.
    ``{"ld.global.v4.b32": 4, "st.global.v4.b32": 4}``.

    Args:
        kernel: a ``triton.jit`` function.
        signature: Triton's type of every runtime argument, e.g. ``{"X": "*bf16",
            "SEQ": "i32"}``; pointers are taken as aligned to 16 bytes, as Triton
            specializes a launch whose tensors are (PyTorch's are, unless a view).
        constants: the value of every ``tl.constexpr`` argument.
        num_warps: warps per program.
    """
    ptx = _compile(kernel, signature, constants, num_warps).asm["ptx"]
    return Counter(re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)+", ptx))


def resources(kernel, signature: dict[str, str], constants: dict[str, object], *,
              num_warps: int = 4) -> dict[str, int]:
    """Compile ``kernel`` for ``TARGET`` as ``ptx_loads`` does and return what the
    assembler gave it: ``{"registers": per thread, "shared": bytes of shared memory per
    program}``, read from the compiled binary with ``cuobjdump -res-usage``. The counts
    are those of this Triton's assembler; another Triton version may allocate others.
    Arguments as for ``ptx_loads``."""
    binary = _compile(kernel, signature, constants, num_warps).asm["cubin"]
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        raise RuntimeError(f"resources needs the cuobjdump that Triton's wheel ships, "
                           f"not found at {tool}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(binary)
        report = subprocess.run([str(tool), "-res-usage", str(path)], check=True,
                                capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) .*SHARED:(\d+)", report)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no REG and SHARED: {report!r}")
    return {"registers": int(found[1]), "shared": int(found[2])}


def _compile(kernel, signature: dict[str, str], constants: dict[str, object],
             num_warps: int):
    """``triton.compile`` of ``kernel`` for ``TARGET`` (see ``ptx_loads``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(kernel.arg_names)
    missing = [n for n in names if n not in signature and n not in constants]
    unknown = [n for n in (*signature, *constants) if n not in names]
    if missing or unknown:
        raise ValueError(f"signature and constants must give exactly the arguments of "
                         f"{kernel.__name__} ({', '.join(names)}); missing {missing}, "
                         f"unknown {unknown}")
    full = {n: signature.get(n, "constexpr") for n in names}
    aligned = {(names.index(n),): [["tt.divisibility", 16]]
               for n, kind in signature.items() if kind.startswith("*")}
    source = ASTSource(fn=kernel, signature=full, constexprs=dict(constants), attrs=aligned)
    return triton.compile(source, target=GPUTarget(*TARGET),
                          options={"num_warps": num_warps, "enable_fp_fusion": True})


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The byte addresses [start, end) of a contiguous tensor's elements."""
    if not tensor.is_contiguous():
        raise ValueError("the trace reads contiguous tensors (element i at data_ptr + i * size); "
                         "got a non-contiguous view")
    start = tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
    return start, start + tensor.numel() * tensor.element_size()
