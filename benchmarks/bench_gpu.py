"""RoPE speed on a GPU: ropelib's Triton kernel against copies and the formulations of peers.

    python benchmarks/bench_rope.py --device cuda      # every table below
    python benchmarks/bench_gpu.py --sweep             # also the kernel's tile shapes

Every time is the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between
runs) and every ratio is to a baseline timed in the same process: ``copy_`` of the same bytes
into a preallocated buffer (for q and k, copying both; for forward + backward, two copies).
Peers: Hugging Face's eager formulas (``rotate_half``, GPT-J's stack, Qwen2-VL's M-RoPE),
the same under ``torch.compile``, and flash-attn's Triton ``apply_rotary`` and Liger's
kernels when they are importable (neither is a dependency). The decode table times one step
of 64 sequences at their own positions: wall time per eager call (Python included) and per
replay of a captured CUDA graph.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import time
import traceback

import torch
import triton
from triton.testing import do_bench

from ropelib import apply_rope, apply_rope_qk, backend_status, kernels, triton_rope
from ropelib.multiaxis import axis_of_pairs, mrope_positions
from ropelib.tables import generate_rope_embeddings

SHAPE = (4, 32, 4096, 128)
QK_HEADS = (32, 8)
MROPE_SHAPE = (1, 16, 4096, 128)
MROPE_SEGMENTS = [1000, (1, 64, 64), 50, (4, 32, 48), 486]
DECODE_ROWS = 64


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def table(title: str, times: dict[str, float], baseline: str, nbytes: int) -> None:
    print(f"\n{title}")
    print(f"{'formulation':<36}{'median us':>11}{'/ ' + baseline:>14}{'GB/s':>8}")
    base = times[baseline]
    for name, ms in times.items():
        if ms != ms:  # nan: the peer failed
            print(f"{name:<36}{'failed':>11}")
            continue
        print(f"{name:<36}{ms * 1e3:11.1f}{ms / base:14.2f}{nbytes / (ms * 1e-3) / 1e9:8.0f}")


def timed(cases: dict[str, object]) -> dict[str, float]:
    """Each case's median in ms; a case that raises prints why and reads as nan."""
    times = {}
    for name, fn in cases.items():
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = median_ms(fn)
        except Exception as error:  # a peer's failure is reported, not fatal
            print(f"  ({name} failed: {type(error).__name__}: {str(error)[:200]})")
            times[name] = float("nan")
    return times


def hf_rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def hf_apply(x, cos_full, sin_full):
    """Hugging Face Llama: x * cos + rotate_half(x) * sin with cat(freqs, freqs) tables."""
    return (x * cos_full + hf_rotate_half(x) * sin_full).to(x.dtype)


def gptj_apply(x, cos, sin):
    """GPT-J / RoFormer interleaved pairs: stack and flatten."""
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)


def optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:
        return None


FLASH_ROTARY = optional("flash_attn.ops.triton.rotary", "apply_rotary")
LIGER_ROPE = optional("liger_kernel.transformers.rope", "liger_rotary_pos_emb")
LIGER_MROPE = optional("liger_kernel.transformers.qwen2vl_mrope",
                       "liger_multimodal_rotary_pos_emb")


def single_tensor_tables(dtype: torch.dtype) -> None:
    b, h, s, d = SHAPE
    for storage in ("(B, H, S, D)", "(B, S, H, D)"):
        if storage == "(B, H, S, D)":
            x = torch.randn(SHAPE, device="cuda", dtype=dtype)
        else:
            x = torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2)
        for layout in ("half", "interleaved"):
            table(f"forward, {layout}, {dtype}, {tuple(x.shape)} stored as {storage}",
                  timed(forward_cases(x, layout)), "copy_", 2 * x.numel() * x.element_size())


