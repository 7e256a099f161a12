"""Each call works from the tensors it is given, whatever the calls before it: checked
through the public API on the route of CUDA tensors (values not read on the host, the
Triton kernel, here in its interpreter), against float64 references.

The behaviours a cache of earlier calls could break: new tensors of the same shapes
(nothing of an earlier call's addresses is used), a tensor resized or re-pointed with
``resize_``/``set_``, memory freed and handed to another tensor, threads calling with
different shapes, ``ROPELIB_BACKEND`` changed between calls, positions changed in place.
"""

from __future__ import annotations

import threading

import pytest
import torch
from reference import angles, rope_by_pairs, thetas
from test_one_launch import take_device_route

from ropelib import apply_rope, apply_rope_qk, eager, generate_rope_embeddings, native

pytest.importorskip("triton")
triton_rope = pytest.importorskip("ropelib.triton_rope")

F64 = torch.float64
D = 16


@pytest.fixture(autouse=True)
def _device_route(monkeypatch):
    take_device_route(monkeypatch)


def expected(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x rotated by positions ``(seq,)`` or ``(batch, seq)`` in float64, half layout."""
    rows = positions if positions.ndim == 1 else positions[:, None, :]
    return rope_by_pairs(x.to(F64), angles(rows, thetas(D)), "half").to(x.dtype)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def tables():
    return generate_rope_embeddings(64, D)


def test_new_tensors_of_the_same_shapes_each_call():
    """Call after call with new q, k, positions and destinations of one signature: each
    result is its own tensors' rotation (no earlier call's addresses)."""
    cos, sin = tables()
    for _ in range(4):
        q, k = torch.randn(3, 4, 2, D), torch.randn(3, 2, 2, D)
        positions = torch.randint(0, 64, (3, 2))
        outs = torch.empty_like(q), torch.empty_like(k)
        q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout="half", positions=positions,
                                     out=outs)
        assert q_rot is outs[0] and k_rot is outs[1]
        close(q_rot, expected(q, positions))
        close(k_rot, expected(k, positions))


def test_a_tensor_resized_or_set_to_other_memory_between_calls():
    """x rotated in place, then ``resize_`` to another shape and ``set_`` to another
    storage: each call rotates what x is now."""
    cos, sin = tables()
    x = torch.randn(2, 4, 3, D)
    want = expected(x, torch.arange(3))
    apply_rope(x, cos, sin, layout="half", out=x)
    close(x, want)
    x.resize_(2, 4, 5, D).normal_()
    want = expected(x, torch.arange(5))
    apply_rope(x, cos, sin, layout="half", out=x)
    close(x, want)
    other = torch.randn(2, 4, 5, D)
    x.set_(other.untyped_storage(), 0, other.shape, other.stride())
    want = expected(other.clone(), torch.arange(5))
    apply_rope(x, cos, sin, layout="half", out=x)
    close(other, want)


def test_freed_memory_handed_to_a_tensor_of_another_layout():
    """A destination freed and its memory reused by a tensor of other strides (likely the
    same addresses): the call rotates into the new tensor as its strides say."""
    cos, sin = tables()
    for _ in range(3):
        x = torch.randn(2, 4, 3, D)
        out = torch.empty(2, 4, 3, D)
        close(apply_rope(x, cos, sin, layout="half", out=out), expected(x, torch.arange(3)))
        del out
        out = torch.empty(2, 3, 4, D).transpose(1, 2)  # (B, S, H, D) storage
        close(apply_rope(x, cos, sin, layout="half", out=out), expected(x, torch.arange(3)))
        del x, out


def test_threads_with_different_shapes(monkeypatch):
    """Two threads calling at once with different head counts and lengths: each gets its
    own rotation. (Triton's interpreter runs one kernel at a time, so here the compiled
    loop rotates; the Python path above it is the device route's.)"""
    monkeypatch.setenv("ROPELIB_BACKEND", "native")
    cos, sin = tables()
    errors = []

    def work(heads: int, seq: int) -> None:
        try:
            for _ in range(5):
                q, k = torch.randn(2, heads, seq, D), torch.randn(2, 1, seq, D)
                positions = torch.randint(0, 64, (seq,))
                q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout="half",
                                             positions=positions)
                close(q_rot, expected(q, positions))
                close(k_rot, expected(k, positions))
        except Exception as error:  # noqa: BLE001 (reported by the main thread)
            errors.append(error)

    threads = [threading.Thread(target=work, args=shape) for shape in ((4, 3), (2, 5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_a_changed_backend_is_taken_by_the_next_call(monkeypatch):
    """ROPELIB_BACKEND read by each call: triton, then eager, then native, for one signature
    (spies on the native and eager backends' run and on the Triton kernel's launch, which
    a planned call makes without its run), each result the rotation."""
    ran = []

    def spy(name, real):
        return lambda *args, **kwargs: (ran.append(name), real(*args, **kwargs))[1]

    for name, module, entry in (("native", native, "run"), ("eager", eager, "run"),
                                ("triton", triton_rope, "launch")):
        monkeypatch.setattr(module, entry, spy(name, getattr(module, entry)))
    cos, sin = tables()
    x = torch.randn(2, 4, 3, D)
    for name in ("triton", "eager", "native", "triton"):
        monkeypatch.setenv("ROPELIB_BACKEND", name)
        close(apply_rope(x, cos, sin, layout="half"), expected(x, torch.arange(3)))
        assert ran[-1] == name
    monkeypatch.setenv("ROPELIB_BACKEND", "fast")
    with pytest.raises(ValueError, match="ROPELIB_BACKEND must be one of"):
        apply_rope(x, cos, sin, layout="half")


def test_positions_and_offset_changed_in_place_between_calls():
    """Positions and a 0-d offset are read by the kernel on each call: changed in place,
    the next call rotates by the new values; out of range, the kernel refuses them."""
    cos, sin = tables()
    q, k = torch.randn(2, 4, 3, D), torch.randn(2, 2, 3, D)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    offset = torch.tensor(4)
    for _ in range(2):
        q_rot, _ = apply_rope_qk(q, k, cos, sin, layout="half", positions=positions)
        close(q_rot, expected(q, positions))
        close(apply_rope(q, cos, sin, layout="half", offset=offset),
              expected(q, offset + torch.arange(3)))
        positions.add_(20)
        offset.add_(30)


def test_destinations_that_meet_another_tensor_are_refused_on_a_later_call():
    """A first call into separate destinations, then one whose k_out overlaps q: the
    second is refused (it would overwrite what the rotation still reads)."""
    cos, sin = tables()
    q, k = torch.randn(2, 4, 3, D), torch.randn(2, 4, 3, D)
    apply_rope_qk(q, k, cos, sin, layout="half", out=(torch.empty_like(q),
                                                      torch.empty_like(k)))
    with pytest.raises(ValueError, match="k_out shares memory with q"):
        apply_rope_qk(q, k, cos, sin, layout="half", out=(torch.empty_like(q), q))


def test_in_place_and_a_separate_destination_of_one_shape():
    """A partial rotation in place (the pass-through channels stay where they are), then
    into a separate buffer of the same shape and strides, and back: the buffer gets the
    pass-through channels copied, whatever the call before it did."""
    cos, sin = generate_rope_embeddings(64, D // 2)
    x = torch.randn(2, 4, 3, D)
    rotated = rope_by_pairs(x[..., :D // 2].to(F64), angles(torch.arange(3), thetas(D // 2)),
                            "half").to(x.dtype)
    want = torch.cat([rotated, x[..., D // 2:]], dim=-1)
    for _ in range(2):
        y = x.clone()
        close(apply_rope(y, cos, sin, layout="half", rotary_dim=D // 2, out=y), want)
        out = torch.full_like(x, float("nan"))
        close(apply_rope(x, cos, sin, layout="half", rotary_dim=D // 2, out=out), want)


def test_an_inference_destination_is_refused_on_a_later_call():
    """A destination made under ``torch.inference_mode()`` is refused outside it, on the
    first call of a signature and on a later one, as PyTorch refuses in-place updates of
    inference tensors."""
    cos, sin = tables()
    x = torch.randn(2, 4, 3, D)
    apply_rope(x, cos, sin, layout="half", out=torch.empty_like(x))
    with torch.inference_mode():
        out = torch.empty_like(x)
    with pytest.raises(ValueError, match="out is an inference tensor"):
        apply_rope(x, cos, sin, layout="half", out=out)


def test_arguments_of_the_wrong_kind_are_refused_by_name():
    """A call whose x, q or cache is not a tensor gets the checks' TypeError or ValueError
    naming it, not an error from the signature of the call."""
    cos, sin = tables()
    q = torch.randn(2, 4, 3, D)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        apply_rope(q.tolist(), cos, sin)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        apply_rope_qk(q.tolist(), q, cos, sin)
    with pytest.raises(TypeError, match="out must be a pair"):
        apply_rope_qk(q, q, cos, sin, out=q)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        apply_rope_qk(q, None, cos, sin)


def test_a_tangent_on_the_tables_after_plain_calls_of_the_same_shapes():
    """Forward-mode AD with a tangent on cos only (x plain), after plain calls of the same
    shapes: the call does not take their plan, and the output's tangent is d/dcos of
    (a cos - b sin, b cos + a sin) along the tangent: x times it, in each pair's two
    channels (half layout: i and i + D/2)."""
    x = torch.randn(2, 3, D)
    cos, sin = generate_rope_embeddings(3, D)
    for _ in range(2):
        apply_rope(x, cos, sin, layout="half")
    tangent = torch.randn_like(cos)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(cos, tangent)
        rotated = apply_rope(x, dual, sin, layout="half")
        got = torch.autograd.forward_ad.unpack_dual(rotated).tangent
    close(got, x * torch.cat((tangent, tangent), -1))
