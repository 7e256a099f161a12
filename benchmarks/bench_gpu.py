"""RoPE speed on a GPU: ropelib's Triton kernel against copies and the formulations of peers.

    python benchmarks/bench_gpu.py --sweep             # every table, and the kernel's tiles
    python benchmarks/bench_gpu.py --only decode,module_decode
    python benchmarks/bench_gpu.py --dry-run           # on the CPU: every table's code runs
                                                       # once at tiny shapes (no timing)
    python benchmarks/bench_gpu.py --only host         # any machine: the host's time per
                                                       # call, launches stubbed

Every time is the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between
runs) and every ratio is to a baseline timed in the same process: ``copy_`` of the same bytes
into a preallocated buffer (for q and k, copying both; for forward + backward, two copies).
Where a call's Python costs more than the L2 flush (about 66 us on an H200), do_bench's
events include that host time: the single-tensor tables therefore also time the call
replayed from a CUDA graph (device time only), and the decode tables time the wall clock
per eager call and per graph replay. Peers: Hugging Face's eager formulas (``rotate_half``,
GPT-J's stack, Qwen2-VL's M-RoPE), the same under ``torch.compile``, and flash-attn's
Triton ``apply_rotary`` and Liger's kernels when they can be imported (neither is a
dependency: ``ROPELIB_PEERS=DIR`` puts the wheels and ``flash_attn_rotary.py`` that
``benchmarks/get_peers.sh DIR`` gathers on the path).

``--dry-run`` runs the same code on the CPU, the kernel in Triton's interpreter
(``ROPELIB_BACKEND=triton``), with tiny shapes, one call per case and CUDA graphs replaced by
plain calls, so that a GPU session does not spend its time on a crash; its numbers mean
nothing and are not printed as timings.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if "--dry-run" in sys.argv:  # before Triton is imported: the peers' kernels interpreted too
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from ropelib import (  # noqa: E402
    apply_rope,
    apply_rope_qk,
    apply_rope_qk_to_cache,
    backend_status,
    kernels,
    triton_rope,
)
from ropelib.multiaxis import axis_of_pairs, mrope_positions  # noqa: E402
from ropelib.tables import generate_rope_embeddings  # noqa: E402

SHAPE = (4, 32, 4096, 128)
QK_HEADS = (32, 8)
MROPE_SHAPE = (1, 16, 4096, 128)
MROPE_SEGMENTS = [1000, (1, 64, 64), 50, (4, 32, 48), 486]
DECODE_ROWS = 64
WIDTH, TOKENS, CAPACITY = 4096, 4096, 4096
DRY = {"shape": (1, 4, 16, 16), "qk_heads": (4, 2), "mrope_shape": (1, 2, 49, 16),
       "mrope_segments": [20, (1, 4, 4), 9, (2, 2, 4), 10], "decode_rows": 3,
       "width": 64, "tokens": 16, "capacity": 16}
DEVICE = "cuda"
DRY_RUN = False


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_ms(fn) -> float:
    """do_bench's median in ms; in a dry run, one call (its time is not reported)."""
    if DRY_RUN:
        fn()
        return float("nan")
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def compile_fn(fn, **kw):
    """torch.compile (with dynamo only in a dry run: inductor's CPU build is slow)."""
    return torch.compile(fn, backend="eager" if DRY_RUN else "inductor", **kw)


def table(title: str, times: dict[str, float], baseline: str, nbytes: int) -> None:
    print(f"\n{title}")
    if DRY_RUN:
        print("  dry run, ran: " + ", ".join(times))
        return
    print(f"{'formulation':<40}{'median us':>11}{'/ ' + baseline:>14}{'GB/s':>8}")
    base = times[baseline]
    for name, ms in times.items():
        if ms != ms:  # nan: the case failed
            print(f"{name:<40}{'failed':>11}")
            continue
        print(f"{name:<40}{ms * 1e3:11.1f}{ms / base:14.2f}{nbytes / (ms * 1e-3) / 1e9:8.0f}")


def recorded_launch(step) -> Callable[[], None] | None:
    """The one launch ``step`` makes, as a function of no arguments: ``triton_rope._launch``
    (the prepared launch: Triton's compiled-kernel runner and the driver's launch) with that
    call's tensors, and none of ropelib's Python above it; None where the step makes no
    launch or several."""
    from unittest import mock

    made = []
    launch = triton_rope._launch
    with mock.patch.object(triton_rope, "_launch", lambda *args: made.append(args)):
        step()
    if len(made) != 1:
        return None
    x, prepared, tensors = made[0]
    return lambda: launch(x, prepared, tensors)


@contextlib.contextmanager
def kernel_swapped(kernel):
    """``triton_rope``'s JIT kernel replaced by ``kernel`` (its cache, ``_launchers``, with the
    compiled kernel's launchers, emptied meanwhile), then everything as it was."""
    default, launchers = triton_rope._compiled, dict(triton_rope._launchers)
    triton_rope._launchers.clear()
    triton_rope._compiled = kernel
    try:
        yield
    finally:
        triton_rope._compiled = default
        triton_rope._launchers.clear()
        triton_rope._launchers.update(launchers)


