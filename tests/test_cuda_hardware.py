"""On a real GPU (skipped without one): what tests/test_one_launch.py and
tests/test_decode_fused.py check on the CPU through a stubbed launch and Triton's
interpreter, checked on the hardware (issue 44).

- A call with positions, a 0-d offset tensor or M-RoPE axes, and the fused decode step, each
  run exactly one kernel on the device and nothing else (no copy, no memset, no comparison),
  as torch.profiler's CUDA activity records them; the backward is one kernel too.
- The range checks compiled into the kernel (``tl.device_assert``) stop a bad call with a
  message naming what was wrong. A failed device assertion leaves the CUDA context unusable,
  so each bad call runs in a child process whose error output is read.
- The decode step replays from a CUDA graph with new positions and cache slots, equal to the
  eager call and to float64.
"""

from __future__ import annotations

import pytest
import torch
from reference import device_side_error

from ropelib import apply_rope, apply_rope_qk, apply_rope_qk_to_cache, backend_status
from ropelib.tables import generate_rope_embeddings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = "cuda"


def device_work(call) -> list[str]:
    """The names of the kernels, copies and memsets one call runs on the GPU (after a first
    call that compiles the kernel and prepares the launch)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as recorded:
        call()
        torch.cuda.synchronize()
    return [event.name for event in recorded.events()
            if event.device_type == torch.autograd.DeviceType.CUDA]


def decode_inputs(dtype=torch.bfloat16):
    cos, sin = generate_rope_embeddings(4096, 128, device=CUDA)
    q = torch.randn(64, 32, 1, 128, device=CUDA, dtype=dtype)
    k = torch.randn(64, 8, 1, 128, device=CUDA, dtype=dtype)
    positions = torch.randint(0, 4096, (64, 1), device=CUDA)
    return q, k, cos, sin, positions


def test_the_backend_on_a_gpu_is_the_triton_kernel():
    assert backend_status(CUDA).backend == "triton", backend_status(CUDA)


@pytest.mark.parametrize("name", ["qk positions", "qk in place", "offset tensor",
                                  "M-RoPE axes", "fused decode step", "strided view"])
def test_a_call_runs_one_kernel_and_nothing_else(name):
    q, k, cos, sin, positions = decode_inputs()
    axes = torch.arange(64, device=CUDA) % 3
    mrope = torch.randint(0, 4096, (64, 1, 3), device=CUDA)
    key_cache = torch.zeros(64, 8, 256, 128, device=CUDA, dtype=q.dtype)
    value_cache = torch.zeros_like(key_cache)
    slot = torch.tensor(7, device=CUDA)
    x = torch.randn(2, 512, 32, 128, device=CUDA, dtype=q.dtype).transpose(1, 2)
    calls = {
        "qk positions": lambda: apply_rope_qk(q, k, cos, sin, layout="half",
                                              positions=positions),
        "qk in place": lambda: apply_rope_qk(q, k, cos, sin, positions=positions,
                                             inplace=True),
        "offset tensor": lambda: apply_rope(q, cos, sin, offset=slot),
        "M-RoPE axes": lambda: apply_rope_qk(q, k, cos, sin, layout="half", positions=mrope,
                                             axes=axes),
        "fused decode step": lambda: apply_rope_qk_to_cache(
            q, k, k, cos, sin, key_cache, value_cache, slot, layout="half",
            positions=positions),
        "strided view": lambda: apply_rope(x, cos, sin, layout="half"),
    }
    work = device_work(calls[name])
    assert len(work) == 1 and "rope" in work[0], work


@pytest.mark.parametrize("name", ["qk positions out=", "qk positions", "qk in place",
                                  "offset tensor", "M-RoPE axes", "fused decode step",
                                  "strided view"])
def test_a_prepared_launch_equals_the_first_one(name):
    """A call of a signature seen before goes straight to the compiled kernel's prepared
    launcher: with new tensors of the same shapes, its results and the caches it writes
    equal, bit for bit, those of a call through Triton's JIT on copies of the same inputs
    (itself checked against float64 elsewhere)."""
    from ropelib import triton_rope

    def inputs(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        q, k, cos, sin, positions = decode_inputs()
        return {"q": q, "k": k, "v": torch.randn_like(k), "cos": cos, "sin": sin,
                "positions": positions, "q_out": torch.zeros_like(q),
                "k_out": torch.zeros_like(k), "slot": torch.tensor(7, device=CUDA),
                "axes": torch.arange(64, device=CUDA) % 3,
                "mrope": torch.randint(0, 4096, (64, 1, 3), device=CUDA),
                "keys": torch.zeros(64, 8, 256, 128, device=CUDA, dtype=q.dtype),
                "values": torch.zeros(64, 8, 256, 128, device=CUDA, dtype=q.dtype),
                "x": torch.randn(2, 512, 32, 128, device=CUDA,
                                 dtype=q.dtype).transpose(1, 2)}

    call = {
        "qk positions out=": lambda t: apply_rope_qk(
            t["q"], t["k"], t["cos"], t["sin"], layout="half", positions=t["positions"],
            out=(t["q_out"], t["k_out"])),
        "qk positions": lambda t: apply_rope_qk(t["q"], t["k"], t["cos"], t["sin"],
                                                positions=t["positions"]),
        "qk in place": lambda t: apply_rope_qk(t["q"], t["k"], t["cos"], t["sin"],
                                               positions=t["positions"], inplace=True),
        "offset tensor": lambda t: apply_rope(t["q"], t["cos"], t["sin"], offset=t["slot"]),
        "M-RoPE axes": lambda t: apply_rope_qk(t["q"], t["k"], t["cos"], t["sin"],
                                               layout="half", positions=t["mrope"],
                                               axes=t["axes"]),
        "fused decode step": lambda t: apply_rope_qk_to_cache(
            t["q"], t["k"], t["v"], t["cos"], t["sin"], t["keys"], t["values"], t["slot"],
            layout="half", positions=t["positions"]),
        "strided view": lambda t: apply_rope(t["x"], t["cos"], t["sin"], layout="half"),
    }[name]
    call(inputs(0))  # compiles the kernel and prepares the launch
    tensors = inputs(1)
    copies = {n: t.clone() for n, t in tensors.items()}
    got = call(tensors)
    triton_rope._launchers.clear()
    expected = call(copies)
    got, expected = ((r,) if isinstance(r, torch.Tensor) else r for r in (got, expected))
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    for n in tensors:
        assert torch.equal(tensors[n], copies[n]), n


def test_a_bshd_view_keeps_its_layout_and_attention_copies_nothing():
    """On a GPU a new output takes x's layout: q and k of a (B, S, H, D) projection stay
    so, and the attention module's forward with RoPE runs the kernels of the one without
    RoPE and one rotation (no copy of q, k or of the attention's output)."""
    from ropelib import StandardAttentionWithRoPE

    x = torch.randn(2, 64, 8, 128, device=CUDA, dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = generate_rope_embeddings(64, 128, device=CUDA)
    assert apply_rope(x, cos, sin).stride() == x.stride()
    kw = {"num_kv_heads": 2, "bias": False, "layout": "half", "device": CUDA,
          "dtype": torch.bfloat16}
    with_rope = StandardAttentionWithRoPE(1024, 8, **kw).eval()
    without = StandardAttentionWithRoPE(1024, 8, rope=False, **kw).eval()
    h = torch.randn(1, 256, 1024, device=CUDA, dtype=torch.bfloat16)
    with torch.no_grad():
        rotated = device_work(lambda: with_rope(h, h, h, is_causal=True))
        plain = device_work(lambda: without(h, h, h, is_causal=True))
    assert sum("rope" in name for name in rotated) == 1, rotated
    assert sorted(name for name in rotated if "rope" not in name) == sorted(plain), rotated


@pytest.mark.parametrize("rotate", ["apply_rope", "apply_rope_qk at positions"])
def test_a_training_step_is_one_kernel_each_way(rotate):
    """Forward and backward of a training step each run one kernel: for q and k at each
    row's positions too (their range checked inside both launches)."""
    xs = [torch.randn(4, 32, 512, 128, device=CUDA, dtype=torch.bfloat16,
                      requires_grad=True)]
    cos, sin = generate_rope_embeddings(512, 128, device=CUDA)
    if rotate == "apply_rope":
        def forward() -> tuple[torch.Tensor, ...]:
            return (apply_rope(xs[0], cos, sin, layout="half"),)
    else:
        xs.append(torch.randn(4, 8, 512, 128, device=CUDA, dtype=torch.bfloat16,
                              requires_grad=True))
        positions = torch.randint(0, 512, (4, 512), device=CUDA)

        def forward() -> tuple[torch.Tensor, ...]:
            return apply_rope_qk(*xs, cos, sin, layout="half", positions=positions)
    grads = [torch.randn_like(x) for x in xs]
    outputs = forward()
    for work in (device_work(forward), device_work(
            lambda: torch.autograd.grad(outputs, xs, grads, retain_graph=True))):
        assert len(work) == 1 and "rope" in work[0], work


@pytest.mark.parametrize(("call", "message"), [
    ("apply_rope(x, cos, sin, offset=torch.tensor(8, device='cuda'))",
     "offset + row must be >= 0 and < the cos/sin table length"),
    ("apply_rope(x, cos, sin, positions=torch.zeros(5, 2, dtype=torch.long, device='cuda'),"
     " axes=torch.tensor([0, 1, 2, 0, 1, 0, 1, 0], device='cuda'))",
     "axes must be in [0, k)"),
    ("apply_rope_qk_to_cache(x, x, x, cos, sin, cache, cache.clone(),"
     " torch.tensor(4, device='cuda'))",
     "cache_position + row must be in"),
], ids=["offset past the table", "axis", "slot past the capacity"])
def test_a_bad_coordinate_stops_at_the_next_synchronization(call, message):
    """The kernel's own range checks (a bad position: tests/test_triton.py)."""
    stderr = device_side_error(
        "from ropelib import apply_rope, apply_rope_qk_to_cache\n"
        "from ropelib.tables import generate_rope_embeddings\n"
        "cos, sin = generate_rope_embeddings(12, 16, device='cuda')\n"
        "x = torch.randn(2, 4, 5, 16, device='cuda')\n"
        "cache = torch.zeros(2, 4, 8, 16, device='cuda')\n"
        f"{call}")
    assert "ropelib: " + message in stderr, stderr[-2000:]


def rotated_half(x: torch.Tensor, cos_row: torch.Tensor, sin_row: torch.Tensor
                 ) -> torch.Tensor:
    """The half layout's rotation in float64 with given table rows: pairs (i, i + d/2)."""
    x, c, s = x.double().cpu(), cos_row.double().cpu(), sin_row.double().cpu()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def test_the_decode_step_replays_from_a_cuda_graph():
    q, k, cos, sin, positions = decode_inputs(torch.float32)
    v = torch.randn_like(k)
    key_cache = torch.zeros(64, 8, 256, 128, device=CUDA)
    value_cache = torch.zeros_like(key_cache)
    slot = torch.tensor(0, device=CUDA)

    def step():
        return apply_rope_qk_to_cache(q, k, v, cos, sin, key_cache, value_cache, slot,
                                      layout="half", positions=positions)

    step()  # compiled and prepared before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out = step()
    for position, cache_slot in ((5, 3), (4095, 255)):
        positions.fill_(position)
        slot.fill_(cache_slot)
        graph.replay()
        torch.cuda.synchronize()
        eager_q = apply_rope(q, cos, sin, layout="half", positions=positions)
        torch.testing.assert_close(q_out, eager_q, rtol=0, atol=0)
        c, s = cos[position], sin[position]
        torch.testing.assert_close(q_out.double().cpu(), rotated_half(q, c, s),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(key_cache[:, :, cache_slot].double().cpu(),
                                   rotated_half(k[:, :, 0], c, s), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value_cache[:, :, cache_slot], v[:, :, 0])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_gpu_than_the_current_one_rotate_there():
    """A model split over GPUs calls with tensors on a device that is not the current one:
    the kernel runs on theirs (the whole path, its prepared launch and a replay), equal to
    the same call on the current device, and the current device stays what it was."""
    torch.cuda.set_device(0)
    q, k, cos, sin, positions = decode_inputs(torch.float32)
    expected = apply_rope_qk(q, k, cos, sin, layout="half", positions=positions)
    moved = [t.to("cuda:1") for t in (q, k, cos, sin, positions)]
    for _ in range(3):  # the JIT launch, the prepared launch, a replay
        got = apply_rope_qk(*moved[:4], layout="half", positions=moved[4])
        assert torch.cuda.current_device() == 0
        for result, want in zip(got, expected, strict=True):
            assert result.device == torch.device("cuda:1")
            torch.testing.assert_close(result.cpu(), want.cpu(), rtol=0, atol=0)
