"""RoPE speed: ropelib against copy baselines and the formulations of other codebases.

    .venv/bin/python benchmarks/bench_rope.py            # CPU (and CUDA when available)
    .venv/bin/python benchmarks/bench_rope.py --quick    # small shape only, fewer repeats
    .venv/bin/python benchmarks/bench_rope.py --only-mrope --device cpu  # M-RoPE rows only
    python benchmarks/bench_rope.py --device cuda        # the GPU tables (bench_gpu.py)

Everything in one table is measured in one run, round-robin (see ropelib.book.bench), and printed
as the median time, the ratio to ``clone`` and to ``copy_`` into a preallocated buffer, and
the bandwidth of a read plus a write of x. Each RoPE table is timed in a fresh process (this
script run with ``--table``), so no table inherits another's allocator state, compiled code
or warmed caches.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

import torch

from ropelib.attention import KVCache, StandardAttentionWithRoPE
from ropelib.book import bench
from ropelib.book.timing import fit_power_law
from ropelib.kernels import native_status
from ropelib.linear_attention import linear_attention
from ropelib.multiaxis import mrope_positions
from ropelib.rotation import apply_rope
from ropelib.tables import RotaryEmbedding

SHAPES = ((4, 16, 2048, 128), (1, 8, 512, 64))
DTYPES = (torch.float32, torch.bfloat16)
MROPE_SHAPE = (1, 16, 4096, 128)
# a text / image / text / video / text sequence of 4096 tokens (Qwen2-VL's 2 x 2 merge)
MROPE_SEGMENTS = [1000, (1, 64, 64), 50, (4, 32, 48), 486]


def print_table(title: str, medians: dict[str, float], nbytes: int, compile_s: dict | None = None
                ) -> None:
    clone, copy = medians["clone"], medians.get("copy_")
    print(f"\n{title}")
    print(f"{'formulation':<28}{'median ms':>11}{'/ clone':>9}{'/ copy_':>9}{'GB/s':>8}")
    for name, seconds in medians.items():
        vs_copy = f"{seconds / copy:9.2f}" if copy else f"{'':>9}"
        print(f"{name:<28}{seconds * 1e3:11.3f}{seconds / clone:9.2f}{vs_copy}"
              f"{nbytes / seconds / 1e9:8.1f}")
    for name, seconds in (compile_s or {}).items():
        print(f"  ({name}: first call, including compilation, {seconds:.1f} s)")


def forward_table(x: torch.Tensor, layout: str, repeats: int, compile_peers: bool) -> None:
    cases = bench.forward_candidates(x, layout)
    compile_s = None
    if compile_peers:
        compiled, compile_s = bench.compiled_candidates(x, layout)
        cases.update(compiled)
    medians = bench.time_round_robin(cases, x.device, repeats=repeats)
    print_table(f"forward, {layout}, {x.dtype}, {tuple(x.shape)}, {x.device}", medians,
                bench.bytes_moved(x), compile_s)


def mrope_table(x: torch.Tensor, repeats: int) -> None:
    """Qwen2-VL's M-RoPE (sections 16/24/24, half layout) on a mixed sequence."""
    positions = mrope_positions(MROPE_SEGMENTS, spatial_merge_size=2).to(x.device)
    medians = bench.time_round_robin(bench.mrope_candidates(x, positions, [16, 24, 24]),
                                     x.device, repeats=repeats)
    print_table(f"M-RoPE forward, half, {x.dtype}, {tuple(x.shape)}, {x.device}, t up to "
                f"{int(positions[:, 0].max())}", medians, bench.bytes_moved(x))
    print(f"  hf_mrope / ropelib M-RoPE = {medians['hf_mrope'] / medians['ropelib M-RoPE']:.2f}, "
          f"ropelib M-RoPE / clone = {medians['ropelib M-RoPE'] / medians['clone']:.2f}")


def backward_table(x: torch.Tensor, layout: str, repeats: int) -> None:
    """Each forward alone (recording autograd, as in training) and forward + backward."""
    cases = {**bench.training_forward_candidates(x, layout),
             **bench.backward_candidates(x, layout)}
    medians = bench.time_round_robin(cases, x.device, repeats=repeats)
    medians["clone"] = medians.pop("clone fwd+bwd")
    print_table(f"forward+backward, {layout}, {x.dtype}, {tuple(x.shape)}, {x.device}",
                medians, bench.bytes_moved(x))
    ratios = ", ".join(f"{name} {medians[f'{name} fwd+bwd'] / medians[f'{name} fwd']:.2f}"
                       for name in ("ropelib", *bench.PEERS[layout]))
    ratios += f", clone {medians['clone'] / medians['clone fwd']:.2f}"
    ratios += (", autograd floor "
               f"{medians['autograd floor fwd+bwd'] / medians['autograd floor fwd']:.2f}")
    print(f"  fwd+bwd / fwd: {ratios}")
    faults = ", ".join(f"{name} {minor_faults(cases[name])}" for name in
                       ("ropelib fwd", "ropelib fwd+bwd", "clone fwd", "clone fwd+bwd"))
    print(f"  minor page faults of one call, after an untimed one: {faults}")