def statically_launched(step, outputs: list[torch.Tensor]) -> Callable[[], None]:
    """The one launch ``step`` makes, through Inductor's static CUDA launcher
    (``StaticallyLaunchedCudaKernel``: the compiled kernel's cubin launched from C++, none of
    Triton's Python): a candidate for ropelib's prepared launch, checked to write the
    ``outputs`` that ``step`` writes. Private APIs of torch and Triton: a failure raises."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:  # its name before torch 2.12
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
    real, made = triton_rope._compiled, []

    class Recording:
        """``triton_rope._compiled`` that keeps the compiled kernel, its grid and arguments."""

        def __getitem__(self, grid):
            def call(*args, **kwargs):
                made.append((real[grid](*args, **kwargs), grid, args))
                return made[-1][0]
            return call

    with kernel_swapped(Recording()):
        step()
    (kernel, grid, args), = made
    kernel._cubin_path = None  # the constructor reads it; the cubin is written from asm below
    static = StaticallyLaunchedCudaKernel(kernel)
    static.reload_cubin_from_raw(os.path.join(tempfile.mkdtemp(), f"{static.name}.cubin"))
    static.load_kernel(torch.cuda.current_device())
    kept = [a for i, a in enumerate(args) if i not in static.full_constexprs]
    stream = torch.cuda.current_stream().cuda_stream
    expected = [o.clone() for o in outputs]
    for o in outputs:
        o.zero_()
    static.run(*grid, stream, *kept)
    sync()
    if not all(torch.equal(o, e) for o, e in zip(outputs, expected, strict=True)):
        raise RuntimeError("its outputs differ from ropelib's launch")
    return lambda: static.run(*grid, stream, *kept)


def timed(cases: dict[str, object]) -> dict[str, float]:
    """Each case's median in ms; a case that raises prints why and reads as nan."""
    times = {}
    for name, fn in cases.items():
        try:
            fn()
            sync()
            times[name] = median_ms(fn)
        except Exception as error:  # a peer's failure is reported, not fatal
            print(f"  ({name} failed: {type(error).__name__}: {str(error)[:200]})")
            times[name] = float("nan")
    return times


def captured(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream): its replay; in a dry
    run, fn itself."""
    if DRY_RUN:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def wall_us(fn, calls: int = 200) -> float:
    """Wall time per call of ``calls`` calls in a row, then one synchronization (for small
    calls: the host's time per call, launches included)."""
    for _ in range(3 if DRY_RUN else 20):
        fn()
    sync()
    return statistics.median(sample_us(fn, calls) for _ in range(1 if DRY_RUN else 7))


def sample_us(fn, calls: int) -> float:
    """Wall time per call of ``calls`` calls of fn in a row and one synchronization (one
    call in a dry run)."""
    calls = 1 if DRY_RUN else calls
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def paired_gap_us(fn, baseline, rounds: int = 15, calls: int = 100) -> list[float]:
    """Per round, fn's wall time per call minus baseline's, the two timed in turn (``calls``
    calls each, then a synchronization), so that the host's speed that minute moves both:
    each round's difference in us, sorted. (Timed one after the other, eager steps of the
    same module differed by -260 to +125 us between runs on one H200 host.)"""
    gaps = []
    for _ in range(1 if DRY_RUN else rounds):
        per_call = []
        for f in (fn, baseline):
            f()
            sync()
            per_call.append(sample_us(f, calls))
        gaps.append(per_call[0] - per_call[1])
    return sorted(gaps)


def paired_ratios(fn, baseline, rounds: int = 7) -> list[float]:
    """Per round, fn's do_bench median over baseline's, the two timed in turn: each round's
    ratio, sorted (the host's speed that minute moves both)."""
    ratios = []
    for _ in range(1 if DRY_RUN else rounds):
        ms = [median_ms(fn), median_ms(baseline)]
        ratios.append(ms[0] / ms[1])
    return sorted(ratios)


GRAPH_CALLS = 20  # calls captured in one graph, for the cost of a call inside a graph


def wall_table(title: str, cases: dict[str, object]) -> None:
    """Eager wall time per call, the replay time of a graph of one call, and per call of a
    graph of ``GRAPH_CALLS`` calls (what a call adds to a captured step, without the
    graph's own launch)."""
    print(f"\n{title}")
    print(f"{'formulation':<40}{'eager us/call':>15}{'graph replay us':>17}"
          f"{f'us/call, {GRAPH_CALLS} in a graph':>26}")
    for name, fn in cases.items():
        try:
            eager = wall_us(fn)
        except Exception as error:
            print(f"{name:<40}  failed: {type(error).__name__}: {str(error)[:100]}")
            sync()
            continue
        shown = []
        for calls in (1, GRAPH_CALLS):
            def many(fn=fn, calls=calls):
                for _ in range(calls):
                    fn()
            try:
                shown.append(f"{median_ms(captured(many)) * 1e3 / calls:.2f}")
            except Exception as error:
                shown.append(f"capture failed: {type(error).__name__}: {str(error)[:60]}")
                sync()
        if DRY_RUN:
            print(f"{name:<40}  dry run: ran eagerly and as the graph's stand-in")
            continue
        print(f"{name:<40}{eager:15.1f}{shown[0]:>17}{shown[1]:>26}")


def hf_rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def hf_apply(x, cos_full, sin_full):
    """Hugging Face Llama: x * cos + rotate_half(x) * sin with cat(freqs, freqs) tables."""
    return (x * cos_full + hf_rotate_half(x) * sin_full).to(x.dtype)


def gptj_apply(x, cos, sin):
    """GPT-J / RoFormer interleaved pairs: stack and flatten."""
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)


def peers_on_path() -> None:
    """``ROPELIB_PEERS``: a folder with ``site/`` (unpacked pure-Python wheels, put on
    sys.path) and ``flash_attn_rotary.py`` (flash-attn's Triton rotary, one file)."""
    folder = os.environ.get("ROPELIB_PEERS")
    if folder and (Path(folder) / "site").is_dir():
        sys.path.insert(0, str(Path(folder) / "site"))


def optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as error:
        print(f"  ({module}.{name} not importable: {type(error).__name__}: {str(error)[:120]})")
        return None