def forward_cases(x: torch.Tensor, layout: str) -> dict[str, object]:
    s, d = x.shape[-2:]
    cos, sin = generate_rope_embeddings(s, d, device="cuda")
    cos_full, sin_full = (torch.cat((t, t), -1).to(x.dtype) for t in (cos, sin))
    buffer, work = torch.empty_like(x), x.clone()
    cases = {
        "copy_": lambda: buffer.copy_(x),
        "clone": lambda: x.clone(),
        "ropelib": lambda: apply_rope(x, cos, sin, layout=layout),
        "ropelib out=": lambda: apply_rope(x, cos, sin, layout=layout, out=buffer),
        "ropelib in place": lambda: apply_rope(work, cos, sin, layout=layout, out=work),
        "kernel alone (no Python checks)": lambda: triton_rope.run(
            [x], [buffer], cos, sin, layout, d, False, None, None,
            triton_rope.choose_config(1, 1, s, d, True)),
    }
    if layout == "half":
        compiled = torch.compile(hf_apply)
        cases["HF eager (rotate_half)"] = lambda: hf_apply(x, cos_full, sin_full)
        cases["HF compiled"] = lambda: compiled(x, cos_full, sin_full)
    else:
        compiled = torch.compile(gptj_apply)
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
    q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
    k = torch.randn(b, hk, s, d, device="cuda", dtype=dtype)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    cos, sin = generate_rope_embeddings(s, d, device="cuda")
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))
    compiled = torch.compile(lambda q, k: (hf_apply(q, cos_full, sin_full),
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


def mrope_table() -> None:
    """Qwen2-VL's M-RoPE on q (16 heads) and k (2 heads) of a mixed text/image/video
    sequence, every token at its (t, h, w) position."""
    dtype = torch.bfloat16
    b, h, s, d = MROPE_SHAPE
    sections = [16, 24, 24]
    positions = mrope_positions(MROPE_SEGMENTS, spatial_merge_size=2).cuda()
    assert positions.shape[0] == s
    q = torch.randn(MROPE_SHAPE, device="cuda", dtype=dtype)
    k = torch.randn(b, 2, s, d, device="cuda", dtype=dtype)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    axes = axis_of_pairs(d, sections).cuda()
    cos, sin = generate_rope_embeddings(int(positions.max()) + 1, d, base=1e6, device="cuda")
    inv_freq = 1e6 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d)
    freqs = positions.T.float()[:, None, :, None] * inv_freq  # (3, 1, S, d/2)
    cos3, sin3 = (torch.cat((f, f), -1).to(dtype) for f in (freqs.cos(), freqs.sin()))

    def hf_mrope():
        """Qwen2-VL's eager path: the sections of each axis's tables, then rotate_half."""
        full_cos = torch.cat([c[i % 3] for i, c in enumerate(cos3.split(sections * 2, -1))], -1)
        full_sin = torch.cat([c[i % 3] for i, c in enumerate(sin3.split(sections * 2, -1))], -1)
        return (hf_apply(q, full_cos[:, None], full_sin[:, None]),
                hf_apply(k, full_cos[:, None], full_sin[:, None]))

    def copies():
        q_buf.copy_(q)
        k_buf.copy_(k)

    cases = {
        "copy_ both": copies,
        "ropelib apply_rope_qk M-RoPE": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=positions, axes=axes),
        "ropelib M-RoPE out=": lambda: apply_rope_qk(
            q, k, cos, sin, layout="half", positions=positions, axes=axes, out=(q_buf, k_buf)),
        "HF eager M-RoPE": hf_mrope,
    }
    if LIGER_MROPE is not None:
        cases["Liger M-RoPE"] = lambda: LIGER_MROPE(q, k, cos3, sin3, sections)
    table(f"M-RoPE (Qwen2-VL sections 16/24/24, positions of a mixed sequence), half, {dtype}, "
          f"q {MROPE_SHAPE}, k 2 heads", timed(cases), "copy_ both",
          2 * (q.numel() + k.numel()) * q.element_size())


def backward_table() -> None:
    dtype = torch.bfloat16
    s, d = SHAPE[2], SHAPE[3]
    x = torch.randn(SHAPE, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(SHAPE, device="cuda", dtype=dtype)
    buffer = torch.empty_like(grad)
    cos, sin = generate_rope_embeddings(s, d, device="cuda")
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))
    compiled = torch.compile(hf_apply)

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
        "ropelib": step(lambda: apply_rope(x, cos, sin, layout="half")),
        "HF eager": step(lambda: hf_apply(x, cos_full, sin_full)),
        "HF compiled": step(lambda: compiled(x, cos_full, sin_full)),
    }
    table(f"forward + backward, half, {dtype}, {SHAPE}", timed(cases), "two copy_",
          4 * grad.numel() * grad.element_size())