def minor_faults(fn) -> int:
    """Page faults of a call of fn right after an untimed one (as in a timed sample): fresh
    memory faults on first touch, memory the allocator recycles does not."""
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def one_table(spec: str, device: torch.device, repeats: int, compile_peers: bool) -> None:
    """The table ``KIND:SHAPE:DTYPE:LAYOUT``, e.g. ``forward:4,16,2048,128:bfloat16:half``."""
    kind, shape, dtype, layout = spec.split(":")
    x = torch.randn(tuple(int(n) for n in shape.split(",")), device=device).to(
        getattr(torch, dtype))
    if kind == "forward":
        forward_table(x, layout, repeats, compile_peers)
    elif kind == "mrope":
        mrope_table(x, repeats)
    else:
        backward_table(x, layout, repeats)


def table_specs(shapes, only_mrope: bool = False) -> list[str]:
    """``KIND:SHAPE:DTYPE:LAYOUT`` of every table: forward and backward per shape, dtype and
    layout, then M-RoPE at ``MROPE_SHAPE`` per dtype."""
    specs = [] if only_mrope else [
        f"{kind}:{','.join(map(str, shape))}:{str(dtype).removeprefix('torch.')}:{layout}"
        for shape in shapes for dtype in DTYPES for layout in ("half", "interleaved")
        for kind in ("forward", "backward")]
    return specs + [f"mrope:{','.join(map(str, MROPE_SHAPE))}:"
                    f"{str(dtype).removeprefix('torch.')}:half" for dtype in DTYPES]


def rope_tables(device: torch.device, shapes, repeats: int, compile_peers: bool,
                only_mrope: bool = False) -> None:
    """Every table, each in a fresh process of this script."""
    for spec in table_specs(shapes, only_mrope):
        command = [sys.executable, __file__, "--table", spec, "--device", device.type,
                   "--repeats", str(repeats)]
        if not compile_peers:
            command.append("--no-compile")
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode:
            raise RuntimeError(f"table {spec} failed:\n{result.stderr[-3000:]}")
        print(result.stdout, end="", flush=True)


def attention_table(device: torch.device, repeats: int) -> None:
    """The module's fast path against SDPA on q, k, v that are already projected and rotated."""
    batch, seq, heads, dim = 2, 1024, 8, 64
    module = StandardAttentionWithRoPE(heads * dim, heads, bias=False).to(device).eval()
    x = torch.randn(batch, seq, heads * dim, device=device)
    q, k, v = (torch.randn(batch, heads, seq, dim, device=device) for _ in range(3))

    def projections_and_sdpa() -> torch.Tensor:
        module.q_proj(x), module.k_proj(x), module.v_proj(x)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return module.o_proj(out.transpose(1, 2).reshape(batch, seq, heads * dim))

    with torch.no_grad():
        medians = bench.time_round_robin(
            {"clone": x.clone, "projections + SDPA": projections_and_sdpa,
             "StandardAttentionWithRoPE": lambda: module(x, x, x, is_causal=True)},
            device, repeats=repeats)
    print_table(f"attention fast path, B={batch} N={seq} H={heads} d={dim}, {device}", medians,
                bench.bytes_moved(x))
    ratio = medians["StandardAttentionWithRoPE"] / medians["projections + SDPA"]
    print(f"  module / (projections + SDPA) = {ratio:.2f}")


def rows_table(device: torch.device, repeats: int, seq: int = 4096, dim: int = 128) -> None:
    """The cos/sin rows of ``seq`` given positions, the two ways the attention module gets
    them: gathered from its float64-built tables (its route on the CPU, after growing them
    to the largest position) and computed from the float64 frequencies (its route on a GPU
    and under a compiler, where nothing is read back), next to rotating q of one layer."""
    rotary = RotaryEmbedding(dim, max_position_embeddings=seq).to(device)
    positions = torch.randperm(seq, device=device)
    q = torch.randn(1, 32, seq, dim, device=device)
    cos, sin = rotary.tables(seq, device)
    rows = cos[positions]
    medians = bench.time_round_robin({
        "clone": rows.clone,
        "rows gathered": lambda: (cos[positions], sin[positions]),
        "rows computed (float64)": lambda: rotary.traced_rows(positions, None),
        "rotate q (1, 32, S, d)": lambda: apply_rope(q, cos, sin, positions=positions),
    }, device, repeats=repeats)
    print_table(f"rows of {seq} given positions, {dim // 2} pairs, {device} (clone: the cos "
                "rows)", medians, bench.bytes_moved(rows))