def flash_rotary():
    """flash-attn's ``apply_rotary``: from the package, else from the peers folder's copy of
    its ``flash_attn/ops/triton/rotary.py`` (which imports only torch and triton)."""
    found = optional("flash_attn.ops.triton.rotary", "apply_rotary")
    path = Path(os.environ.get("ROPELIB_PEERS", "")) / "flash_attn_rotary.py"
    if found is None and path.is_file():
        spec = importlib.util.spec_from_file_location("flash_attn_rotary", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found = module.apply_rotary
    return found


peers_on_path()
FLASH_ROTARY = flash_rotary()
LIGER_ROPE = optional("liger_kernel.transformers.rope", "liger_rotary_pos_emb")
LIGER_MROPE = optional("liger_kernel.transformers.qwen2vl_mrope",
                       "liger_multimodal_rotary_pos_emb")


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def single_tensor_tables(dtype: torch.dtype) -> None:
    b, h, s, d = SHAPE
    for storage in ("(B, H, S, D)", "(B, S, H, D)"):
        if storage == "(B, H, S, D)":
            x = randn(*SHAPE, dtype=dtype)
        else:
            x = randn(b, s, h, d, dtype=dtype).transpose(1, 2)
        for layout in ("half", "interleaved"):
            table(f"forward, {layout}, {dtype}, {tuple(x.shape)} stored as {storage}",
                  timed(forward_cases(x, layout)), "copy_", 2 * x.numel() * x.element_size())


def forward_cases(x: torch.Tensor, layout: str) -> dict[str, object]:
    s, d = x.shape[-2:]
    cos, sin = generate_rope_embeddings(s, d, device=DEVICE)
    cos_full, sin_full = (torch.cat((t, t), -1).to(x.dtype) for t in (cos, sin))
    buffer, work = torch.empty_like(x), x.clone()

    def out_call():
        apply_rope(x, cos, sin, layout=layout, out=buffer)

    cases = {
        "copy_": lambda: buffer.copy_(x),
        "clone": lambda: x.clone(),
        "ropelib": lambda: apply_rope(x, cos, sin, layout=layout),
        "ropelib out=": out_call,
        "ropelib in place": lambda: apply_rope(work, cos, sin, layout=layout, out=work),
        "ropelib out=, CUDA graph replay": captured(out_call),
        "kernel alone (no Python checks)": lambda: triton_rope.run(
            [x], [buffer], cos, sin, layout, d, False, None, None,
            triton_rope.choose_config(1, 1, s, d, DEVICE == "cuda")),
    }
    if layout == "half":
        compiled = compile_fn(hf_apply)
        cases["HF eager (rotate_half)"] = lambda: hf_apply(x, cos_full, sin_full)
        cases["HF compiled"] = lambda: compiled(x, cos_full, sin_full)
    else:
        compiled = compile_fn(gptj_apply)
        cases["GPT-J stack eager"] = lambda: gptj_apply(x, cos, sin)
        cases["GPT-J stack compiled"] = lambda: compiled(x, cos, sin)
    if FLASH_ROTARY is not None:  # flash-attn wants (B, S, H, D)
        xs = x.transpose(1, 2)
        cases["flash-attn apply_rotary"] = lambda: FLASH_ROTARY(
            xs, cos.to(x.dtype), sin.to(x.dtype), interleaved=layout == "interleaved")
    return cases


def qk_table(dtype: torch.dtype) -> None:
    b, _, s, d = SHAPE
    hq, hk = QK_HEADS
    q, k = randn(b, hq, s, d, dtype=dtype), randn(b, hk, s, d, dtype=dtype)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    cos, sin = generate_rope_embeddings(s, d, device=DEVICE)
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))
    compiled = compile_fn(lambda q, k: (hf_apply(q, cos_full, sin_full),
                                        hf_apply(k, cos_full, sin_full)))

    def copies():
        q_buf.copy_(q)
        k_buf.copy_(k)

    cases = {
        "copy_ both": copies,
        "ropelib apply_rope_qk": lambda: apply_rope_qk(q, k, cos, sin, layout="half"),
        "ropelib apply_rope_qk out=": lambda: apply_rope_qk(q, k, cos, sin, layout="half",
                                                            out=(q_buf, k_buf)),
        "ropelib apply_rope_qk in place": lambda: apply_rope_qk(q_buf, k_buf, cos, sin,
                                                                layout="half", inplace=True),
        "ropelib apply_rope twice": lambda: (apply_rope(q, cos, sin, layout="half"),
                                             apply_rope(k, cos, sin, layout="half")),
        "HF eager": lambda: (hf_apply(q, cos_full, sin_full), hf_apply(k, cos_full, sin_full)),
        "HF compiled": lambda: compiled(q, k),
    }
    if LIGER_ROPE is not None:  # Liger: (B, H, S, D) q and k, cos/sin (1, S, D)
        cases["Liger rope"] = lambda: LIGER_ROPE(q, k, cos_full[None], sin_full[None])
    table(f"q ({hq} heads) and k ({hk} heads), half, {dtype}, batch {b}, seq {s}, dim {d}",
          timed(cases), "copy_ both", 2 * (q.numel() + k.numel()) * q.element_size())


def mrope_inputs():
    """Qwen2-VL's M-RoPE inputs: q (16 heads) and k (2 heads) of a mixed text/image/video
    sequence, every token at its (t, h, w) position; ropelib's tables and axes, and the
    per-axis (3, 1, S, d) tables Hugging Face and Liger take."""
    dtype = torch.bfloat16
    b, h, _, d = MROPE_SHAPE
    sections = [d // 8, 3 * d // 16, 3 * d // 16]
    positions = mrope_positions(MROPE_SEGMENTS, spatial_merge_size=2).to(DEVICE)
    s = positions.shape[0]  # 4096 tokens for MROPE_SEGMENTS
    q, k = randn(b, h, s, d, dtype=dtype), randn(b, 2, s, d, dtype=dtype)
    axes = axis_of_pairs(d, sections).to(DEVICE)
    cos, sin = generate_rope_embeddings(int(positions.max()) + 1, d, base=1e6, device=DEVICE)
    inv_freq = 1e6 ** (-torch.arange(0, d, 2, device=DEVICE, dtype=torch.float32) / d)
    freqs = positions.T.float()[:, None, :, None] * inv_freq  # (3, 1, S, d/2)
    cos3, sin3 = (torch.cat((f, f), -1).to(dtype) for f in (freqs.cos(), freqs.sin()))
    return q, k, positions, axes, cos, sin, cos3, sin3, sections


def mrope_table() -> None:
    q, k, positions, axes, cos, sin, cos3, sin3, sections = mrope_inputs()
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)

    def hf_mrope():
        """Qwen2-VL's eager path: the sections of each axis's tables, then rotate_half."""
        full_cos = torch.cat([c[i % 3] for i, c in enumerate(cos3.split(sections * 2, -1))], -1)
        full_sin = torch.cat([c[i % 3] for i, c in enumerate(sin3.split(sections * 2, -1))], -1)
        return (hf_apply(q, full_cos[:, None], full_sin[:, None]),
                hf_apply(k, full_cos[:, None], full_sin[:, None]))

    def copies():
        q_buf.copy_(q)
        k_buf.copy_(k)

    def ropelib_out():
        apply_rope_qk(q, k, cos, sin, layout="half", positions=positions, axes=axes,
                      out=(q_buf, k_buf))

    cases = {
        "copy_ both": copies,
        "ropelib apply_rope_qk M-RoPE": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=positions, axes=axes),
        "ropelib M-RoPE out=": ropelib_out,
        "ropelib M-RoPE out=, CUDA graph replay": captured(ropelib_out),
        "HF eager M-RoPE": hf_mrope,
    }
    if LIGER_MROPE is not None:
        cases["Liger M-RoPE"] = lambda: LIGER_MROPE(q, k, cos3, sin3, sections)
    times = timed(cases)
    table(f"M-RoPE (Qwen2-VL sections {sections}, positions of a mixed sequence), half, "
          f"{q.dtype}, q {tuple(q.shape)}, k 2 heads", times, "copy_ both",
          2 * (q.numel() + k.numel()) * q.element_size())
    mrope_tiles(positions, axes, cos, sin)


