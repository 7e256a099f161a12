"""Measuring RoPE's speed: the formulations found in other codebases and an interleaved timer.

RoPE is memory-bound: it reads x and writes a tensor of the same size, exactly what a copy
does, so every time here is reported as a ratio to a copy measured in the same run
(``clone``, which allocates its output, and ``copy_`` into a buffer that already exists;
with the compiled kernel also ``clone, huge pages``, a copy into an output allocated the way
ropelib allocates its own, see ``ropelib.native``).
Candidates are timed round-robin (one sample of each in turn, repeated), so a burst of load
on the machine hits all of them alike, and the median is reported. Every sample starts with
an untimed call of its candidate, as in a training loop, which runs the same step again and
again: a sample then measures the candidate after itself, not after the allocations of the
candidate before it (which decide, for large tensors, whether its output is recycled memory
or fresh pages that fault on first touch).

The peers are written out here from their published form, each with the tables it uses:

- ``hf_rotate_half`` (Hugging Face Llama, GPT-NeoX; half layout):
  ``x * cos + rotate_half(x) * sin`` with full-width cos/sin.
- ``half_split_cat`` (half layout): ``cat([a cos - b sin, b cos + a sin])``.
- ``meta_complex`` (Meta's Llama; interleaved): complex multiply in float32, cast back.
- ``roformer_stack`` (RoFormer; interleaved): ``x * cos + stack(-x_odd, x_even) * sin``
  with cos/sin repeated per pair.
- ``hf_mrope`` (Hugging Face Qwen2-VL's M-RoPE; half layout): float32 angles per axis,
  cos/sin, the chunks of each axis recomposed into one table, then ``hf_rotate_half``.

For chapter 11 and its appendix: ``without_native`` runs a function with ropelib's compiled
loop switched off (its eager fallback), ``eager_candidates`` gives ropelib's three paths that
way, ``fused_loop_bytes`` is the traffic of the compiled loop's model (x read once, the result
written once, the float32 tables read once), and ``stored_tables`` reads the tables of a
stored result file of ``benchmarks/``.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .. import native
from ..multiaxis import axis_frequencies
from ..rotation import apply_rope
from ..tables import RotaryEmbedding, generate_rope_embeddings

PEERS = {"half": ("hf_rotate_half", "half_split_cat"),
         "interleaved": ("meta_complex", "roformer_stack")}


def hf_rotate_half(x: torch.Tensor, cos_wide: torch.Tensor, sin_wide: torch.Tensor) -> torch.Tensor:
    """Hugging Face's formula; cos_wide = cat(cos, cos), shape (seq, d)."""
    h = x.shape[-1] // 2
    rotated = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos_wide + rotated * sin_wide


def half_split_cat(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The half layout written per pair and concatenated; cos, sin (seq, d/2)."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def meta_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Meta's formula: float32 complex multiply by freqs_cis (seq, d/2), cast back."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2).type_as(x)


def roformer_stack(x: torch.Tensor, cos_pairs: torch.Tensor, sin_pairs: torch.Tensor
                   ) -> torch.Tensor:
    """RoFormer's formula; cos_pairs = cos repeated per pair, shape (seq, d)."""
    rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).reshape(x.shape)
    return x * cos_pairs + rotated * sin_pairs


def hf_mrope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
             sections: list[int]) -> torch.Tensor:
    """Hugging Face Qwen2-VL's rotary forward and ``apply_rotary_pos_emb`` on x
    ``(B, H, seq, d)``: positions ``(seq, 3)``, float32 inv_freq ``(d/2,)``, ``mrope_section``."""
    freqs = positions.T[:, None, :, None].float() * inv_freq.float()  # (3, 1, seq, d/2)

    def recompose(table: torch.Tensor) -> torch.Tensor:
        chunks = table.split(sections, dim=-1)
        table = torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)
        return torch.cat((table, table), dim=-1).to(x.dtype)[:, None]  # (1, 1, seq, d)

    return hf_rotate_half(x, recompose(freqs.cos()), recompose(freqs.sin()))


