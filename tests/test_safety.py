"""ropelib is safe by construction (issue 13): one test per row of the issue's table, plus
the operator registration behind them.

Each test reproduces what a hostile review found and asserts the correct behaviour against
an independent reference (float64 rotation pair by pair, tests/reference.py), or against
PyTorch's own result for the same call on fresh tensors. A reproducer that used to crash the
interpreter (rows 1 and 2) runs in a subprocess, so a crash fails the test instead of the run.
Rows 1, 2, 4, 5 and 15 are about the CPU: the compiled loop's storage, threads and converted
tables, pickling; the other rows' computations run on every device.
"""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
import torch
from reference import angles, rope_by_pairs, thetas

from ropelib import StandardAttentionWithRoPE, apply_rope, generate_rope_embeddings

F64 = torch.float64
LAYOUTS = ["interleaved", "half"]


def expected(x: torch.Tensor, positions, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """The float64 rotation of x by the angles of ``positions`` (RoFormer eq. 34), on the
    CPU."""
    return rope_by_pairs(x.cpu(), angles(torch.as_tensor(positions).cpu(), thetas(dim)), layout)


def close(result: torch.Tensor, reference: torch.Tensor, tol: float = 1e-6) -> None:
    torch.testing.assert_close(result.cpu().to(F64), reference.cpu().to(F64), rtol=tol,
                               atol=tol)


def run_isolated(code: str, timeout: float = 240) -> None:
    """Run ``code`` in a fresh interpreter (this ropelib); fail on any non-zero exit, a crash
    (segfault) included, and show what it printed."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=timeout, env=os.environ.copy())
    assert result.returncode == 0, (
        f"exit status {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")


# Row 1 ---------------------------------------------------------------------------------------

def test_row01_storage_replaced_without_a_version_bump():
    """share_memory_(), ``.data =`` and ``Module.double()`` on a frozen Parameter table replace
    the tables' storage without bumping their version; the next call must read the new
    storage (it used to read freed memory: a segfault with a large table)."""
    run_isolated("""
        import torch
        from ropelib import apply_rope, generate_rope_embeddings
        torch.manual_seed(0)
        cos, sin = generate_rope_embeddings(400_000, 128)
        x = torch.randn(1, 4, 64, 128)
        first = apply_rope(x, cos, sin, offset=300_000)
        apply_rope(x, cos, sin, offset=300_000)
        cos.share_memory_(); sin.share_memory_()
        assert torch.equal(apply_rope(x, cos, sin, offset=300_000), first)
        cos.data = cos.data * 0.5
        assert torch.equal(apply_rope(x, cos, sin, offset=300_000),
                           apply_rope(x, cos.clone(), sin.clone(), offset=300_000))
        table = torch.nn.Module()
        c, s = generate_rope_embeddings(400_000, 128)
        table.cos = torch.nn.Parameter(c, requires_grad=False)
        table.sin = torch.nn.Parameter(s, requires_grad=False)
        before = apply_rope(x.double(), table.cos, table.sin, offset=300_000)
        apply_rope(x.double(), table.cos, table.sin, offset=300_000)
        table.double()
        after = apply_rope(x.double(), table.cos, table.sin, offset=300_000)
        assert table.cos.dtype == torch.float64 and torch.equal(after, before)
        table.share_memory()
        assert torch.equal(apply_rope(x.double(), table.cos, table.sin, offset=300_000), before)
    """)


# Row 2 ---------------------------------------------------------------------------------------

def test_row02_two_threads_one_table():
    """Thread A rotates with float64 tables in a loop while thread B calls with the same cos
    and another sin, then the same pair, and modifies cos in place with a no-op: every result
    of both threads is right (B's calls used to free the float32 copies A's kernel read)."""
    run_isolated("""
        import threading, time
        import torch
        from ropelib import apply_rope, generate_rope_embeddings
        torch.manual_seed(0)
        cos, sin = generate_rope_embeddings(200_000, 64, dtype=torch.float64)
        sin2 = sin.clone()
        x = torch.randn(2, 8, 256, 64)
        xs = torch.randn(1, 8, 16, 64)
        want_a = {o: apply_rope(x, cos.clone(), sin.clone(), offset=o)
                  for o in (0, 50_000, 150_000)}
        want_b = apply_rope(xs, cos.clone(), sin.clone())
        errors, stop = [], time.monotonic() + 4.0

        def a():
            while time.monotonic() < stop and not errors:
                for o, want in want_a.items():
                    if not torch.equal(apply_rope(x, cos, sin, offset=o), want):
                        errors.append(f"thread A wrong at offset {o}")

        def b():
            while time.monotonic() < stop and not errors:
                if not torch.equal(apply_rope(xs, cos, sin2), want_b):
                    errors.append("thread B wrong with sin2")
                if not torch.equal(apply_rope(xs, cos, sin), want_b):
                    errors.append("thread B wrong")
                cos.add_(0.0)

        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
    """)


# Row 3 ---------------------------------------------------------------------------------------

def test_row03_inference_mode_and_cache_growth_under_it(device):
    """Inference tensors have no version counter: a call must not need one. KV-cache decoding
    under inference_mode past the initial cache (its first growth) works, and the module
    still runs in no_grad and trains afterwards."""
    with torch.inference_mode():
        cos, sin = generate_rope_embeddings(64, 8, device=device)
        x = torch.randn(16, 8).to(device)
        close(apply_rope(x, cos, sin), expected(x, range(16), 8))
        close(apply_rope(x, cos, sin, layout="half", offset=3),
              expected(x, range(3, 19), 8, "half"))
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(16, 2, max_position_embeddings=8).to(device)
    tokens = torch.randn(1, 12, 16).to(device)
    with torch.no_grad():
        full = module(tokens, tokens, tokens, is_causal=True)
    with torch.inference_mode():
        module.rotary.tables(0)  # the cache as built, 8 positions: decoding grows it
        from ropelib import KVCache
        cache = KVCache()
        steps = [module(tokens[:, i:i + 1], tokens[:, i:i + 1], tokens[:, i:i + 1],
                        kv_cache=cache) for i in range(12)]
    close(torch.cat(steps, 1), full, 1e-5)
    with torch.no_grad():
        close(module(tokens, tokens, tokens, is_causal=True), full, 1e-6)
    out = module(tokens, tokens, tokens, is_causal=True)
    out.square().sum().backward()
    assert module.q_proj.weight.grad is not None
    assert module.q_proj.weight.grad.abs().sum() > 0


# Row 4 ---------------------------------------------------------------------------------------

def test_row04_deepcopy_pickle_and_save_after_a_forward():
    """EMA copies and checkpoints: after a forward pass the module and the tables it used
    deep-copy, pickle and torch.save, and the copies compute the same output."""
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(64, 4)
    q = torch.randn(2, 5, 64)
    out = module(q, q, q)
    cos, sin = generate_rope_embeddings(32, 16)
    apply_rope(torch.randn(2, 4, 16), cos, sin)
    copies = [copy.deepcopy(module), pickle.loads(pickle.dumps(module))]
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    copies.append(torch.load(buffer, weights_only=False))
    for clone in copies:
        torch.testing.assert_close(clone(q, q, q), out, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save((cos, sin), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert torch.equal(loaded[0], cos) and torch.equal(loaded[1], sin)
    pickle.dumps((cos, sin))


# Row 5 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("write", ["data_mul", "numpy"])
def test_row05_writes_that_bypass_the_version_counter_are_seen(write):
    """cos.data.mul_() and writes through cos.numpy() do not bump cos's version; with float64
    tables (converted for the compiled CPU loop) the next call must still use the new
    values."""
    cos, sin = generate_rope_embeddings(10, 8, dtype=F64)
    x = torch.randn(2, 10, 8)
    apply_rope(x, cos, sin)
    apply_rope(x, cos, sin)
    if write == "data_mul":
        cos.data.mul_(0.5)
    else:
        cos.numpy()[:] *= 0.5
    result = apply_rope(x, cos, sin)
    torch.testing.assert_close(result, apply_rope(x, cos.clone(), sin.clone()), rtol=0, atol=0)
    a, b = x[..., 0::2].to(F64), x[..., 1::2].to(F64)
    c, s = cos.to(F64), sin.to(F64)  # the halved cos: not a rotation any more, but the formula
    close(result[..., 0::2], a * c - b * s)
    close(result[..., 1::2], a * s + b * c)


# Row 6 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["to_empty", "assign"])
def test_row06_meta_construction_then_loading(how, device):
    """Build on the meta device, then ``to_empty()`` + ``load_state_dict`` or
    ``load_state_dict(assign=True)``: the rotary tables are rebuilt (not NaN, not on meta)
    and the module computes what the module it was loaded from computes."""
    torch.manual_seed(0)
    source = StandardAttentionWithRoPE(32, 4).to(device)
    q = torch.randn(2, 6, 32).to(device)
    with torch.device("meta"):
        module = StandardAttentionWithRoPE(32, 4)
    if how == "to_empty":
        module.to_empty(device=device).load_state_dict(source.state_dict())
    else:
        module.load_state_dict(source.state_dict(), assign=True)
    torch.testing.assert_close(module(q, q, q), source(q, q, q), rtol=0, atol=0)
    cos, sin = module.rotary.tables(6)
    assert cos.device == device
    close(cos[:6], angles(torch.arange(6), thetas(8)).cos())
    close(sin[:6], angles(torch.arange(6), thetas(8)).sin())


def test_row06_reset_parameters_rebuilds_the_tables(device):
    module = StandardAttentionWithRoPE(32, 4).to(device)
    module.rotary.cos_cached.fill_(float("nan"))
    module.rotary.reset_parameters()
    close(module.rotary.cos_cached[:10], angles(torch.arange(10), thetas(8)).cos())


# Row 7 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_row07_small_integer_positions_are_positions(dtype, device):
    """uint8 positions used to index as a boolean mask (silently wrong when seq equals the
    table length), int8/int16 failed; all are positions."""
    cos, sin = generate_rope_embeddings(64, 8, device=device)
    x = torch.randn(64, 8).to(device)
    positions = (torch.arange(64) * 7 % 64).to(dtype)
    positions[:5] = 1
    positions = positions.to(device)
    close(apply_rope(x, cos, sin, positions=positions), expected(x, positions.long(), 8))


# Row 8 is an error case: tests/test_errors.py, "out overlapping cos" and "out overlapping sin".

# Row 9 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_row09_half_precision_with_strided_channels(dtype, layout, device):
    """x whose last dim is not contiguous (a transpose), in bfloat16 and float16: rotated,
    within the dtype's rounding of the float64 result."""
    cos, sin = generate_rope_embeddings(16, 8, device=device)
    x = torch.randn(8, 16).t().to(device=device, dtype=dtype)
    assert x.stride(-1) != 1
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    close(apply_rope(x, cos, sin, layout=layout), expected(x, range(16), 8, layout), tol)


# Row 10 --------------------------------------------------------------------------------------

def test_row10_compile_fullgraph_without_graph_breaks(device):
    """torch.compile(fullgraph=True) of apply_rope (forward and backward, out of place and
    with positions) and of the attention module: one graph, the same numbers as eager."""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    cos, sin = generate_rope_embeddings(20, 8, device=device)
    x = torch.randn(2, 3, 16, 8).to(device)
    positions = torch.randint(0, 20, (16,)).to(device)

    def rope(x):
        return apply_rope(x, cos, sin, layout="half", offset=2)

    def rope_at(x):
        return apply_rope(x, cos, sin, positions=positions)

    for fn in (rope, rope_at):
        explained = dynamo.explain(fn)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, fn.__name__
    compiled = torch.compile(rope, fullgraph=True, backend="aot_eager")
    xg = x.clone().requires_grad_()
    result = compiled(xg)
    close(result, expected(x, range(2, 18), 8, "half"))
    result.square().sum().backward()
    close(xg.grad, 2 * x, 1e-5)  # |R x|^2 = |x|^2, so the gradient is 2x
    close(torch.compile(rope_at, fullgraph=True, backend="aot_eager")(x),
          expected(x, positions, 8))
    module = StandardAttentionWithRoPE(32, 4).to(device)
    q = torch.randn(2, 10, 32).to(device)
    explained = dynamo.explain(lambda q: module(q, q, q, is_causal=True))(q)
    assert explained.graph_break_count == 0
    compiled_module = torch.compile(module, fullgraph=True, backend="aot_eager")
    close(compiled_module(q, q, q, is_causal=True), module(q, q, q, is_causal=True), 1e-6)


def test_row10_inductor_compiles_apply_rope(device):
    cos, sin = generate_rope_embeddings(16, 8, device=device)
    x = torch.randn(2, 16, 8).to(device)
    compiled = torch.compile(lambda x: apply_rope(x, cos, sin) * 2, fullgraph=True)
    close(compiled(x), 2 * expected(x, range(16), 8))


def test_row10_export(device):
    """torch.export keeps the rotation as one ``ropelib.rotate`` node, and the exported
    program computes the rotation."""
    cos, sin = generate_rope_embeddings(16, 8, device=device)

    class Rope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos", cos)
            self.register_buffer("sin", sin)

        def forward(self, x):
            return apply_rope(x, self.cos, self.sin, layout="half")

    x = torch.randn(2, 16, 8).to(device)
    program = torch.export.export(Rope(), (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "ropelib.rotate.default" in targets
    close(program.module()(x), expected(x, range(16), 8, "half"))


# Row 11 --------------------------------------------------------------------------------------

def test_row11_torch_func_transforms(device):
    """grad, jacrev, vmap (over x, and over cos/sin) and jvp of apply_rope give the float64
    reference's values."""
    torch.manual_seed(0)
    cos, sin = generate_rope_embeddings(5, 8, device=device)
    x = torch.randn(2, 5, 8).to(device)
    grad = torch.func.grad(lambda x: apply_rope(x, cos, sin).square().sum())(x)
    close(grad, 2 * x, 1e-5)
    weights = torch.randn(2, 5, 8).to(device)
    grad = torch.func.grad(lambda x: (apply_rope(x, cos, sin) * weights).sum())(x)
    close(grad, expected(weights, -torch.arange(5), 8))  # R^T w = rotation by -m theta
    jac = torch.func.jacrev(lambda v: apply_rope(v, cos[:1], sin[:1], offset=0))(x[0, :1])
    assert jac.shape == (1, 8, 1, 8)
    close(jac.reshape(8, 8) @ x[0, 0], expected(x[0, :1], [0], 8)[0])
    batch = torch.randn(4, 2, 5, 8).to(device)
    close(torch.func.vmap(lambda v: apply_rope(v, cos, sin))(batch),
          expected(batch, range(5), 8))
    close(torch.func.vmap(lambda v: apply_rope(v, cos, sin, layout="half"), in_dims=2)(
        batch.movedim(0, 2)), expected(batch, range(5), 8, "half"))
    tables = (torch.stack(generate_rope_embeddings(5, 8, base=100.0, device=device)),
              torch.stack((cos, sin)))
    stacked_cos = torch.stack([t[0] for t in tables])
    stacked_sin = torch.stack([t[1] for t in tables])
    per_table = torch.func.vmap(lambda c, s: apply_rope(x, c, s))(stacked_cos, stacked_sin)
    close(per_table[1], expected(x, range(5), 8))
    close(per_table[0], rope_by_pairs(x.cpu(), angles(torch.arange(5), thetas(8, 100.0))))
    tangent = torch.randn_like(x)
    value, derivative = torch.func.jvp(lambda v: apply_rope(v, cos, sin), (x,), (tangent,))
    close(value, expected(x, range(5), 8))
    close(derivative, expected(tangent, range(5), 8))  # the rotation is linear in x
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, tangent)
        derivative = torch.autograd.forward_ad.unpack_dual(apply_rope(dual, cos, sin)).tangent
    close(derivative, expected(tangent, range(5), 8))


def test_row11_a_tensor_kept_from_a_finished_transform(device):
    """A tensor saved inside torch.func.grad and used after it ended is still a functorch
    wrapper (with no storage of its own); apply_rope gives its rotation, recording autograd
    or not, instead of reading a data pointer the wrapper lacks (the dispatcher
    unwraps such a tensor, as for torch's own operations)."""
    cos, sin = generate_rope_embeddings(4, 8, device=device)
    kept = []

    def keep(x):
        kept.append(x)
        return x.sum()

    torch.func.grad(keep)(torch.randn(4, 8).to(device))
    x = kept[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(x) and x.requires_grad
    value = x.detach().clone()
    close(apply_rope(x, cos, sin), expected(value, range(4), 8))  # as a training step
    with torch.no_grad():
        close(apply_rope(x, cos, sin), expected(value, range(4), 8))


def test_row11_gradients_of_the_tables_and_double_backward(device):
    """The registered autograd formula: gradcheck in float64 for x, cos and sin, and
    gradgradcheck (the backward is the operator again, differentiable)."""
    cos, sin = generate_rope_embeddings(4, 6, dtype=F64, device=device)
    cos.requires_grad_()
    sin.requires_grad_()
    x = torch.randn(2, 4, 6, dtype=F64).to(device).requires_grad_(True)
    for layout in LAYOUTS:
        def rope(x, c, s, layout=layout):
            return apply_rope(x, c, s, layout=layout)
        assert torch.autograd.gradcheck(rope, (x, cos, sin))
        assert torch.autograd.gradgradcheck(rope, (x, cos, sin))


def test_operator_registration_passes_opcheck(device):
    """torch.library.opcheck: schema, fake implementation, autograd registration and
    dispatcher behaviour of the operators agree with the real kernels."""
    cos, sin = generate_rope_embeddings(6, 8, device=device)
    x = torch.randn(2, 6, 8).to(device).requires_grad_(True)
    torch.library.opcheck(torch.ops.ropelib.rotate.default, (x, cos, sin, "half", 8))
    torch.library.opcheck(torch.ops.ropelib.rotate.default, (x, cos, sin, "half", 8, True))
    torch.library.opcheck(torch.ops.ropelib.rotate.default,
                          (torch.randn(3, 6, 8).to(device, torch.bfloat16), cos, sin,
                           "interleaved", 6))
    positions = torch.randint(0, 6, (2, 5, 3)).to(device)
    pair_axes = torch.tensor([0, 2, 1, 1], device=device)
    coordinates = positions[:, None, :, :].expand(2, 1, 5, 3)
    rows = torch.randn(2, 1, 5, 8).to(device).requires_grad_(True)
    for x_axes in (rows, rows.detach().bfloat16()):
        torch.library.opcheck(torch.ops.ropelib.rotate.default,
                              (x_axes, cos, sin, "half", 8, False, coordinates, pair_axes))


# Row 12 --------------------------------------------------------------------------------------

def test_row12_disjoint_slices_of_one_buffer(device):
    """out= the other half of a fused qkv buffer: the two slices interleave in memory but
    share no element, so the call is allowed (torch allows it) and right; slices that do
    share elements are still refused."""
    cos, sin = generate_rope_embeddings(5, 8, device=device)
    qkv = torch.randn(5, 16).to(device)
    source = qkv[:, :8].clone()
    assert apply_rope(qkv[:, :8], cos, sin, out=qkv[:, 8:]).data_ptr() == qkv[:, 8:].data_ptr()
    close(qkv[:, 8:], expected(source, range(5), 8))
    assert torch.equal(qkv[:, :8], source)
    with pytest.raises(ValueError, match="out shares memory with x but is not x itself"):
        apply_rope(qkv[:, :8], cos, sin, out=qkv[:, 4:12])


# Row 13 is an error case: tests/test_errors.py, "float mask with +inf".
# Row 14 are error cases: tests/test_errors.py, from "infinite factor" to "ntk with dim 2".

# Row 15 --------------------------------------------------------------------------------------

def test_row15_tables_die_with_their_last_reference():
    """No reference cycle through the tables: with the garbage collector off, a table used
    by apply_rope is freed as soon as the caller drops it."""
    gc.disable()
    try:
        for dtype in (torch.float32, F64):
            cos, sin = generate_rope_embeddings(8, 8, dtype=dtype)
            apply_rope(torch.randn(2, 8, 8), cos, sin)
            apply_rope(torch.randn(2, 8, 8), cos, sin, layout="half")
            refs = weakref.ref(cos), weakref.ref(sin)
            del cos, sin
            assert refs[0]() is None and refs[1]() is None, dtype
    finally:
        gc.enable()


# Row 16 --------------------------------------------------------------------------------------

def test_row16_offset_as_numpy_or_tensor_integer_and_jit_trace(device):
    cos, sin = generate_rope_embeddings(10, 8, device=device)
    x = torch.randn(2, 3, 8).to(device)
    want = expected(x, range(2, 5), 8)
    for offset in (np.int64(2), np.int32(2), torch.tensor(2), torch.tensor(2, dtype=torch.int8)):
        close(apply_rope(x, cos, sin, offset=offset), want)
    traced = torch.jit.trace(lambda v: apply_rope(v, cos, sin, offset=np.int64(2)), (x,))
    close(traced(x), want)
    other = torch.randn(2, 3, 8).to(device)
    close(traced(other), expected(other, range(2, 5), 8))
    for dtype in (torch.float32, torch.float16):  # on the CPU, the compiled loop and eager
        whole = torch.jit.trace(lambda v: apply_rope(v, cos, sin),
                                (torch.randn(2, 10, 8).to(device, dtype),))
        shorter = torch.randn(2, 4, 8).to(device, dtype)
        close(whole(shorter).float(), expected(shorter.float(), range(4), 8), tol=1e-3)


# Writes through out= are in-place writes ---------------------------------------------------

def test_out_bumps_the_version_counter_like_any_in_place_write(device):
    """The kernel writes through a pointer; ropelib bumps out's version counter, so autograd
    still refuses a backward through a tensor it saved and out= then overwrote."""
    cos, sin = generate_rope_embeddings(4, 8, device=device)
    leaf = torch.randn(4, 8).to(device).requires_grad_(True)
    saved = leaf * 1.0
    loss = (saved * saved).sum()  # mul saves `saved` for its backward
    version = saved._version
    with torch.no_grad():
        apply_rope(saved, cos, sin, out=saved)
    assert saved._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
