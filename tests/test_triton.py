"""ropelib's Triton kernel against float64 references: on CPU tensors in Triton's interpreter
(every run, no GPU needed), and compiled on a GPU where there is one (the ``device`` fixture).

``ROPELIB_BACKEND=triton`` forces the kernel, so a call it declined would fail here instead
of passing through eager PyTorch. The interpreter rounds float32 to bfloat16 by truncation,
so the half-precision tolerances allow one unit in the last place, not half of one.
"""

from __future__ import annotations

import pytest
import torch
from reference import angles, backend_name, device_side_error, rope_by_pairs, thetas

from ropelib import apply_rope, apply_rope_qk, axis_frequencies, backend_status, kernels
from ropelib.multiaxis import axis_of_pairs
from ropelib.tables import generate_rope_embeddings

pytest.importorskip("triton")
triton_rope = pytest.importorskip("ropelib.triton_rope")

F64 = torch.float64
LAYOUTS = ("interleaved", "half")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# one unit in the last place (truncation in the interpreter) of values up to about 4
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7 * 4, torch.float16: 2 ** -10 * 4}


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("ROPELIB_BACKEND", "triton")


def close(result: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert result.dtype == dtype
    torch.testing.assert_close(result.detach().cpu().to(F64), expected,
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def reference(x: torch.Tensor, positions, rotary_dim: int, layout: str,
              sign: float = 1.0) -> torch.Tensor:
    """x rotated by m * theta_i (m from ``positions``, shaped to broadcast over x's rows)."""
    return rope_by_pairs(x, sign * angles(positions, thetas(rotary_dim)), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, rotary_dim", [(16, 16), (20, 12)])
def test_rows_given_every_layout_dtype_and_partial_rotation(device, layout, dtype, head_dim,
                                                            rotary_dim):
    """Rows sliced from the tables at an offset; rotary_dim not a power of two (6 pairs), the
    pass-through channels copied; seq (7) not a multiple of the token block."""
    x = torch.randn(2, 3, 7, head_dim, device=device).to(dtype)
    cos, sin = generate_rope_embeddings(16, rotary_dim, device=device)
    result = apply_rope(x, cos, sin, layout=layout, offset=5, rotary_dim=rotary_dim)
    close(result, reference(x, torch.arange(5, 12), rotary_dim, layout), dtype)
    assert result.is_contiguous()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_row_positions_and_other_leading_dims(device, layout):
    """Positions per batch entry (rows gathered with a batch dim), and x of 2, 3 and 5 dims
    (leading dims merged into a batch dim and a heads dim)."""
    cos, sin = generate_rope_embeddings(64, 16, device=device)
    x = torch.randn(3, 4, 5, 16, device=device)
    positions = torch.randint(0, 64, (3, 5))
    result = apply_rope(x, cos, sin, layout=layout, positions=positions.to(device))
    close(result, reference(x, positions[:, None, :], 16, layout), torch.float32)
    for shape in [(5, 16), (4, 5, 16), (2, 3, 2, 5, 16)]:
        x = torch.randn(shape, device=device)
        close(apply_rope(x, cos, sin, layout=layout, offset=3),
              reference(x, torch.arange(3, 8), 16, layout), torch.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_views_out_and_in_place(device, layout, dtype):
    """q as a view of a fused projection in (batch, seq, heads, dim) storage, written into a
    slice of a KV-cache-like buffer and in place; no copy of x is made (x unchanged for out=)."""
    qkv = torch.randn(2, 6, 3 * 4 * 16, device=device).to(dtype)
    q = qkv.view(2, 6, 3, 4, 16)[:, :, 0].transpose(1, 2)  # (2, 4, 6, 16), strided
    before = q.clone()
    cos, sin = generate_rope_embeddings(6, 16, device=device)
    expected = reference(before, torch.arange(6), 16, layout)
    close(apply_rope(q, cos, sin, layout=layout), expected, dtype)
    cache = torch.zeros(2, 4, 10, 32, device=device, dtype=dtype)
    apply_rope(q, cos, sin, layout=layout, out=cache[:, :, 2:8, 8:24])
    close(cache[:, :, 2:8, 8:24], expected, dtype)
    assert cache[:, :, :2].abs().sum() == 0 and cache[..., :8].abs().sum() == 0
    assert torch.equal(q, before)
    apply_rope(q, cos, sin, layout=layout, out=q)
    close(q, expected, dtype)


def test_rows_with_a_heads_dim_of_their_own(device, monkeypatch):
    """Gathered rows that differ per head: x's leading dims merged into the kernel's batch
    dim where its strides allow; a q viewed from a fused (batch, seq, heads, dim) projection
    does not allow it: the kernel declines it with its reason (a forced kernel raises with
    it) and the call runs elsewhere, equal to the float64 rotation."""
    x = torch.randn(2, 3, 5, 8, device=device)
    positions = torch.randint(0, 40, (2, 3, 5))
    table = angles(positions, thetas(8))
    cos, sin = table.cos().float().to(device), table.sin().float().to(device)
    close(apply_rope(x, cos, sin, layout="half"), rope_by_pairs(x, table, "half"),
          torch.float32)
    q = torch.randn(2, 5, 3, 2, 8, device=device)[:, :, :, 0].transpose(1, 2)  # (2, 3, 5, 8)
    reason = triton_rope.assess([q], [None], cos, sin, 8, None)[0]
    assert "rows that differ per head" in reason
    with pytest.raises(ValueError, match="ROPELIB_BACKEND=triton cannot rotate this call: "
                                         "the leading dims .* rows that differ per head"):
        apply_rope(q, cos, sin, layout="half")
    monkeypatch.delenv("ROPELIB_BACKEND")
    close(apply_rope(q, cos, sin, layout="half"), rope_by_pairs(q, table, "half"),
          torch.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batched", [False, True])
def test_mrope_rows_gathered_in_the_kernel(device, layout, batched):
    """M-RoPE: pair i reads the table row of coordinate axes[i] (Qwen2-VL's sections) for
    positions shared by the batch or one set per batch entry."""
    head_dim, sections = 16, [2, 3, 3]
    axes = axis_of_pairs(head_dim, sections)
    W = axis_frequencies(head_dim, sections)
    shape = (2, 7, 3) if batched else (7, 3)
    positions = torch.randint(0, 30, shape)
    x = torch.randn(2, 4, 7, head_dim, device=device)
    cos, sin = generate_rope_embeddings(30, head_dim, device=device)
    result = apply_rope(x, cos, sin, layout=layout, positions=positions.to(device),
                        axes=axes.to(device))
    table = positions.to(F64) @ W.to(F64).T  # (.., seq, d/2): angle of each pair
    if batched:
        table = table[:, None]
    close(result, rope_by_pairs(x, table, layout), torch.float32)


@pytest.mark.parametrize("kind", ["strided view", "expanded one element"])
def test_mrope_axes_of_any_strides(device, kind):
    """``axes`` as a strided view (every other element of a longer tensor) or one element
    expanded to every pair: the kernel reads the elements the view holds, as the float64
    formula on ``axes.contiguous()`` does, never the memory beside them."""
    head_dim = 16
    if kind == "strided view":
        wide = torch.stack([axis_of_pairs(head_dim, [2, 3, 3]), torch.full((8,), 2)], -1)
        axes = wide.reshape(-1)[::2]  # axes of the sections; the 2s between them unread
    else:
        axes = torch.tensor([1, 0, 2, 0])[:1].expand(head_dim // 2)  # zeros follow in memory
    assert not axes.is_contiguous()
    positions = torch.randint(0, 30, (7, 3))
    x = torch.randn(2, 4, 7, head_dim, device=device)
    cos, sin = generate_rope_embeddings(30, head_dim, device=device)
    result = apply_rope(x, cos, sin, positions=positions.to(device), axes=axes.to(device))
    theta = thetas(head_dim).to(F64)
    table = positions.to(F64)[:, axes.contiguous()] * theta  # pair i: coordinate axes[i]
    close(result, rope_by_pairs(x, table, "interleaved"), torch.float32)


def test_calls_without_a_plan_keep_their_verdict_and_launch(monkeypatch):
    """A training step takes no plan (autograd records it): its forward and backward calls
    keep the kernel's verdict and launches in the backend's one cache, so later steps with
    new tensors of the same shapes merge no dims again (``_batch_heads``) and still equal
    the float64 rotation and its transpose; the cache stays within its bound."""
    merges, merge = [], triton_rope._batch_heads
    monkeypatch.setattr(triton_rope, "_batch_heads", lambda *a: merges.append(1) or merge(*a))
    cos, sin = generate_rope_embeddings(6, 16)
    counts = []
    for _ in range(3):
        x = torch.randn(2, 3, 6, 16, requires_grad=True)
        grad = torch.randn(2, 3, 6, 16)
        y = apply_rope(x, cos, sin, layout="half")
        y.backward(grad)
        close(y, reference(x.detach(), torch.arange(6), 16, "half"), torch.float32)
        close(x.grad, reference(grad, torch.arange(6), 16, "half", sign=-1.0), torch.float32)
        counts.append(len(merges))
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]
    monkeypatch.setattr(triton_rope, "MAX_LAUNCHERS", 2)
    for seq in (2, 3, 4):
        apply_rope(torch.randn(1, 2, seq, 16), cos, sin, layout="half")
        assert len(triton_rope._launchers) <= 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_is_the_inverse_rotation(device, layout):
    """The backward runs the kernel with inverse=True: dL/dx = R_{-Theta} g, in float64 against
    the transpose of the rotation; inverse(rotate(x)) = x."""
    x = torch.randn(2, 3, 5, 12, device=device, requires_grad=True)
    cos, sin = generate_rope_embeddings(5, 12, device=device)
    grad = torch.randn(2, 3, 5, 12, device=device)
    apply_rope(x, cos, sin, layout=layout).backward(grad)
    close(x.grad, reference(grad, torch.arange(5), 12, layout, sign=-1.0), torch.float32)
    y = kernels.rotate(x.detach(), cos, sin, layout, 12)
    back = kernels.rotate(y, cos, sin, layout, 12, inverse=True)
    close(back, x.detach().cpu().to(F64), torch.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_and_key_in_one_launch(device, layout, dtype, monkeypatch):
    """apply_rope_qk: q with 4 heads and k with 2 (GQA) at per-row positions, one launch of
    the kernel for both; new outputs, out= and in place all equal the float64 rotation."""
    launches = []
    launch = triton_rope._launch

    def counting(x, prepared, tensors):  # every launch, prepared (raw) ones included
        launches.append(prepared.grid)
        launch(x, prepared, tensors)

    monkeypatch.setattr(triton_rope, "_launch", counting)
    q = torch.randn(2, 4, 5, 16, device=device).to(dtype)
    k = torch.randn(2, 2, 5, 16, device=device).to(dtype)
    positions = torch.randint(0, 32, (2, 5))
    cos, sin = generate_rope_embeddings(32, 16, device=device)
    expected_q = reference(q, positions[:, None, :], 16, layout)
    expected_k = reference(k, positions[:, None, :], 16, layout)
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions.to(device))
    assert len(launches) == 1
    close(q_rot, expected_q, dtype)
    close(k_rot, expected_k, dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions.to(device),
                  out=(q_out, k_out))
    close(q_out, expected_q, dtype)
    close(k_out, expected_k, dtype)
    result = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions.to(device),
                           inplace=True)
    assert result[0] is q and result[1] is k
    close(q, expected_q, dtype)
    close(k, expected_k, dtype)
    assert len(launches) == 3


def test_query_and_key_gradients(device):
    """rotate_qk's autograd formula: both grads are inverse rotations, and the tables' grads
    sum q's and k's contributions (against apply_rope applied to each)."""
    q = torch.randn(1, 4, 5, 8, device=device, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, device=device, requires_grad=True)
    cos, sin = generate_rope_embeddings(5, 8, device=device)
    cos.requires_grad_()
    sin.requires_grad_()
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout="half")
    (q_rot.square().sum() + k_rot.sum()).backward()
    grads = [t.grad.clone() for t in (q, k, cos, sin)]
    for t in (q, k, cos, sin):
        t.grad = None
    (apply_rope(q, cos, sin, layout="half").square().sum()
     + apply_rope(k, cos, sin, layout="half").sum()).backward()
    for mine, separate in zip(grads, (q.grad, k.grad, cos.grad, sin.grad), strict=True):
        torch.testing.assert_close(mine, separate, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k_records", [True, False], ids=["q and k record", "only q records"])
def test_query_and_key_gradients_with_constant_tables(device, layout, k_records):
    """The usual training step (the tables constant, each row at its own positions): each
    grad is the inverse rotation of its output's grad at those positions, against float64,
    also q's where k records no autograd."""
    q = torch.randn(2, 4, 5, 12, device=device, requires_grad=True)
    k = torch.randn(2, 2, 5, 12, device=device, requires_grad=k_records)
    cos, sin = generate_rope_embeddings(9, 12, device=device)
    positions = torch.randint(0, 9, (2, 5))
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions.to(device))
    assert k_rot.requires_grad == k_records  # as apply_rope(k) alone
    if k_records:
        torch.autograd.backward((q_rot, k_rot), (grad_q, grad_k))
    else:
        q_rot.backward(grad_q)
    close(q.grad, reference(grad_q, positions[:, None, :], 12, layout, sign=-1.0),
          torch.float32)
    if k_records:
        close(k.grad, reference(grad_k, positions[:, None, :], 12, layout, sign=-1.0),
              torch.float32)


def test_gradcheck_with_constant_tables(device):
    """torch.autograd.gradcheck and gradgradcheck of apply_rope_qk with constant tables (the
    training step's node; its double backward goes through the operator), in float32 as
    ``test_gradcheck``."""
    q = torch.randn(1, 2, 3, 8, device=device, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, device=device, requires_grad=True)
    cos, sin = generate_rope_embeddings(3, 8, device=device)

    def rotated(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope_qk(q, k, cos, sin, layout="half")

    tolerance = {"eps": 1e-2, "atol": 2e-3, "rtol": 2e-3}
    assert torch.autograd.gradcheck(rotated, (q, k), **tolerance)
    assert torch.autograd.gradgradcheck(rotated, (q, k), **tolerance)


def test_declined_calls_say_why(device, monkeypatch):
    """A forced backend that cannot take a call is an error naming the backend and the
    reason; without ROPELIB_BACKEND the same call goes to another backend."""
    x = torch.randn(2, 5, 8, device=device, dtype=F64)
    cos, sin = generate_rope_embeddings(5, 8, device=device)
    with pytest.raises(ValueError, match="ROPELIB_BACKEND=triton cannot rotate this call: "
                                         "the kernel takes"):
        apply_rope(x, cos, sin)
    monkeypatch.setenv("ROPELIB_BACKEND", "fast")
    with pytest.raises(ValueError, match="ROPELIB_BACKEND must be one of"):
        apply_rope(x, cos, sin)
    monkeypatch.delenv("ROPELIB_BACKEND")
    compiled = "triton" if device.type == "cuda" else "native"
    assert backend_name(x, 8) == ("eager" if device.type == "cuda" else "native")
    assert backend_name(x.float(), 8) == compiled
    assert backend_status(device).backend == backend_name(x.float(), 8)


def test_empty_inputs(device):
    cos, sin = generate_rope_embeddings(4, 8, device=device)
    assert apply_rope(torch.randn(0, 2, 4, 8, device=device), cos, sin).shape == (0, 2, 4, 8)
    k = torch.randn(1, 2, 4, 8, device=device)
    q_rot, k_rot = apply_rope_qk(torch.randn(1, 0, 4, 8, device=device), k, cos, sin)
    assert q_rot.shape == (1, 0, 4, 8)
    close(k_rot, reference(k, torch.arange(4), 8, "interleaved"), torch.float32)


def _qk_inputs(device):
    q = torch.randn(2, 4, 6, 16, device=device)
    k = torch.randn(2, 2, 6, 16, device=device)
    cos, sin = generate_rope_embeddings(6, 16, device=device)
    return q, k, cos, sin


def test_operators_pass_opcheck(device, monkeypatch):
    """torch.library.opcheck (schema, fake tensors, autograd registration, dispatcher) of the
    two operators on the device's default backend."""
    monkeypatch.delenv("ROPELIB_BACKEND")
    q, k, cos, sin = _qk_inputs(device)
    ops = torch.ops.ropelib
    torch.library.opcheck(ops.rotate.default, (q, cos, sin, "half", 16, False, None, None))
    torch.library.opcheck(ops.rotate_qk.default, (q, k, cos, sin, "half", 16, False, None, None))


def test_query_and_key_compile_fullgraph_and_export(device, monkeypatch):
    """apply_rope_qk under torch.compile(fullgraph=True) and torch.export: one opaque
    ropelib.rotate_qk node, equal to eager."""
    monkeypatch.delenv("ROPELIB_BACKEND")
    q, k, cos, sin = _qk_inputs(device)

    class QK(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return apply_rope_qk(q, k, cos, sin, layout="half", offset=0)

    eager_q, eager_k = QK()(q, k, cos, sin)
    compiled_q, compiled_k = torch.compile(QK(), fullgraph=True)(q, k, cos, sin)
    torch.testing.assert_close(compiled_q, eager_q)
    torch.testing.assert_close(compiled_k, eager_k)
    program = torch.export.export(QK(), (q, k, cos, sin))
    assert "ropelib.rotate_qk" in str(program.graph)
    exported_q, exported_k = program.module()(q, k, cos, sin)
    torch.testing.assert_close(exported_q, eager_q)
    torch.testing.assert_close(exported_k, eager_k)


def test_query_and_key_arguments_are_checked():
    q, k, cos, sin = _qk_inputs("cpu")
    with pytest.raises(ValueError, match="k must have q's shape but for the heads dim"):
        apply_rope_qk(q, k[:, :, :5], cos, sin)
    with pytest.raises(ValueError, match="pass either out=.* or inplace=True"):
        apply_rope_qk(q, k, cos, sin, out=(q, k), inplace=True)
    with pytest.raises(TypeError, match="out must be a pair"):
        apply_rope_qk(q, k, cos, sin, out=q)
    with pytest.raises(ValueError, match="k_out shares memory with q"):
        apply_rope_qk(q, k, cos, sin, out=(torch.empty_like(q), q[:, :2]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_read_through_positions_in_the_kernel(device, layout):
    """One coordinate per token (the GPU path of positions=, and of a 0-d offset tensor):
    the kernel reads each token's table row itself; a coordinate outside the table turns
    that token's rows to NaN and reads nothing (the callers assert the range as well; on
    the CPU the operator refuses it with a ValueError, issue 43 item 15)."""
    x = torch.randn(3, 2, 5, 16, device=device)
    cos, sin = generate_rope_embeddings(40, 16, device=device)
    positions = torch.randint(0, 40, (3, 5))
    coordinates = positions[:, None, :, None].to(device)  # (batch, 1, seq, 1)
    result = kernels.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    close(result, reference(x, positions[:, None, :], 16, layout), torch.float32)
    inverse = kernels.rotate(result, cos, sin, layout, 16, True, coordinates, None)
    close(inverse, x.cpu().to(F64), torch.float32)
    coordinates[1, 0, 2, 0] = 40
    coordinates[2, 0, 0, 0] = -1
    if device.type == "cpu":  # the operator refuses them there, before any backend runs
        with pytest.raises(ValueError, match=r"positions must be in \[0, 40\)"):
            kernels.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    # the kernel itself (what runs on a GPU, where nothing is read back to check them)
    poisoned = triton_rope.run([x], [None], cos, sin, layout, 16, False, coordinates,
                               None)[0].cpu()
    assert poisoned[1, :, 2].isnan().all() and poisoned[2, :, 0].isnan().all()
    poisoned[1, :, 2] = poisoned[2, :, 0] = 0
    expected = reference(x, positions[:, None, :], 16, layout)
    expected[1, :, 2] = expected[2, :, 0] = 0
    close(poisoned, expected, torch.float32)


def test_gradcheck(device):
    """torch.autograd.gradcheck of apply_rope_qk in float32 (the kernel's dtypes; the
    rotation is linear in x and in the tables, so central differences with a step of 1e-2
    are exact up to float32 rounding)."""
    q = torch.randn(1, 2, 3, 8, device=device, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, device=device, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in generate_rope_embeddings(3, 8, device=device))
    assert torch.autograd.gradcheck(
        lambda q, k, cos, sin: apply_rope_qk(q, k, cos, sin, layout="half"),
        (q, k, cos, sin), eps=1e-2, atol=2e-3, rtol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_decode_step_is_captured_in_a_cuda_graph():
    """apply_rope_qk at per-row positions (a decode step) holds no host read: captured once
    with torch.cuda.graph, each replay with new positions and tokens equals the eager call."""
    cos, sin = generate_rope_embeddings(4096, 64, device="cuda")
    q = torch.randn(8, 4, 1, 64, device="cuda")
    k = torch.randn(8, 2, 1, 64, device="cuda")
    positions = torch.randint(0, 4096, (8, 1), device="cuda")
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)

    def step():
        apply_rope_qk(q, k, cos, sin, layout="half", positions=positions, out=(q_out, k_out))

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        positions.copy_(torch.randint(0, 4096, (8, 1), device="cuda"))
        graph.replay()
        expected_q, expected_k = apply_rope_qk(q, k, cos, sin, layout="half",
                                               positions=positions)
        torch.testing.assert_close(q_out, expected_q, rtol=0, atol=0)
        torch.testing.assert_close(k_out, expected_k, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device-side assert needs a GPU")
def test_a_bad_position_on_cuda_is_a_device_side_error():
    """On CUDA the range of positions is asserted on the device: the call returns at once,
    and the next synchronization raises (in a subprocess: the assert ends its CUDA context)."""
    stderr = device_side_error(
        "from ropelib import apply_rope, generate_rope_embeddings\n"
        "cos, sin = generate_rope_embeddings(16, 8, device='cuda')\n"
        "x = torch.randn(1, 2, 3, 8, device='cuda')\n"
        "apply_rope(x, cos, sin, positions=torch.tensor([0, 5, 16], device='cuda'))")
    assert "ropelib: positions must be >= 0 and < the cos/sin table length" in stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the prepared launch needs a GPU")
def test_prepared_launches_equal_the_first_one(monkeypatch):
    """After the first call of a shape (through Triton's JIT), calls go straight to the
    compiled kernel's launcher: the same numbers, call after call, with new tensors."""
    cos, sin = generate_rope_embeddings(64, 16, device="cuda")
    triton_rope._launchers.clear()
    jit, grids = triton_rope._compiled, []

    class Counting:  # Triton's JIT, each launch through it noted
        def __getitem__(self, grid):
            grids.append(grid)
            return jit[grid]

    monkeypatch.setattr(triton_rope, "_compiled", Counting())
    for _ in range(3):
        q = torch.randn(4, 8, 5, 16, device="cuda")
        positions = torch.randint(0, 64, (4, 5))
        result = apply_rope(q, cos, sin, layout="half", positions=positions.cuda())
        close(result, reference(q, positions[:, None, :], 16, "half"), torch.float32)
    assert len(grids) == (1 if triton_rope._RAW_LAUNCH else 3)


def test_a_launch_runs_on_its_tensors_device_not_the_current_one(monkeypatch):
    """Triton compiles and launches on the current CUDA device. A model split over GPUs
    (Hugging Face's device_map="auto") calls with tensors on another: the JIT launch and the
    prepared launch both run with x's device current, and the current device is restored
    after each. On the CPU: the device calls and Triton's runners are
    stand-ins that note which device is current when they run."""
    import triton

    current, seen = [0], []

    class Device:  # torch.cuda.device: `index` current inside the block
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            self.before, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.before

    q = torch.randn(2, 4, 3, 8)
    cos, sin = generate_rope_embeddings(3, 8)
    launch = triton_rope.prepare(triton_rope.assess([q], [None], cos, sin, 8, None)[1], [q],
                                 [None], "half", 8, False, None, None, False, False)
    tensors = (q,) * 6 + (cos, sin, cos, cos, cos)
    arguments = len(tensors) + len(launch.scalars) + len(launch.constexprs)

    class Compiled:  # a compiled kernel: its raw launcher notes the current device
        src = type("Source", (), {"signature": (None,) * arguments})

        def __getitem__(self, grid):
            return lambda *args, stream: seen.append(("raw", current[0], stream))

    class Jit:  # triton.jit's launch: notes the current device, returns the kernel
        def __getitem__(self, grid):
            return lambda *args, **options: seen.append(("jit", current[0])) or Compiled()

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(triton.runtime.driver, "_active", type(
        "Driver", (), {"get_current_stream": staticmethod(lambda device: f"s{device}")}))
    monkeypatch.setattr(triton_rope, "_compiled", Jit())
    monkeypatch.setattr(triton_rope, "_RAW_LAUNCH", True)
    monkeypatch.setattr(triton_rope, "_launchers", {})
    x = type("CudaX", (), {"is_cuda": True, "get_device": lambda self: 1})()
    triton_rope._launch(x, launch, tensors)  # the first call: Triton's JIT
    assert seen == [("jit", 1)] and current == [0]
    triton_rope._launch(x, launch, tensors)  # the prepared launch
    assert seen[1:] == [("raw", 1, "s1")] and current == [0]
    current[0] = 1  # x's device current: no switch, the same launcher
    triton_rope._launch(x, launch, tensors)
    assert seen[2:] == [("raw", 1, "s1")]
    assert len(triton_rope._launchers) == 1


def test_rows_of_given_positions_equal_the_tables(device):
    """The rows a module computes for given positions on the device (the route of a GPU and
    of a compiled graph, RotaryEmbedding.traced_rows) equal its float64-computed tables
    rounded to float32, at positions up to 2^20 (float64 angles there too)."""
    from ropelib import RotaryEmbedding

    rotary = RotaryEmbedding(128, max_position_embeddings=16).to(device)
    positions = torch.cat([torch.arange(0, 64), torch.randint(0, 2 ** 20, (256,)),
                           torch.tensor([2 ** 20 - 1])])
    cos, sin = rotary.traced_rows(positions.to(device), None)
    table = angles(positions, thetas(128))
    for rows, f in ((cos, torch.cos), (sin, torch.sin)):
        assert rows.dtype == torch.float32 and rows.device == device
        torch.testing.assert_close(rows.cpu(), f(table).float(), rtol=0, atol=6e-8)


@pytest.mark.parametrize("mode, step, clamp, check, cache_step, half, partial", [
    (0, False, False, False, False, True, True), (0, False, False, False, False, False, False),
    (1, True, False, True, True, True, False), (1, False, True, True, False, False, True),
    (1, False, False, False, False, True, False), (2, False, False, True, False, False, False)])
def test_the_kernel_compiles_for_a_gpu_in_each_variant(mode, step, clamp, check, cache_step,
                                                       half, partial):
    """What the interpreter cannot check: Triton's compiler takes the kernel (compiled with
    debug, as a CUDA launch does) in each branch of its constexprs, for a GPU of this
    project's benchmarks (``triton_probe.TARGET``), bfloat16 tensors, without spilling past
    the registers a thread can have."""
    from ropelib.book import triton_probe

    constants = {"HEADS_PER_PROGRAM": 4, "ROTARY": 96 if partial else 128, "HEAD_DIM": 128,
                 "BLOCK_S": 16, "BLOCK_P": 64, "BLOCK_R": 32 if partial else 0,
                 "BLOCK_D": 128 if cache_step else 0, "HALF": half, "INVERSE": not half,
                 "MODE": mode, "STEP": step, "CLAMP": clamp, "CHECK": check}
    pointers = {"COS": "*fp32", "SIN": "*fp32", "POS": "*i64", "AXES": "*i64", "SLOT": "*i64"}
    signature = {name: pointers.get(name, "*bf16" if name[0] in "XO" else "i32")
                 for name in triton_rope._compiled.arg_names if name not in constants}
    used = triton_probe.resources(triton_rope._compiled, signature, constants, num_warps=8)
    assert 0 < used["registers"] <= 255