def mrope_candidates(x: torch.Tensor, positions: torch.Tensor, sections: list[int],
                     base: float = 1e6) -> dict[str, Callable[[], object]]:
    """M-RoPE on x ``(B, H, seq, d)`` at positions ``(seq, 3)``: copy baselines; ropelib as
    ``StandardAttentionWithRoPE`` calls it (the cached tables and ``apply_rope(...,
    axes=)``, which gathers each token's rows, then rotates), ropelib in two steps (the rows
    gathered by ``RotaryEmbedding(positions=)``, then the 1D rotation) and the rotation
    alone on rows made beforehand; Hugging Face's recomposition + rotate_half."""
    head_dim = x.shape[-1]
    rotary = RotaryEmbedding(head_dim, frequencies=axis_frequencies(head_dim, sections,
                                                                    base=base))
    rotary.tables(int(positions.max()) + 1)  # the cache grown once, as a model's would be
    cos, sin = rotary(positions=positions)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    buffer = torch.empty_like(x)

    def ropelib_mrope() -> torch.Tensor:
        c, s = rotary.tables(int(positions.max()) + 1, x.device)
        return apply_rope(x, c, s, positions=positions, axes=rotary.pair_axes, layout="half")

    def rows_first() -> torch.Tensor:
        c, s = rotary(positions=positions)
        return apply_rope(x, c[None, None], s[None, None], layout="half")

    return {"clone": x.clone, "copy_": lambda: buffer.copy_(x),
            "ropelib M-RoPE": ropelib_mrope,
            "ropelib M-RoPE, rows first": rows_first,
            "ropelib M-RoPE, rows given": lambda: apply_rope(x, cos[None, None], sin[None, None],
                                                             layout="half"),
            "hf_mrope": lambda: hf_mrope(x, positions, inv_freq, sections)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_round_robin(candidates: dict[str, Callable[[], object]], device: torch.device,
                     repeats: int = 15, warmup: int = 2, min_sample_s: float = 2e-3
                     ) -> dict[str, float]:
    """Median seconds per call of each candidate, timed in turn ``repeats`` times.

    A sample is one untimed call, then ``number`` consecutive timed calls, ``number`` chosen
    per candidate (after the warm-up) so that a sample lasts at least ``min_sample_s``: tiny
    calls are not drowned in the timer's own overhead.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    numbers = {}
    for name, fn in candidates.items():
        for _ in range(warmup):
            fn()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        numbers[name] = max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            fn()
            _sync(device)
            start = time.perf_counter()
            for _ in range(numbers[name]):
                fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) / numbers[name])
    return {name: statistics.median(ts) for name, ts in times.items()}


def _peers(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
           ) -> dict[str, tuple[Callable[..., torch.Tensor], tuple]]:
    """The layout's peer formulations with the tables each one uses: name -> (fn, args)."""
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if layout == "half":
        cw, sw = torch.cat((c, c), -1), torch.cat((s, s), -1)
        return {"hf_rotate_half": (hf_rotate_half, (x, cw, sw)),
                "half_split_cat": (half_split_cat, (x, c, s))}
    return {"meta_complex": (meta_complex, (x, torch.complex(cos, sin))),
            "roformer_stack": (roformer_stack, (x, c.repeat_interleave(2, -1),
                                                s.repeat_interleave(2, -1)))}


def _call(fn: Callable[..., torch.Tensor], args: tuple) -> Callable[[], torch.Tensor]:
    return lambda: fn(*args)


def forward_candidates(x: torch.Tensor, layout: str) -> dict[str, Callable[[], object]]:
    """Copy baselines, ropelib's paths and the layout's peers, as closures over x ``(B, H, S, d)``."""
    cos, sin = generate_rope_embeddings(x.shape[-2], x.shape[-1], device=x.device)
    buffer, scratch = torch.empty_like(x), x.clone()
    cases: dict[str, Callable[[], object]] = {
        "clone": x.clone,
        "copy_": lambda: buffer.copy_(x),
    }
    if native.supports(x, None):  # the allocation ropelib's fresh outputs get: huge pages
        cases["clone, huge pages"] = lambda: native.empty_like(x).copy_(x)
    cases |= {
        "ropelib": lambda: apply_rope(x, cos, sin, layout=layout),
        "ropelib out=": lambda: apply_rope(x, cos, sin, layout=layout, out=buffer),
        "ropelib in place": lambda: apply_rope(scratch, cos, sin, layout=layout, out=scratch),
    }
    cases.update({name: _call(fn, args) for name, (fn, args) in _peers(x, cos, sin, layout).items()})
    return cases


class AutogradFloor(torch.autograd.Function):
    """A Python autograd node that computes nothing: its forward allocates the output and its
    backward allocates the gradient. Its forward+backward time is the fixed cost any such
    node (ropelib's rotation included) pays, and it weighs most at small shapes."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad)


def _grad_forwards(x: torch.Tensor, layout: str
                   ) -> tuple[torch.Tensor, dict[str, Callable[[], torch.Tensor]]]:
    """A copy of x that requires grad, and the forwards of clone, the autograd floor, ropelib
    and the layout's peers on it."""
    cos, sin = generate_rope_embeddings(x.shape[-2], x.shape[-1], device=x.device)
    xg = x.detach().clone().requires_grad_(True)
    forward = {"clone": xg.clone, "autograd floor": lambda: AutogradFloor.apply(xg),
               "ropelib": lambda: apply_rope(xg, cos, sin, layout=layout)}
    forward.update({name: _call(fn, args) for name, (fn, args) in _peers(xg, cos, sin, layout).items()})
    return xg, forward


def training_forward_candidates(x: torch.Tensor, layout: str) -> dict[str, Callable[[], object]]:
    """The forward pass alone of clone, the autograd floor, ropelib and the peers, recording
    autograd as in training (x requires grad): what ``backward_candidates`` adds a backward pass to."""
    return {f"{name} fwd": fn for name, fn in _grad_forwards(x, layout)[1].items()}


def backward_candidates(x: torch.Tensor, layout: str) -> dict[str, Callable[[], object]]:
    """Forward + backward of clone, the autograd floor, ropelib and the layout's peers."""
    xg, forward = _grad_forwards(x, layout)
    grad = torch.randn_like(x)

    def step(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            fn().backward(grad)
            xg.grad = None
        return run

    return {f"{name} fwd+bwd": step(fn) for name, fn in forward.items()}


def compiled_candidates(x: torch.Tensor, layout: str
                        ) -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """torch.compile'd peers (not Meta's: complex ops are not code-generated) and the seconds
    their first call took (compilation)."""
    cos, sin = generate_rope_embeddings(x.shape[-2], x.shape[-1], device=x.device)
    cases, compile_seconds = {}, {}
    for name, (fn, args) in _peers(x, cos, sin, layout).items():
        if name == "meta_complex":
            continue
        compiled = torch.compile(fn, dynamic=False)
        start = time.perf_counter()
        compiled(*args)
        compile_seconds[f"compiled {name}"] = time.perf_counter() - start
        cases[f"compiled {name}"] = _call(compiled, args)
    return cases, compile_seconds


def bytes_moved(x: torch.Tensor) -> int:
    """Bytes a copy of x moves: read once, written once."""
    return 2 * x.numel() * x.element_size()


ROPELIB_PATHS = ("ropelib", "ropelib out=", "ropelib in place")


def without_native(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn`` with ropelib's compiled CPU loop switched off while it runs (restored after):
    what ropelib does where the loop does not apply, its eager fallback."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        previous = native.set_enabled(False)
        try:
            return fn(*args, **kwargs)
        finally:
            native.set_enabled(previous)
    return run


def eager_candidates(x: torch.Tensor, layout: str) -> dict[str, Callable[[], object]]:
    """ropelib's three paths (``ROPELIB_PATHS``) on x ``(B, H, S, d)`` with the compiled loop
    switched off, named ``"<path> (eager)"``, with buffers of their own."""
    own = forward_candidates(x, layout)
    return {f"{path} (eager)": without_native(own[path]) for path in ROPELIB_PATHS}


def fused_loop_bytes(x: torch.Tensor) -> int:
    """The compiled loop's traffic in its model: x read once, the result written once, and
    the half-width cos and sin rows of x's positions, float32 whatever x's dtype, read once.
    A model, not a count: the loop runs outside PyTorch, where no dispatch mode sees it."""
    table_bytes = 2 * x.shape[-2] * (x.shape[-1] // 2) * 4
    return bytes_moved(x) + table_bytes


_ROW = re.compile(r"^(?P<name>\S.*?)\s{2,}(?P<median>[0-9.]+)\s+(?P<ratio>[0-9.]+)\s+[0-9]+$")


def stored_tables(path: str | Path) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """The tables of a stored result file of ``benchmarks/results`` (``bench_gpu.py``'s
    format): ``{(run, title): {formulation: (median in us, ratio to the table's baseline)}}``.

    A run starts at a line ``## Run N...`` (its name: ``"Run N"``); a table is a title line,
    a header line starting with ``formulation`` and rows ``name  median  ratio  GB/s``; a
    blank line ends it. Rows of another shape (a share, a failed capture) are skipped.
    """
    tables: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    run, title, rows = None, None, None
    previous = ""
    for line in Path(path).read_text().splitlines():
        heading = re.match(r"^## (Run \d+)", line)
        if heading:
            run, rows = heading.group(1), None
        elif line.startswith("formulation") and run is not None:
            title, rows = previous.strip(), {}
            tables[(run, title)] = rows
        elif not line.strip():
            rows = None
        elif rows is not None:
            match = _ROW.match(line.strip())
            if match:
                rows[match["name"].strip()] = (float(match["median"]), float(match["ratio"]))
        previous = line
    if not tables:
        raise ValueError(f"{path}: no table found (a '## Run N' line, a title, then a "
                         "'formulation ...' header)")
    return tables