MROPE_TILE_SHAPES = [(1, 16, 2, 4096), (1, 28, 4, 4096), (2, 12, 2, 2048)]  # b, hq, hk, s


def mrope_tiles(positions, axes, cos, sin) -> None:
    """The kernel's tiles for M-RoPE q + k at several shapes (batch, q heads, k heads,
    tokens; the first is the table's): (tokens per program, heads per program, warps) ->
    time / copy_ both, through ``triton_rope.run`` with the range checks of a real call."""
    for b, hq, hk, s in MROPE_TILE_SHAPES[:1] if DRY_RUN else MROPE_TILE_SHAPES:
        mrope_tiles_at(positions, axes, cos, sin, b, hq, hk, min(s, positions.shape[0]))


def mrope_tiles_at(positions, axes, cos, sin, b: int, hq: int, hk: int, s: int) -> None:
    d = MROPE_SHAPE[-1]
    q, k = randn(b, hq, s, d), randn(b, hk, s, d)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    coordinates = positions[:s].reshape(1, 1, s, positions.shape[-1])
    copy_ms = median_ms(lambda: (q_buf.copy_(q), k_buf.copy_(k)))
    heads = hq + hk
    default = triton_rope.choose_config(b, heads, s, d, DEVICE == "cuda", mrope=True)
    grid = {triton_rope.Config(block_s, per, warps) for block_s in (8, 16)
            for per in (4, -(-heads // 4), -(-heads // 2), heads) for warps in (4, 8)}
    results = []
    for config in [default, *sorted(grid - {default})]:
        def run(config=config):
            triton_rope.run([q, k], [q_buf, k_buf], cos, sin, "half", d, False, coordinates,
                            axes, config, pending=kernels.UNCHECKED_RANGES[False, False])
        run()
        results.append((median_ms(run) / copy_ms, config))
    if DRY_RUN:
        print(f"  M-RoPE tiles: {len(results)} ran")
        return
    best = ", ".join(f"{tuple(c)} {r:.2f}" for r, c in sorted(results)[:4])
    print(f"  M-RoPE tiles, q {hq} + k {hk} heads, batch {b}, {s} tokens: default "
          f"{tuple(default)} {results[0][0]:.2f}; best {best}")


class CopyNode(torch.autograd.Function):
    """The floor of a Python autograd node that moves the rotation's bytes: its forward
    copies x and its backward copies the gradient (one kernel each way)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def backward_table() -> None:
    """Forward + backward (the gradient of x, as in training) against two copies, with two
    floors of the same bytes: PyTorch's own autograd node (``torch.neg``: a kernel each way,
    no Python in the backward) and a Python one (``CopyNode``: what any
    ``autograd.Function``, ropelib's included, pays around its two kernels); and x as a
    query with a 1-head key rotated together (``apply_rope_qk``, an attention module's
    training step; Liger's row takes the same two)."""
    dtype = torch.bfloat16
    s, d = SHAPE[2], SHAPE[3]
    x = randn(*SHAPE, dtype=dtype).requires_grad_()
    grad = randn(*SHAPE, dtype=dtype)
    buffer = torch.empty_like(grad)
    cos, sin = generate_rope_embeddings(s, d, device=DEVICE)
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))
    compiled = compile_fn(hf_apply)

    def copies():
        buffer.copy_(grad)
        buffer.copy_(grad)

    def step(fn):
        def run():
            x.grad = None
            fn().backward(grad)
        return run

    cases = {
        "two copy_": copies,
        "floor: torch.neg (C++ node)": step(lambda: torch.neg(x)),
        "floor: autograd.Function, copies": step(lambda: CopyNode.apply(x)),
        "ropelib": step(lambda: apply_rope(x, cos, sin, layout="half")),
        "ropelib backward alone (inverse kernel)": lambda: kernels.rotate(
            grad, cos, sin, "half", d, True),
        "HF eager": step(lambda: hf_apply(x, cos_full, sin_full)),
        "HF compiled": step(lambda: compiled(x, cos_full, sin_full)),
    }
    k = randn(SHAPE[0], 1, s, d, dtype=dtype).requires_grad_()  # x as q, a 1-head k

    def with_key(rotate_qk):
        def run():
            x.grad = k.grad = None
            q_rot, _ = rotate_qk(x, k)
            q_rot.backward(grad)
        return run
    cases["ropelib apply_rope_qk (q + a 1-head k)"] = with_key(
        lambda q, k: apply_rope_qk(q, k, cos, sin, layout="half"))
    if LIGER_ROPE is not None:  # Liger rotates q and k
        cases["Liger rope (q + a 1-head k)"] = with_key(
            lambda q, k: LIGER_ROPE(q, k, cos_full[None], sin_full[None]))
    if FLASH_ROTARY is not None:
        xs = x.transpose(1, 2)
        cases["flash-attn apply_rotary"] = step(lambda: FLASH_ROTARY(
            xs, cos.to(dtype), sin.to(dtype)).transpose(1, 2))
    table(f"forward + backward, half, {dtype}, {SHAPE}", timed(cases), "two copy_",
          4 * grad.numel() * grad.element_size())
    kernels_by_time("ropelib forward + backward", cases["ropelib"])
    host_side("ropelib forward + backward", cases["ropelib"])


def decode_table() -> None:
    """One decode step: q (64, 32, 1, 128) and k (64, 8, 1, 128), each row at its own
    position; eager wall time per call and replay time in a CUDA graph. Also: a 0-d offset
    tensor (the step of a batch at one position), M-RoPE's per-token (t, h, w) positions,
    ropelib with Triton's JIT launch instead of the prepared one, the prepared launch alone
    (what is left of a call without ropelib's Python) beside one PyTorch kernel's launch and
    the same launch through Inductor's static launcher (``statically_launched``), and the
    kernel compiled without its device-side assertions (what they cost)."""
    dtype = torch.bfloat16
    hq, hk = QK_HEADS
    d = SHAPE[3]
    q, k = randn(DECODE_ROWS, hq, 1, d, dtype=dtype), randn(DECODE_ROWS, hk, 1, d, dtype=dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    positions = torch.randint(0, 8192, (DECODE_ROWS, 1), device=DEVICE)
    offset = torch.tensor(4000, device=DEVICE)
    mrope = torch.randint(0, 8192, (DECODE_ROWS, 1, 3), device=DEVICE)
    axes = axis_of_pairs(d, [d // 8, 3 * d // 16, 3 * d // 16]).to(DEVICE)
    cos, sin = generate_rope_embeddings(8192, d, device=DEVICE)
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))

    def ropelib_step():
        apply_rope_qk(q, k, cos, sin, layout="half", positions=positions, out=(q_out, k_out))

    def jit_launch_step():
        with_raw, triton_rope._RAW_LAUNCH = triton_rope._RAW_LAUNCH, False
        triton_rope._launchers.clear()
        try:
            ropelib_step()
        finally:
            triton_rope._RAW_LAUNCH = with_raw

    def hf_step():
        c, s = cos_full[positions][:, None], sin_full[positions][:, None]
        return hf_apply(q, c, s), hf_apply(k, c, s)

    cases = {
        "ropelib apply_rope_qk positions out=": ropelib_step,
        "ropelib apply_rope_qk positions": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=positions),
        "ropelib apply_rope_qk 0-d offset": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", offset=offset, out=(q_out, k_out)),
        "ropelib M-RoPE positions out=": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=mrope, axes=axes, out=(q_out, k_out)),
        "ropelib, Triton's JIT launch every call": jit_launch_step,
        "HF eager": hf_step,
        "one PyTorch kernel: q_out.copy_(q)": lambda: q_out.copy_(q),
    }
    launch = recorded_launch(ropelib_step)
    if launch is not None:
        cases["ropelib's launch alone (no ropelib Python)"] = launch
    if DEVICE == "cuda":
        try:
            cases["that launch, Inductor's static launcher"] = statically_launched(
                ropelib_step, [q_out, k_out])
        except Exception as error:
            print(f"  (Inductor's static launcher: {type(error).__name__}: {str(error)[:100]})")
    if LIGER_ROPE is not None:
        cases["Liger rope"] = lambda: LIGER_ROPE(q, k, cos_full[positions], sin_full[positions])
    if FLASH_ROTARY is not None:  # (B, S, H, D); per-row offsets as seqlen_offsets
        qs, starts = q.transpose(1, 2), positions[:, 0].to(torch.int32)
        cases["flash-attn apply_rotary (q only)"] = lambda: FLASH_ROTARY(
            qs, cos.to(dtype), sin.to(dtype), seqlen_offsets=starts)
    wall_table(f"decode step, {DECODE_ROWS} rows at their own positions, q {hq} heads, k {hk}, "
               f"half, {dtype}", cases)
    if DEVICE == "cuda":
        assertions_cost(ropelib_step)


def assertions_cost(step) -> None:
    """The decode step with the kernel compiled without debug (no device-side assertion)
    against the default kernel, wall time and graph replay."""
    with kernel_swapped(triton.jit(triton_rope._rope)):
        wall_table("decode step, kernel without its device-side assertions (for comparison)",
                   {"ropelib, no assertions compiled": step})


def module_decode_table() -> None:
    """One decode step of the attention module (width 4096, GQA 32/8, bf16) for 64 rows over
    a KVCache of 4096 slots (``cache_position``): eager wall time per step and replay time
    of the step captured in a CUDA graph; with RoPE fused with the cache write (one launch),
    unfused (rotation, then KVCache.write), with given positions (rows computed on the
    device, then the fused launch), and without RoPE."""
    from ropelib import KVCache, StandardAttentionWithRoPE

    dtype, rows = torch.bfloat16, DECODE_ROWS
    kw = {"num_kv_heads": 8, "bias": False, "layout": "half", "device": DEVICE, "dtype": dtype}
    heads = WIDTH // SHAPE[3]
    kw["num_kv_heads"] = max(1, heads // 4)
    with_rope = StandardAttentionWithRoPE(WIDTH, heads, **kw).eval()
    without = StandardAttentionWithRoPE(WIDTH, heads, rope=False, **kw).eval()
    x = randn(rows, 1, WIDTH, dtype=dtype)
    positions = torch.randint(0, CAPACITY, (rows, 1), device=DEVICE)
    slot = torch.tensor(CAPACITY // 2, device=DEVICE)
    unfused = functools.partial(StandardAttentionWithRoPE._rotate_into_cache, with_rope)

    def step(module, given=False):
        cache = KVCache(capacity=CAPACITY)
        extra = {"positions": positions} if given else {}
        return lambda: module(x, x, x, kv_cache=cache, cache_position=slot, **extra)

    def unfused_step():
        run = step(with_rope)

        def call():
            with_rope._rotate_into_cache = lambda *args: None
            try:
                return run()
            finally:
                with_rope._rotate_into_cache = unfused
        return call

    cases = {"with RoPE, fused with the cache write": step(with_rope),
             "with RoPE, unfused (rotation, then write)": unfused_step(),
             "with RoPE, given positions, fused": step(with_rope, given=True),
             "without RoPE": step(without)}
    with torch.no_grad():
        wall_table(f"attention module decode step, {rows} rows, width {WIDTH}, GQA "
                   f"{heads}/{kw['num_kv_heads']}, {dtype}, cache of {CAPACITY} slots "
                   "(cache_position)", cases)
        for name in ("with RoPE, fused with the cache write", "with RoPE, given positions, fused"):
            gaps = paired_gap_us(cases[name], cases["without RoPE"])
            shown = ("ran" if DRY_RUN else f"{statistics.median(gaps):+.1f} us a step (rounds "
                     f"{gaps[0]:+.1f} .. {gaps[-1]:+.1f})")
            print(f"  eager, {name} minus without RoPE, timed in turn: {shown}")


def attention_table() -> None:
    """The attention layer forward (4096 wide, GQA 32/8, causal, 4096 tokens, bf16, no
    grad): ropelib's module with and without RoPE on the same weights, compiled, and Hugging
    Face's LlamaAttention (SDPA). RoPE's share: (with - without) / without. Then the GPU
    kernels of the eager and the compiled module, by time (torch.profiler)."""
    from ropelib import StandardAttentionWithRoPE

    dtype, heads = torch.bfloat16, WIDTH // SHAPE[3]
    kw = {"num_kv_heads": max(1, heads // 4), "bias": False, "layout": "half",
          "device": DEVICE, "dtype": dtype}
    with_rope = StandardAttentionWithRoPE(WIDTH, heads, **kw).eval()
    without = StandardAttentionWithRoPE(WIDTH, heads, rope=False, **kw).eval()
    without.load_state_dict(with_rope.state_dict(), strict=False)
    compiled = compile_fn(with_rope, fullgraph=True)
    compiled_without = compile_fn(without, fullgraph=True)
    x = randn(1, TOKENS, WIDTH, dtype=dtype)
    cases = {
        "module, RoPE": lambda: with_rope(x, x, x, is_causal=True),
        "module, no RoPE": lambda: without(x, x, x, is_causal=True),
        "module compiled, RoPE": lambda: compiled(x, x, x, is_causal=True),
        "module compiled, no RoPE": lambda: compiled_without(x, x, x, is_causal=True),
    }
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        config = LlamaConfig(hidden_size=WIDTH, num_attention_heads=heads,
                             num_key_value_heads=kw["num_kv_heads"],
                             max_position_embeddings=TOKENS)
        config._attn_implementation = "sdpa"
        hf = LlamaAttention(config, 0).to(DEVICE, dtype).eval()
        rotary = LlamaRotaryEmbedding(config).to(DEVICE)
        position_ids = torch.arange(TOKENS, device=DEVICE)[None]

        def hf_layer():
            return hf(x, rotary(x, position_ids), attention_mask=None, is_causal=True)

        cases["HF LlamaAttention (SDPA), RoPE"] = hf_layer
    except Exception as error:
        print(f"  (HF LlamaAttention not built: {type(error).__name__}: {error})")
    with torch.no_grad():
        times = timed(cases)
        table(f"attention layer forward, width {WIDTH}, GQA {heads}/{kw['num_kv_heads']}, "
              f"causal, {TOKENS} tokens, {dtype}", times, "module, no RoPE",
              4 * x.numel() * x.element_size())
        share = (times["module, RoPE"] - times["module, no RoPE"]) / times["module, no RoPE"]
        print(f"  RoPE's share of the module's forward: {share:.1%}")
        for name, baseline in (("module, RoPE", "module, no RoPE"),
                               ("module compiled, RoPE", "module compiled, no RoPE"),
                               ("module compiled, RoPE", "module, RoPE")):
            ratios = paired_ratios(cases[name], cases[baseline])
            shown = ("ran" if DRY_RUN else f"{statistics.median(ratios):.3f} (rounds "
                     f"{ratios[0]:.3f} .. {ratios[-1]:.3f})")
            print(f"  {name} / {baseline}, timed in turn: {shown}")
        for name in ("module, RoPE", "module compiled, RoPE", "module compiled, no RoPE"):
            kernels_by_time(name, cases[name])
        for name in ("module compiled, RoPE", "module compiled, no RoPE"):
            host_side(name, cases[name])


def kernels_by_time(name: str, fn) -> None:
    """The GPU kernels of 10 calls of fn, by total time (the top 8), and the count of
    kernels per call (in a dry run: the CPU's operations)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    activity = ProfilerActivity.CUDA if DEVICE == "cuda" else ProfilerActivity.CPU
    kind = torch.autograd.DeviceType.CUDA if DEVICE == "cuda" else torch.autograd.DeviceType.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(10):
            fn()
        sync()
    events = [e for e in prof.key_averages() if e.device_type == kind]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    print(f"  {name}: {sum(e.count for e in events) / 10:.0f} kernels per call; by time:")
    for e in events[:8]:
        total = e.device_time_total if DEVICE == "cuda" else e.cpu_time_total
        print(f"    {total / 10:9.1f} us  x{e.count // 10:<3} {e.key[:90]}")


def host_side(name: str, fn) -> None:
    """The host's side of 10 calls of fn: the operations and runtime calls by their own CPU
    time (the top 10), and the calls that wait for the device (synchronizations, copies to
    the host), which leave the GPU idle while Python runs."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(10):
            fn()
        sync()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    waits = [e for e in events if any(word in e.key for word in ("Synchronize", "DtoH", "item",
                                                                   "_local_scalar_dense"))]
    print(f"  {name}: host, by own CPU time per call (of 10 calls)")
    for e in events[:10]:
        print(f"    {e.self_cpu_time_total / 10:9.1f} us  x{e.count / 10:<5g} {e.key[:80]}")
    print("    waits for the device: " + (", ".join(
        f"{e.key[:50]} x{e.count / 10:g}" for e in waits) or "none"))


def fused_api_table() -> None:
    """apply_rope_qk_to_cache alone (q rotated, k into its slots, v copied: one launch)
    against the rotation then two index_copy_ (what KVCache.write does), 64 decode rows."""
    dtype, (hq, hk), d = torch.bfloat16, QK_HEADS, SHAPE[3]
    q, k, v = (randn(DECODE_ROWS, h, 1, d, dtype=dtype) for h in (hq, hk, hk))
    keys, values = (randn(DECODE_ROWS, hk, CAPACITY, d, dtype=dtype) for _ in range(2))
    cos, sin = generate_rope_embeddings(CAPACITY, d, device=DEVICE)
    slot = torch.tensor(CAPACITY // 2, device=DEVICE)

    def unfused():
        q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout="half", offset=slot)
        slots = slot + torch.arange(1, device=DEVICE)
        keys.index_copy_(2, slots, k_rot)
        values.index_copy_(2, slots, v)

    wall_table(f"decode rotation and cache write, {DECODE_ROWS} rows, q {hq} heads, k and v "
               f"{hk}, cache of {CAPACITY} slots, {dtype}", {
                   "apply_rope_qk_to_cache (one launch)": lambda: apply_rope_qk_to_cache(
                       q, k, v, cos, sin, keys, values, slot, layout="half"),
                   "apply_rope_qk, then index_copy_ x2": unfused})


def host_cases() -> dict:
    """The calls whose host time ``host_table`` measures (and ``host_instructions.py``
    counts), on CPU tensors: the decode shapes of decode_table, (B, H, S, D) and (B, S, H, D)
    calls at a small shape, the registered operator as a compiled graph calls it, and a
    training step (forward + backward) beside its floor (``AutogradFloor``: an
    autograd.Function that only allocates its output and its gradient), and one of q and
    k together (an attention module's)."""
    from ropelib.book.bench import AutogradFloor

    hq, hk, d = *QK_HEADS, SHAPE[3]
    q, k = torch.randn(DECODE_ROWS, hq, 1, d), torch.randn(DECODE_ROWS, hk, 1, d)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    positions = torch.randint(0, 8192, (DECODE_ROWS, 1))
    cos, sin = generate_rope_embeddings(8192, d)
    x = torch.randn(2, 8, 64, d)
    xs = torch.randn(2, 64, 8, d).transpose(1, 2)
    buffers = {id(t): torch.empty_like(t) for t in (x, xs)}
    axes = axis_of_pairs(d, [d // 8, 3 * d // 16, 3 * d // 16])
    mrope = torch.randint(0, 8192, (DECODE_ROWS, 1, 3))
    q_prefill, k_prefill = torch.randn(1, hq, 64, d), torch.randn(1, hk, 64, d)
    trained, grad = torch.randn(2, 8, 64, d, requires_grad=True), torch.randn(2, 8, 64, d)
    trained_k, grad_k = torch.randn(2, 2, 64, d, requires_grad=True), torch.randn(2, 2, 64, d)

    def train(forward):
        trained.grad = None
        forward().backward(grad)

    def train_qk():
        trained.grad = trained_k.grad = None
        torch.autograd.backward(apply_rope_qk(trained, trained_k, cos[:64], sin[:64],
                                              layout="half"), (grad, grad_k))
    return {
        "apply_rope_qk positions out= (decode)": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=positions, out=(q_out, k_out)),
        "apply_rope_qk 0-d offset (decode)": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", offset=torch.tensor(3), out=(q_out, k_out)),
        "apply_rope_qk M-RoPE (decode)": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=mrope, axes=axes, out=(q_out, k_out)),
        "apply_rope (B, H, S, D) out=": lambda: apply_rope(
            x, cos[:64], sin[:64], layout="half", out=buffers[id(x)]),
        "apply_rope (B, S, H, D) view out=": lambda: apply_rope(
            xs, cos[:64], sin[:64], layout="half", out=buffers[id(xs)]),
        "apply_rope (B, S, H, D) view in place": lambda: apply_rope(
            xs, cos[:64], sin[:64], layout="half", out=xs),
        "operator ropelib::rotate_qk (compiled graph)": lambda: torch.ops.ropelib.rotate_qk(
            q_prefill, k_prefill, cos[:64], sin[:64], "half", d),
        "forward + backward, apply_rope": lambda: train(
            lambda: apply_rope(trained, cos[:64], sin[:64], layout="half")),
        "forward + backward, floor (autograd.Function)": lambda: train(
            lambda: AutogradFloor.apply(trained)),
        "forward + backward, apply_rope_qk (GQA 8/2)": train_qk,
    }


@contextlib.contextmanager
def gpu_route_stubbed():
    """CPU tensors on the route of CUDA tensors (values not read, the Triton backend), the
    launch replaced by a no-op."""
    from unittest import mock

    from ropelib import rotation

    with mock.patch.dict(os.environ, {"ROPELIB_BACKEND": "triton"}), \
            mock.patch.object(rotation, "_on_device", lambda t: True), \
            mock.patch.object(triton_rope, "_launch", lambda *args: None):
        yield


def host_table() -> None:
    """The host's time per call of ``host_cases``, launches stubbed (``gpu_route_stubbed``):
    ropelib's Python on the route of CUDA tensors. Needs no GPU. (The Hugging Face formula's
    cost per call on a GPU is its launches: decode_table's wall time.)"""
    print("\nhost time per call, launch stubbed (CPU: " + (
        "dry run" if DRY_RUN else "the machine's") + ")")
    with gpu_route_stubbed():
        for name, fn in host_cases().items():
            times = []
            for _ in range(1 if DRY_RUN else 7):
                fn()
                start = time.perf_counter()
                for _ in range(1 if DRY_RUN else 2000):
                    fn()
                times.append((time.perf_counter() - start) / (1 if DRY_RUN else 2000) * 1e6)
            shown = "ran" if DRY_RUN else f"{statistics.median(times):8.1f} us"
            print(f"  {name:<48}{shown:>12}")


def launch_path_table() -> None:
    """Which launch each call takes after its first: the prepared raw launch, or Triton's JIT
    (its argument binding costs about 100 us of host time a call). Counts the calls that go
    through ``triton_rope._compiled[grid]`` in 50 calls after one warm-up call, per case of
    the tables above whose eager time was far above its CUDA graph replay."""
    b, h, s, d = SHAPE
    cos, sin = generate_rope_embeddings(s, d, device=DEVICE)
    x = randn(*SHAPE)
    xs = randn(b, s, h, d).transpose(1, 2)
    q, k, positions, axes, m_cos, m_sin, *_ = mrope_inputs()
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    hq, hk = QK_HEADS
    dq, dk = randn(DECODE_ROWS, hq, 1, d), randn(DECODE_ROWS, hk, 1, d)
    rows = torch.randint(0, s, (DECODE_ROWS, 1), device=DEVICE)
    cases = {f"{storage} {layout}{' out=' if out else ''}": functools.partial(
        apply_rope, t, cos, sin, layout=layout, out=torch.empty_like(t) if out else None)
        for storage, t in (("(B, H, S, D)", x), ("(B, S, H, D)", xs))
        for layout in ("half", "interleaved") for out in (False, True)}
    cases["M-RoPE q + k out="] = lambda: apply_rope_qk(
        q, k, m_cos, m_sin, layout="half", positions=positions, axes=axes, out=(q_buf, k_buf))
    cases["decode q + k positions"] = lambda: apply_rope_qk(
        dq, dk, cos, sin, layout="half", positions=rows)
    jit = triton_rope._compiled

    class Counting:
        calls = 0

        def __getitem__(self, grid):
            Counting.calls += 1
            return jit[grid]

    print(f"\nlaunch path, {SHAPE} bf16 and the decode and M-RoPE calls above: calls through "
          "Triton's JIT in 50 calls after the first (0: all took the prepared raw launch), "
          "and the wall time per call of 200 calls in a row")
    triton_rope._compiled = Counting()
    try:
        for name, fn in cases.items():
            fn()
            Counting.calls = 0
            for _ in range(1 if DRY_RUN else 50):
                fn()
            sync()
            print(f"  {name:<44}{Counting.calls:4d}{wall_us(fn):10.1f} us")
    finally:
        triton_rope._compiled = jit
    for name in ("(B, S, H, D) half out=", "(B, S, H, D) interleaved out="):
        kernels_by_time(name, cases[name])


def sweep() -> None:
    """The kernel's tile shapes at the single-tensor shape: tokens per program, heads per
    program and warps, for both layouts and dtypes (ratios to copy_ in the same run)."""
    b, h, s, d = SHAPE
    cos, sin = generate_rope_embeddings(s, d, device=DEVICE)
    print(f"\nsweep: (block_s, heads_per_program, num_warps) -> / copy_, x {SHAPE}")
    for dtype in (torch.bfloat16, torch.float32):
        x = randn(*SHAPE, dtype=dtype)
        buffer = torch.empty_like(x)
        copy = median_ms(functools.partial(buffer.copy_, x))
        default = triton_rope.choose_config(b, h, s, d, True)
        for layout in ("half", "interleaved"):
            results = []
            for block_s in (16, 32, 64):
                for heads in (32, 4):
                    for warps in (4, 8):
                        config = triton_rope.Config(block_s, heads, warps)
                        results.append((time_config(x, buffer, cos, sin, layout, config) / copy,
                                        config))
            results.sort(key=lambda r: r[0])
            chosen = next((r for r, c in results if c == default), float("nan"))
            best = ", ".join(f"{tuple(c)} {r:.2f}" for r, c in results[:4])
            if DRY_RUN:
                best = f"{len(results)} tile shapes ran"
            print(f"  {dtype} {layout}: default {tuple(default)} {chosen:.2f}; best {best}")


def time_config(x, buffer, cos, sin, layout: str, config) -> float:
    def run():
        triton_rope.run([x], [buffer], cos, sin, layout, x.shape[-1], False, None, None, config)

    run()
    return median_ms(run)


TABLES = {
    "bf16": functools.partial(single_tensor_tables, torch.bfloat16),
    "fp32": functools.partial(single_tensor_tables, torch.float32),
    "qk": functools.partial(qk_table, torch.bfloat16), "mrope": mrope_table,
    "backward": backward_table, "decode": decode_table, "fused": fused_api_table,
    "module_decode": module_decode_table, "attention": attention_table, "host": host_table,
    "launch_path": launch_path_table, "sweep": sweep,
}


def dry_run_settings() -> None:
    """Tiny shapes on the CPU, the kernel in Triton's interpreter."""
    global SHAPE, QK_HEADS, MROPE_SHAPE, MROPE_SEGMENTS, DECODE_ROWS, WIDTH, TOKENS
    global CAPACITY, DEVICE, DRY_RUN
    SHAPE, QK_HEADS, MROPE_SHAPE = DRY["shape"], DRY["qk_heads"], DRY["mrope_shape"]
    MROPE_SEGMENTS, DECODE_ROWS = DRY["mrope_segments"], DRY["decode_rows"]
    WIDTH, TOKENS, CAPACITY = DRY["width"], DRY["tokens"], DRY["capacity"]
    DEVICE, DRY_RUN = "cpu", True
    os.environ["ROPELIB_BACKEND"] = "triton"


def main() -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time the kernel's tiles")
    parser.add_argument("--only", help=f"comma-separated tables of {', '.join(TABLES)}")
    parser.add_argument("--dry-run", action="store_true",
                        help="run every table's code once on the CPU at tiny shapes")
    args = parser.parse_args()
    if args.dry_run:
        dry_run_settings()
    elif not torch.cuda.is_available() and args.only != "host":
        raise SystemExit("bench_gpu.py needs a CUDA GPU (or --dry-run, or --only host)")
    elif not torch.cuda.is_available():
        DEVICE = "cpu"  # the host table only
    names = args.only.split(",") if args.only else [n for n in TABLES if n != "sweep"] + (
        ["sweep"] if args.sweep else [])
    unknown = set(names) - set(TABLES)
    if unknown:
        raise SystemExit(f"unknown tables {sorted(unknown)}; choose from {list(TABLES)}")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"{device}, torch {torch.__version__}, triton {triton.__version__}; ropelib on "
          f"{DEVICE}: {backend_status(DEVICE)}")
    print(f"flash-attn rotary: {'yes' if FLASH_ROTARY else 'not installed'}; Liger: "
          f"{'yes' if LIGER_ROPE else 'not installed'}")
    failures = 0
    for name in names:
        try:
            TABLES[name]()
        except Exception:  # one table's failure must not hide the others
            traceback.print_exc()
            failures += 1
            sync()
    return 1 if failures and DRY_RUN else 0


if __name__ == "__main__":
    sys.exit(main())