def decode_table() -> None:
    """One decode step: q (64, 32, 1, 128) and k (64, 8, 1, 128), each row at its own
    position; eager wall time per call and replay time in a CUDA graph."""
    dtype = torch.bfloat16
    hq, hk = QK_HEADS
    d = SHAPE[3]
    q = torch.randn(DECODE_ROWS, hq, 1, d, device="cuda", dtype=dtype)
    k = torch.randn(DECODE_ROWS, hk, 1, d, device="cuda", dtype=dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    positions = torch.randint(0, 8192, (DECODE_ROWS, 1), device="cuda")
    cos, sin = generate_rope_embeddings(8192, d, device="cuda")
    cos_full, sin_full = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))

    def ropelib_step():
        apply_rope_qk(q, k, cos, sin, layout="half", positions=positions, out=(q_out, k_out))

    def kernel_step():  # the operator, rows gathered by indexing: what a graph can hold today
        rows = (cos[positions][:, None], sin[positions][:, None])
        kernels.rotate_qk_out(q, k, *rows, "half", d, q_out, k_out)

    def hf_step():
        c, s = cos_full[positions][:, None], sin_full[positions][:, None]
        return hf_apply(q, c, s), hf_apply(k, c, s)

    cases = {"ropelib apply_rope_qk": ropelib_step, "ropelib operator": kernel_step,
             "HF eager": hf_step}
    if LIGER_ROPE is not None:
        cases["Liger rope"] = lambda: LIGER_ROPE(q, k, cos_full[positions], sin_full[positions])
    print(f"\ndecode step, {DECODE_ROWS} rows at their own positions, q {hq} heads, k {hk}, "
          f"half, {dtype}")
    print(f"{'formulation':<36}{'eager us/call':>15}{'graph replay us':>17}")
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) / 200 * 1e6)
        replay = "capture failed"
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                fn()
            replay = f"{median_ms(graph.replay) * 1e3:17.2f}"
        except Exception as error:
            replay = f"  capture failed: {type(error).__name__}: {str(error)[:80]}"
            torch.cuda.synchronize()
        print(f"{name:<36}{statistics.median(samples):15.1f}{replay}")