def decode_table(device: torch.device, repeats: int, cached: int = 4096) -> None:
    """One decode step (one new token attending over ``cached`` ones, KV cache) with plain
    RoPE and with dynamic NTK past its switch (trained length cached / 2). Dynamic NTK's
    frequencies change at every such step, so its keys are cached unrotated and all of them
    are rotated at every step (see ``KVCache``): the row "rotate cached keys" is that cost
    alone, next to a clone of the cached keys (the "/ clone" column)."""
    batch, heads, kv_heads, dim = 1, 16, 4, 128
    dynamic = {"rope_type": "dynamic", "factor": 2.0,
               "original_max_position_embeddings": cached // 2}
    modules = {name: StandardAttentionWithRoPE(heads * dim, heads, num_kv_heads=kv_heads,
                                               bias=False, scaling=scaling
                                               ).to(device).eval()
               for name, scaling in (("plain", None), ("dynamic", dynamic))}
    x = torch.randn(batch, cached, heads * dim, device=device)
    token = torch.randn(batch, 1, heads * dim, device=device)
    caches = {name: KVCache(capacity=2 * cached) for name in modules}
    with torch.no_grad():
        for name, module in modules.items():
            module(x, x, x, is_causal=True, kv_cache=caches[name])
        keys, positions = caches["dynamic"].key, caches["dynamic"].positions
        cos, sin = modules["dynamic"].rotary.tables(2 * cached, device)
        medians = bench.time_round_robin({
            "clone": keys.clone,
            "rotate cached keys": lambda: apply_rope(keys, cos, sin, layout="interleaved",
                                                     positions=positions),
            "decode step, plain RoPE": lambda: modules["plain"](
                token, token, token, kv_cache=caches["plain"]),
            "decode step, dynamic NTK": lambda: modules["dynamic"](
                token, token, token, kv_cache=caches["dynamic"]),
        }, device, repeats=repeats)
    print_table(f"decode step past the frequency switch, B={batch} H={heads} H_kv={kv_heads} "
                f"d={dim}, {cached}+ cached tokens, {device} (clone: the cached keys)",
                medians, bench.bytes_moved(keys))
    ratio = medians["decode step, dynamic NTK"] / medians["decode step, plain RoPE"]
    print(f"  decode step dynamic NTK / plain RoPE = {ratio:.2f} (cache lengths grow by one "
          f"per call: {caches['plain'].length} and {caches['dynamic'].length} at the end)")


def linear_attention_scaling(device: torch.device, repeats: int, lengths) -> None:
    batch, heads, dim = 2, 8, 64
    for causal in (False, True):
        medians = []
        for n in lengths:
            q, k, v = (torch.randn(batch, heads, n, dim, device=device) for _ in range(3))
            with torch.no_grad():
                m = bench.time_round_robin(
                    {"linear": lambda q=q, k=k, v=v, c=causal: linear_attention(q, k, v, causal=c)},
                    device, repeats=repeats)
            medians.append(m["linear"])
        exponent, _ = fit_power_law(lengths, medians)
        times = ", ".join(f"N={n}: {t * 1e3:.1f} ms" for n, t in zip(lengths, medians, strict=True))
        print(f"\nlinear attention ({'causal' if causal else 'non-causal'}), {device}: {times}")
        print(f"  fitted time exponent in N: {exponent:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shape, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile'd peers")
    parser.add_argument("--only-mrope", action="store_true",
                        help="only the M-RoPE tables (Qwen2-VL's multi-axis RoPE)")
    parser.add_argument("--table", help="time only this table (KIND:SHAPE:DTYPE:LAYOUT), in "
                                        "this process; what every table's fresh process runs")
    args = parser.parse_args()
    if args.device == "cuda":  # the GPU tables: ropelib's Triton kernel and its peers
        gpu = Path(__file__).with_name("bench_gpu.py")
        raise SystemExit(subprocess.run([sys.executable, str(gpu)], check=False).returncode)
    repeats = args.repeats or (7 if args.quick else 21)
    if args.table:
        one_table(args.table, torch.device(args.device), repeats, not args.no_compile)
        return
    devices = [torch.device("cpu")] if args.device in ("cpu", "all") else []
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    shapes = SHAPES[1:] if args.quick else SHAPES
    lengths = (1024, 2048, 4096) if args.quick else (1024, 2048, 4096, 8192, 16384)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    status = native_status()
    print(f"ropelib on the CPU: {status.path} path ({status.reason})")
    for device in devices:
        rope_tables(device, shapes, repeats, not args.no_compile, args.only_mrope)
        if args.only_mrope:
            continue
        attention_table(device, repeats)
        rows_table(device, repeats)
        decode_table(device, repeats)
        linear_attention_scaling(device, max(3, repeats // 3), lengths)


if __name__ == "__main__":
    main()
