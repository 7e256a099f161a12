"""Issue 44 item 3 probe: does ropelib's contiguous (B, H, S, D) q and k cost the attention layer
a copy? The layer with RoPE as it is, without RoPE, and with the rotation writing into
empty_like(q) (q's (B, S, H, D) memory layout kept), eager and compiled: do_bench times (3 runs)
and the kernels of one call (torch.profiler). Needs a GPU:
    PYTHONPATH=$PWD python benchmarks/layout_probe.py
"""
import torch
import triton
from torch.profiler import ProfilerActivity, profile

import ropelib.attention as A
from ropelib import StandardAttentionWithRoPE

dev, dt, W, H = "cuda", torch.bfloat16, 4096, 32
kw = dict(num_kv_heads=8, bias=False, layout="half", device=dev, dtype=dt)
m = StandardAttentionWithRoPE(W, H, **kw).eval()
m0 = StandardAttentionWithRoPE(W, H, rope=False, **kw).eval()
m0.load_state_dict(m.state_dict(), strict=False)
x = torch.randn(1, 4096, W, device=dev, dtype=dt)
orig = A.apply_rope_qk


def keep(q, k, cos, sin, **kw):
    if kw.get("out") is None and not kw.get("inplace"):
        kw["out"] = (torch.empty_like(q), torch.empty_like(k))
    return orig(q, k, cos, sin, **kw)


def kernels(fn):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    ev.sort(key=lambda e: e.device_time_total, reverse=True)
    return [(round(e.device_time_total / 5, 1), e.count // 5, e.key[:50]) for e in ev]


def show(name, fn):
    times = [triton.testing.do_bench(fn) * 1e3 for _ in range(3)]
    print(f"{name}: {', '.join(f'{t:.1f}' for t in times)} us")
    for row in kernels(fn):
        print("    ", row)


with torch.no_grad():
    def rope():
        return m(x, x, x, is_causal=True)

    def none():
        return m0(x, x, x, is_causal=True)

    base = rope()
    show("eager, RoPE (contiguous q, k)", rope)
    show("eager, no RoPE", none)
    A.apply_rope_qk = keep
    kept = rope()
    print("kept layout equals:", torch.equal(kept, base))
    show("eager, RoPE keeping q's layout", rope)
    for label, patched in (("contiguous", orig), ("keeping layout", keep)):
        A.apply_rope_qk = patched
        torch._dynamo.reset()
        try:
            c = torch.compile(m, fullgraph=True)
            c(x, x, x, is_causal=True)
            show(f"compiled, RoPE {label}", lambda c=c: c(x, x, x, is_causal=True))
        except Exception as error:
            print(f"compiled {label}: {type(error).__name__}: {str(error)[:300]}")
    A.apply_rope_qk = orig
    torch._dynamo.reset()
    c0 = torch.compile(m0, fullgraph=True)
    c0(x, x, x, is_causal=True)
    show("compiled, no RoPE", lambda: c0(x, x, x, is_causal=True))