def module_decode_table() -> None:
    """One decode step of the attention module (width 4096, GQA 32/8, bf16) for 64 rows at
    their own positions, over a KVCache of 4096 slots (``cache_position``): eager wall time
    per step, and replay time of the step captured in a CUDA graph."""
    from ropelib import KVCache, StandardAttentionWithRoPE

    dtype, width, rows, capacity = torch.bfloat16, 4096, DECODE_ROWS, 4096
    attn = StandardAttentionWithRoPE(width, 32, num_kv_heads=8, bias=False, layout="half",
                                     device="cuda", dtype=dtype).eval()
    results = {}
    for rope in (True, False):
        module = attn if rope else StandardAttentionWithRoPE(
            width, 32, num_kv_heads=8, bias=False, layout="half", rope=False, device="cuda",
            dtype=dtype).eval()
        cache = KVCache(capacity=capacity)
        x = torch.randn(rows, 1, width, device="cuda", dtype=dtype)
        positions = torch.randint(0, capacity, (rows, 1), device="cuda")
        slot = torch.tensor(capacity // 2, device="cuda")

        def step(module=module, cache=cache, x=x, positions=positions, slot=slot):
            return module(x, x, x, kv_cache=cache, positions=positions, cache_position=slot)

        with torch.no_grad():
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(100):
                step()
            torch.cuda.synchronize()
            eager = (time.perf_counter() - start) / 100 * 1e6
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            replay = median_ms(graph.replay) * 1e3
        results["with RoPE" if rope else "without RoPE"] = (eager, replay)
    print(f"\nattention module decode step, {rows} rows, width {width}, GQA 32/8, {dtype}, "
          f"cache of {capacity} slots (cache_position)")
    print(f"{'module':<36}{'eager us/step':>15}{'graph replay us':>17}")
    for name, (eager, replay) in results.items():
        print(f"{name:<36}{eager:15.1f}{replay:17.1f}")


def attention_table() -> None:
    """The attention layer forward (4096 wide, GQA 32/8, causal, 4096 tokens, bf16, no
    grad): ropelib's module with and without RoPE on the same weights, compiled, and Hugging
    Face's LlamaAttention (SDPA). RoPE's share: (with - without) / without."""
    from ropelib import StandardAttentionWithRoPE

    dtype, width, tokens = torch.bfloat16, 4096, 4096
    kw = {"num_kv_heads": 8, "bias": False, "layout": "half", "device": "cuda", "dtype": dtype}
    with_rope = StandardAttentionWithRoPE(width, 32, **kw).eval()
    without = StandardAttentionWithRoPE(width, 32, rope=False, **kw).eval()
    without.load_state_dict(with_rope.state_dict(), strict=False)
    compiled = torch.compile(with_rope, fullgraph=True)
    x = torch.randn(1, tokens, width, device="cuda", dtype=dtype)
    cases = {
        "module, RoPE": lambda: with_rope(x, x, x, is_causal=True),
        "module, no RoPE": lambda: without(x, x, x, is_causal=True),
        "module compiled, RoPE": lambda: compiled(x, x, x, is_causal=True),
    }
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        config = LlamaConfig(hidden_size=width, num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=tokens)
        config._attn_implementation = "sdpa"
        hf = LlamaAttention(config, 0).to("cuda", dtype).eval()
        rotary = LlamaRotaryEmbedding(config).to("cuda")
        position_ids = torch.arange(tokens, device="cuda")[None]

        def hf_layer():
            return hf(x, rotary(x, position_ids), attention_mask=None, is_causal=True)

        cases["HF LlamaAttention (SDPA), RoPE"] = hf_layer
    except Exception as error:
        print(f"  (HF LlamaAttention not built: {type(error).__name__}: {error})")
    with torch.no_grad():
        times = timed(cases)
    table(f"attention layer forward, width {width}, GQA 32/8, causal, {tokens} tokens, {dtype}",
          times, "module, no RoPE", 4 * x.numel() * x.element_size())
    share = (times["module, RoPE"] - times["module, no RoPE"]) / times["module, no RoPE"]
    print(f"  RoPE's share of the module's forward: {share:.1%}")


def sweep() -> None:
    """The kernel's tile shapes at the single-tensor shape: tokens per program, heads per
    program and warps, for both layouts and dtypes (ratios to copy_ in the same run)."""
    b, h, s, d = SHAPE
    cos, sin = generate_rope_embeddings(s, d, device="cuda")
    print("\nsweep: (block_s, heads_per_program, num_warps) -> / copy_, x (4, 32, 4096, 128)")
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(SHAPE, device="cuda", dtype=dtype)
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
            print(f"  {dtype} {layout}: default {tuple(default)} {chosen:.2f}; best {best}")


def time_config(x, buffer, cos, sin, layout: str, config) -> float:
    def run():
        triton_rope.run([x], [buffer], cos, sin, layout, x.shape[-1], False, None, None, config)

    run()
    return median_ms(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time the kernel's tiles")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; ropelib on cuda: {backend_status('cuda')}")
    print(f"flash-attn rotary: {'yes' if FLASH_ROTARY else 'not installed'}; Liger: "
          f"{'yes' if LIGER_ROPE else 'not installed'}")
    steps = [functools.partial(single_tensor_tables, torch.bfloat16),
             functools.partial(single_tensor_tables, torch.float32),
             functools.partial(qk_table, torch.bfloat16), mrope_table, backward_table,
             decode_table, module_decode_table, attention_table] + (
                 [sweep] if args.sweep else [])
    for step in steps:
        try:
            step()
        except Exception:  # one table's failure must not hide the others
            traceback.print_exc()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
