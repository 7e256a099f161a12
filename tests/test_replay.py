"""Replayed calls (``ropelib.replay``, issue 44 item 1): a GPU call whose key was seen
before launches what the whole path would launch, with its own addresses, and nothing it
cannot see the same way.

CPU tensors take the route of CUDA tensors here (values not read on the host, the Triton
backend, calls replayed), and the launch is stubbed: the whole path's launches are recorded
with their tensors' addresses, a replay's with the addresses it computed. Each replay must
equal the whole path's launch for the same tensors, pointer for pointer (a new output: the
replay's own). The launches themselves run on a GPU (tests/test_cuda_hardware.py).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import threading
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import apply_rope, apply_rope_qk, apply_rope_qk_to_cache, replay, rotation
from ropelib.tables import generate_rope_embeddings

pytest.importorskip("triton")
triton_rope = pytest.importorskip("ropelib.triton_rope")


@pytest.fixture
def route(monkeypatch):
    """CPU calls on the GPU's route, replayed; the stubbed launches as (kind, ``Launch``,
    pointer addresses), kind "whole" or "replay"."""
    monkeypatch.setenv("ROPELIB_BACKEND", "triton")
    monkeypatch.setattr(rotation, "_on_device", lambda t: True)
    monkeypatch.setattr(replay, "_on_gpu", lambda t: True)
    replay.clear()
    launches = []

    def launch(x, prepared, tensors):
        launches.append(("whole", prepared, tuple(t.data_ptr() for t in tensors)))
        return lambda pointers: launches.append(("replay", prepared, tuple(pointers)))

    monkeypatch.setattr(triton_rope, "_launch", launch)
    yield launches
    replay.clear()


def fresh(seed: int) -> dict[str, torch.Tensor]:
    """New tensors of the same shapes, strides and dtypes for every seed."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(4, 8, 3, 16, generator=g), torch.randn(4, 2, 3, 16, generator=g)
    cos, sin = (t.clone() for t in generate_rope_embeddings(64, 16))
    return {"q": q, "k": k, "v": torch.randn_like(k), "cos": cos, "sin": sin,
            "positions": torch.randint(0, 64, (4, 3), generator=g),
            "q_out": torch.empty_like(q), "k_out": torch.empty_like(k),
            "offset": torch.tensor(5), "axes": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]),
            "mrope": torch.randint(0, 64, (4, 3, 3), generator=g),
            "keys": torch.zeros(4, 2, 8, 16), "values": torch.zeros(4, 2, 8, 16),
            "slot": torch.tensor(2), "xs": torch.randn(4, 3, 8, 16, generator=g).transpose(1, 2)}


CASES = {  # name: (call, the tensors it writes in place)
    "qk positions out=": (lambda t: apply_rope_qk(
        t["q"], t["k"], t["cos"], t["sin"], layout="half", positions=t["positions"],
        out=(t["q_out"], t["k_out"])), ("q_out", "k_out")),
    "qk positions": (lambda t: apply_rope_qk(
        t["q"], t["k"], t["cos"], t["sin"], positions=t["positions"]), ()),
    "qk in place": (lambda t: apply_rope_qk(
        t["q"], t["k"], t["cos"], t["sin"], positions=t["positions"], inplace=True),
        ("q", "k")),
    "qk 0-d offset": (lambda t: apply_rope_qk(
        t["q"], t["k"], t["cos"], t["sin"], offset=t["offset"]), ()),
    "qk M-RoPE": (lambda t: apply_rope_qk(
        t["q"], t["k"], t["cos"], t["sin"], layout="half", positions=t["mrope"],
        axes=t["axes"]), ()),
    "rope rows": (lambda t: apply_rope(t["q"], t["cos"], t["sin"]), ()),
    "rope out=": (lambda t: apply_rope(
        t["q"], t["cos"], t["sin"], positions=t["positions"], out=t["q_out"]), ("q_out",)),
    "rope in place": (lambda t: apply_rope(
        t["q"], t["cos"], t["sin"], positions=t["positions"], out=t["q"]), ("q",)),
    "rope repeat_last": (lambda t: apply_rope(
        t["q"], t["cos"], t["sin"], positions=t["positions"], short_table="repeat_last"), ()),
    "rope (B, S, H, D) view": (lambda t: apply_rope(
        t["xs"], t["cos"], t["sin"], layout="half", positions=t["positions"]), ()),
    "cache step": (lambda t: apply_rope_qk_to_cache(
        t["q"], t["k"], t["v"], t["cos"], t["sin"], t["keys"], t["values"], t["slot"],
        layout="half"), ("keys", "values")),
    "cache step, positions": (lambda t: apply_rope_qk_to_cache(
        t["q"], t["k"], t["v"], t["cos"], t["sin"], t["keys"], t["values"], t["slot"],
        positions=t["positions"]), ("keys", "values")),
}


def as_tuple(result) -> tuple[torch.Tensor, ...]:
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


@pytest.mark.parametrize("name", list(CASES))
def test_a_call_seen_before_replays_the_whole_paths_launch(route, monkeypatch, name):
    """The second call with new tensors of the same kind is one replayed launch: the same
    ``Launch`` as the whole path's for those tensors, the same pointers (its own new
    outputs where the whole path makes new ones), results of the same shapes and strides,
    the destinations' version counters bumped once."""
    call, written = CASES[name]
    call(fresh(0))
    route.clear()
    tensors = fresh(1)
    versions = {n: tensors[n]._version for n in written}
    replayed = as_tuple(call(tensors))
    assert [kind for kind, *_ in route] == ["replay"]
    assert {n: tensors[n]._version - versions[n] for n in written} == {n: 1 for n in written}
    monkeypatch.setattr(replay, "ENABLED", False)
    whole = as_tuple(call(tensors))
    (_, launch, pointers), (kind, whole_launch, whole_pointers) = route
    assert kind == "whole" and launch == whole_launch
    given = {t.data_ptr() for t in tensors.values()}
    new = {r.data_ptr(): i for i, r in enumerate(whole) if r.data_ptr() not in given}
    expected = tuple(replayed[new[p]].data_ptr() if p in new else p for p in whole_pointers)
    assert pointers == expected
    assert [(r.shape, r.stride(), r.dtype) for r in replayed] == [
        (r.shape, r.stride(), r.dtype) for r in whole]
    for r, w in zip(replayed, whole, strict=True):
        assert (r.data_ptr() in given) == (w.data_ptr() in given)


@pytest.mark.parametrize("guards", [True, False])
def test_a_call_a_guard_passes_makes_no_key(route, monkeypatch, guards):
    """A replayed call of a kind seen before is found by the guard of its recipe (PyTorch's
    ``TensorGuards``), without its key; where this torch has no such guard, by its key."""
    if not guards:
        monkeypatch.setattr(replay, "TensorGuards", None)
    keys = []
    make_key = replay._key
    monkeypatch.setattr(replay, "_key", lambda *args: keys.append(1) or make_key(*args))
    for name, (call, _) in CASES.items():
        call(fresh(0))
        route.clear()
        keys.clear()
        call(fresh(1))
        assert [kind for kind, *_ in route] == ["replay"], name
        assert len(keys) == (0 if guards else 1), name


class Subclass(torch.Tensor):
    pass


def _made_under_inference_mode(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


ALTERED = {  # how a call's tensors may differ from the recorded call's
    "as made": lambda t: None,
    "bfloat16": lambda t: t.update({name: v.bfloat16() for name, v in t.items()
                                    if v.is_floating_point()}),
    "a negated cos": lambda t: t.update(cos=(-t["cos"]).clone()._neg_view()),
    "q's other strides": lambda t: t.update(
        q=t["q"].transpose(1, 2).contiguous().transpose(1, 2)),
    "q misaligned": lambda t: t.update(q=torch.randn(t["q"].numel() + 1)[1:].view(4, 8, 3, 16)),
    "int32 positions": lambda t: t.update(positions=t["positions"].int()),
    "expanded positions": lambda t: t.update(positions=t["positions"][:, :1].expand(4, 3)),
    "q requires grad": lambda t: t["q"].requires_grad_(),
    "inference outs": lambda t: t.update(q_out=_made_under_inference_mode(t["q_out"]),
                                         k_out=_made_under_inference_mode(t["k_out"])),
    "offsets elsewhere": lambda t: t.update(offset=t["offset"].to("meta"),
                                            slot=t["slot"].to("meta")),
    "outs are x detached": lambda t: t.update(q_out=t["q"].detach(), k_out=t["k"].detach()),
    "a subclass cos": lambda t: t.update(cos=t["cos"].as_subclass(Subclass)),
}
@pytest.mark.parametrize("altered", ["bfloat16", "q's other strides", "a subclass cos",
                                     "expanded positions", "q requires grad"])
def test_a_guard_refuses_what_the_key_tells_apart(route, altered):
    """After calls of one kind were recorded and replayed, a call of that kind with a tensor
    of another dtype, strides, type, or one that records autograd passes no guard: it takes
    the whole path (and its error, where it has one)."""
    call = CASES["rope out="][0]
    call(fresh(0))
    call(fresh(1))
    route.clear()
    tensors = fresh(2)
    ALTERED[altered](tensors)
    if altered == "q requires grad":
        with pytest.raises(ValueError, match=r"out=\.\.\.\) is not differentiable"):
            call(tensors)
        assert route == []
        return
    call(tensors)
    assert [kind for kind, *_ in route] == ["whole"]


def test_a_recipe_recorded_under_no_grad_is_not_replayed_with_grad(route):
    """The guard's requires_grad is the tensor's own: a recipe recorded under
    ``torch.no_grad()`` for an x that requires grad would pass it with grad on. Grad mode
    is part of the context a guard is kept with: the call records autograd, whole."""
    call = CASES["rope rows"][0]
    with torch.no_grad():
        for seed in (0, 1):
            t = fresh(seed)
            t["q"].requires_grad_()
            call(t)
    assert [kind for kind, *_ in route] == ["whole", "replay"]
    route.clear()
    t = fresh(2)
    t["q"].requires_grad_()
    assert call(t).grad_fn is not None
    assert [kind for kind, *_ in route] == ["whole"]


class BrokenGuards:
    """A ``TensorGuards`` of another torch: made or checked, it raises."""

    def __init__(self, *tensors, fail_when_made: bool = True, **sizes_and_strides) -> None:
        if fail_when_made:
            raise TypeError("another signature")

    def check(self, *tensors) -> bool:
        raise TypeError("another signature")


@pytest.mark.parametrize("fails", ["made", "checked"])
def test_a_guard_that_fails_leaves_the_call_to_its_key(route, monkeypatch, fails):
    """``TensorGuards`` is PyTorch's private API: where it cannot be made, or its check
    raises, calls are found by their keys (the check's failure turns guards off) and
    replayed as before, never failed."""
    guards = BrokenGuards if fails == "made" else (
        lambda *tensors, **kw: BrokenGuards(fail_when_made=False))
    monkeypatch.setattr(replay, "TensorGuards", guards)
    call = CASES["qk positions out="][0]
    for seed in range(3):
        call(fresh(seed))
    assert [kind for kind, *_ in route] == ["whole", "replay", "replay"]
    assert replay.TensorGuards is None


MODES = {"plain": contextlib.nullcontext, "no_grad": torch.no_grad,
         "inference mode": torch.inference_mode,
         "below autograd": torch._C._AutoDispatchBelowAutograd,
         "autocast": lambda: torch.autocast("cpu")}


def _played(launches: list, sequence: list[tuple[str, str, str]]) -> list:
    """What each call of the sequence did, told by what a caller can see: its result (or
    error), its launches (kind, ``Launch``, the tensor each pointer is in) and the
    version counters it bumped."""
    replay.clear()
    launches.clear()
    trace = []
    for seed, (case, altered, mode) in enumerate(sequence):
        t = fresh(seed)
        ALTERED[altered](t)
        versions = {name: v._version for name, v in t.items() if not v.is_inference()}
        first = len(launches)
        with MODES[mode]():
            try:
                result = CASES[case][0](t)
            except (ValueError, TypeError, RuntimeError) as error:
                result = error
        results = () if isinstance(result, Exception) else as_tuple(result)
        named = {r.data_ptr(): f"result {i}" for i, r in enumerate(results)}
        named.update({v.data_ptr(): name for name, v in t.items() if v.device.type == "cpu"})
        trace.append((
            repr(result) if isinstance(result, Exception) else [
                (next((name for name, v in t.items() if v is r), "new"), r.shape, r.stride(),
                 r.dtype, r.requires_grad, r.grad_fn is not None) for r in results],
            [(kind, launch, [named.get(p, "?") for p in pointers])
             for kind, launch, pointers in launches[first:]],
            {name: v._version - versions[name] for name, v in t.items() if name in versions}))
    return trace


def _same_with_keys(launches: list, sequence: list[tuple[str, str, str]]) -> None:
    """The sequence played with guards and with keys alone does the same."""
    with_guards = _played(launches, sequence)
    guards, replay.TensorGuards = replay.TensorGuards, None
    try:
        with_keys = _played(launches, sequence)
    finally:
        replay.TensorGuards = guards
    assert with_guards == with_keys, sequence


@pytest.mark.parametrize("mode", list(MODES))
def test_guards_replay_what_keys_replay(route, mode):
    """Each kind of call, recorded and replayed, then called with each alteration of its
    tensors, all in one mode: with guards and with keys alone, every call returns,
    raises, launches and bumps the same."""
    for case in CASES:
        for altered in ALTERED:
            _same_with_keys(route, [(case, "as made", mode)] * 2 + [(case, altered, mode)])


@pytest.mark.parametrize("seed", range(3))
def test_guards_replay_what_keys_replay_as_modes_change(route, seed):
    """The same for random sequences whose calls each have a mode of their own."""
    rng = random.Random(seed)
    for _ in range(20):
        case = rng.choice(list(CASES))
        _same_with_keys(route, [(case, altered, rng.choice(list(MODES))) for altered in (
            "as made", "as made", *rng.choices(list(ALTERED), k=rng.randint(1, 4)))])


_inside: list = []  # the call the operator below makes


@torch.library.custom_op("test_replay::call_inside", mutates_args=())
def _call_inside(x: torch.Tensor) -> torch.Tensor:
    """An operator whose implementation (autograd keys excluded) makes ``_inside[-1]()``."""
    _inside[-1]()
    return x.clone()


def test_a_guard_is_not_trusted_where_the_thread_masks_dispatch_keys(route):
    """A guard compares dispatch keys as the thread's exclusions leave them: inside an
    operator's implementation an inference tensor passes for a plain one, and with
    ``Negative`` excluded (the fallback of a lazily negated tensor) a negated view does.
    There calls into destinations, and every call under ``Negative`` excluded, are found by
    their keys: the whole path's error for a destination made under inference mode, and
    its refusal of a lazily negated table, as outside."""
    call = CASES["rope out="][0]
    for seed in (0, 1):
        _inside.append(lambda seed=seed: call(fresh(seed)))
        _call_inside(torch.zeros(1))
    assert [kind for kind, *_ in route] == ["whole", "replay"]
    t = fresh(2)
    with torch.inference_mode():
        t["q_out"] = torch.empty_like(t["q"])
    _inside.append(lambda: call(t))
    with pytest.raises(ValueError, match="out is an inference tensor"):
        _call_inside(torch.zeros(1))

    _inside.clear()
    negative = torch._C.DispatchKeySet(torch._C.DispatchKey.Negative)
    with torch._C._ExcludeDispatchKeyGuard(negative):
        call(fresh(3))
        call(fresh(4))
        t = fresh(5)
        t["sin"] = (-t["sin"]).clone()._neg_view()  # the same values, read negated
        with pytest.raises(ValueError, match="lazily neg"):
            call(t)


OPERATORS = {  # what a compiled graph calls: name: (call, the destinations it writes)
    "rotate_qk": (lambda t: torch.ops.ropelib.rotate_qk.default(
        t["q"], t["k"], t["cos"][:3], t["sin"][:3], "half", 16), ()),
    "rotate": (lambda t: torch.ops.ropelib.rotate.default(
        t["q"], t["cos"][:3], t["sin"][:3], "interleaved", 16, True), ()),
    "rotate_qk_out": (lambda t: torch.ops.ropelib.rotate_qk_out.default(
        t["q"], t["k"], t["cos"][:3], t["sin"][:3], "half", 16, t["q_out"], t["k_out"]),
        ("q_out", "k_out")),
}


@pytest.mark.parametrize("name", list(OPERATORS))
def test_an_operators_implementation_replays_by_guard_what_writes_no_tensor(
        route, monkeypatch, name):
    """An operator called through the dispatcher (its implementation runs with the autograd
    keys excluded) replays its rotation from its second call on. Without destinations it is
    found by its guard, with no key, and an inference tensor among its inputs, which that
    guard cannot tell from a plain one, gets the whole path's launch and outputs; with
    destinations it makes its key."""
    keys = []
    make_key = replay._key
    monkeypatch.setattr(replay, "_key", lambda *args: keys.append(1) or make_key(*args))
    call, written = OPERATORS[name]
    call(fresh(0))
    route.clear()
    keys.clear()
    call(fresh(1))
    assert [kind for kind, *_ in route] == ["replay"]
    assert len(keys) == (1 if written else 0)
    if written:
        return
    route.clear()
    tensors = fresh(2)
    tensors["q"] = _made_under_inference_mode(tensors["q"])
    replayed = as_tuple(call(tensors))
    monkeypatch.setattr(replay, "ENABLED", False)
    whole = as_tuple(call(tensors))
    (kind, launch, pointers), (_, whole_launch, whole_pointers) = route
    assert kind == "replay" and launch == whole_launch
    made = {w.data_ptr(): r.data_ptr() for r, w in zip(replayed, whole, strict=True)}
    assert pointers == tuple(made.get(p, p) for p in whole_pointers)
    assert [(r.shape, r.stride(), r.is_inference()) for r in replayed] == [
        (w.shape, w.stride(), w.is_inference()) for w in whole]


def test_an_operators_checks_refuse_a_new_key_after_replays(route):
    """An operator's implementation checks its operands on the whole path only: a call that
    the checks refuse, made after replays of good ones, takes the whole path and its error
    (too few columns, rows that do not cover x's, a destination on a table, a destination
    made under inference mode)."""
    call = OPERATORS["rotate_qk_out"][0]
    for seed in (0, 1):
        call(fresh(seed))
        OPERATORS["rotate"][0](fresh(seed))
    t = fresh(2)
    with pytest.raises(ValueError, match=r"must have rotary_dim // 2 = 8 columns"):
        torch.ops.ropelib.rotate.default(t["q"], t["cos"][:3, :4], t["sin"][:3, :4],
                                         "interleaved", 16, True)
    with pytest.raises(ValueError, match="do not broadcast to x's rows"):
        torch.ops.ropelib.rotate.default(t["q"], t["cos"][:2], t["sin"][:2], "interleaved",
                                         16, True)
    table = torch.randn(t["q"].numel() + t["k"].numel())
    t.update(cos=table[:3 * 8].view(3, 8), q_out=table[:t["q"].numel()].view_as(t["q"]))
    with pytest.raises(ValueError, match="q_out shares memory with cos"):
        call(t)
    t = fresh(3)
    t["k_out"] = _made_under_inference_mode(t["k_out"])
    with pytest.raises(ValueError, match="k_out is an inference tensor"):
        call(t)
    assert [kind for kind, *_ in route] == ["whole", "whole", "replay", "replay"]


def test_calls_under_autocast_are_found_by_their_keys(route, monkeypatch):
    """Autocast changes the thread's exclusions, so its calls make their keys, and replay
    as any others; after it, the recipe it recorded gets its guard when its key first
    finds it, and is found by that guard from then on."""
    keys = []
    make_key = replay._key
    monkeypatch.setattr(replay, "_key", lambda *args: keys.append(1) or make_key(*args))
    call = CASES["rope out="][0]
    with torch.autocast("cpu"):
        for seed in range(3):
            call(fresh(seed))
    assert [kind for kind, *_ in route] == ["whole", "replay", "replay"] and len(keys) == 3
    call(fresh(3))
    call(fresh(4))
    assert [kind for kind, *_ in route][3:] == ["replay", "replay"] and len(keys) == 4


def test_a_recipe_pushed_out_of_its_kinds_last_comes_back(route, monkeypatch):
    """A kind keeps the guards of its last ``KNOWN_PER_KIND`` recipes; a decode step's,
    pushed out by prefills of as many other lengths, is found by its key once, then by
    its guard again."""
    cos, sin = generate_rope_embeddings(256, 16)

    def step(seq: int) -> None:
        q, k = torch.randn(1, 8, seq, 16), torch.randn(1, 2, seq, 16)
        apply_rope_qk(q, k, cos, sin, positions=torch.randint(0, 256, (1, seq)))

    keys = []
    make_key = replay._key
    monkeypatch.setattr(replay, "_key", lambda *args: keys.append(1) or make_key(*args))
    step(1)
    for seq in range(2, 2 + replay.KNOWN_PER_KIND):
        step(seq)
    keys.clear()
    route.clear()
    for _ in range(10):
        step(1)
    assert [kind for kind, *_ in route] == ["replay"] * 10
    assert len(keys) == 1


def test_an_address_the_recipe_did_not_see_takes_the_whole_path(route):
    """Alignment and in-place are decided by addresses, which the key does not hold: a
    misaligned destination, or q and k as their own destinations after a call with
    buffers, run the whole path."""
    CASES["qk positions out="][0](fresh(0))
    tensors = fresh(1)
    buffer = torch.empty(tensors["q"].numel() + 1)
    tensors["q_out"] = buffer[1:].view(tensors["q"].shape)  # 4 bytes past an aligned start
    route.clear()
    CASES["qk positions out="][0](tensors)
    assert [kind for kind, *_ in route] == ["whole"]
    tensors = fresh(2)
    tensors["q_out"], tensors["k_out"] = tensors["q"], tensors["k"]
    route.clear()
    CASES["qk positions out="][0](tensors)
    assert [kind for kind, *_ in route] == ["whole"]


def test_a_recipe_with_a_misaligned_pointer_replays_only_calls_misaligned_there(route):
    """The kernel is specialized on each pointer's alignment: a recipe recorded with a
    destination 4 bytes past an aligned start replays a call with its destination as far
    off, and a call whose pointers are all aligned takes the whole path."""
    def call(seed: int, misaligned: bool) -> None:
        tensors = fresh(seed)
        if misaligned:
            buffer = torch.empty(tensors["q"].numel() + 1)
            tensors["q_out"] = buffer[1:].view(tensors["q"].shape)
        CASES["qk positions out="][0](tensors)

    for seed, misaligned in ((0, True), (1, True), (2, False)):
        call(seed, misaligned)
    assert [kind for kind, *_ in route] == ["whole", "replay", "whole"]


def test_destinations_that_meet_are_refused_after_a_recipe_exists(route):
    """q_out and k_out sharing memory is refused by the whole path, also after calls with
    apart destinations were recorded and replayed (the pair is checked once, either way)."""
    call = CASES["qk positions out="][0]
    call(fresh(0))
    call(fresh(1))
    assert [kind for kind, *_ in route] == ["whole", "replay"]
    for k_at in ("start", "end"):  # of q_out's bytes
        t = fresh(2)
        q_size, k_size = t["q"].numel(), t["k"].numel()
        buffer = torch.empty(q_size)
        start = 0 if k_at == "start" else q_size - k_size
        t["q_out"] = buffer.view(t["q"].shape)
        t["k_out"] = buffer[start:start + k_size].view(t["k"].shape)
        with pytest.raises(ValueError, match="q_out shares memory with k_out"):
            call(t)
    assert len(route) == 2


def test_an_overlap_is_refused_after_a_recipe_exists(route):
    """A destination over the tables is refused by the whole path, also once calls with
    the same shapes have been replayed."""
    def tensors_in(buffer: torch.Tensor, out_at: int) -> dict[str, torch.Tensor]:
        t = fresh(0)
        cos = buffer[:64 * 8].view(64, 8)
        cos.copy_(t["cos"])
        t["cos"], t["q_out"] = cos, buffer[out_at:out_at + t["q"].numel()].view(t["q"].shape)
        return t

    call = CASES["rope out="][0]
    call(tensors_in(torch.empty(4096), 1024))
    call(tensors_in(torch.empty(4096), 1024))
    assert [kind for kind, *_ in route] == ["whole", "replay"]
    with pytest.raises(ValueError, match="out shares memory with cos"):
        call(tensors_in(torch.empty(4096), 256))


def test_a_tensor_on_another_device_than_the_first_takes_the_whole_path(route):
    """A 0-d offset or a cache slot on the host beside tensors on a GPU is read there, and
    its value moves the table rows the launch reads: such a call has no key. (On the CPU
    the first tensor's device stands for the GPU; the meta device for another one.)"""
    t = fresh(0)
    options = ("rope", "interleaved", "raise", None)
    context = replay._context(t["q"])
    tensors = (t["q"], t["cos"], t["sin"], t["offset"])
    elsewhere = (*tensors[:3], t["offset"].to("meta"))
    assert replay._key(options, tensors, context) is not None
    assert replay._key(options, elsewhere, context) is None
    CASES["qk 0-d offset"][0](t)  # recorded: its guard is known
    (known,) = [known for kinds in replay._known.values() for known in kinds]
    call = (t["q"], t["k"], t["cos"], t["sin"], t["offset"])
    assert known.guard.check(*call)
    assert not known.guard.check(*call[:4], t["offset"].to("meta"))


def test_a_pair_of_none_as_out_is_refused_after_calls_without_out(route):
    """``out=(None, None)`` is a TypeError on the whole path; a recipe of calls without
    ``out`` (whose tensors are the same) does not replay it."""
    call = CASES["qk positions"][0]
    call(fresh(0))
    call(fresh(1))
    assert [kind for kind, *_ in route] == ["whole", "replay"]
    t = fresh(2)
    for pair in ((None, None), [None, None]):
        with pytest.raises(TypeError, match="q_out must be a torch.Tensor"):
            apply_rope_qk(t["q"], t["k"], t["cos"], t["sin"], positions=t["positions"],
                          out=pair)


def test_a_replay_returns_the_destination_it_was_given(route):
    """A call whose out is another tensor at x's address with x's strides (which does not
    record autograd where x does) is another kind of call than one in place (out is x):
    its own recipe, which returns that call's out, never its x."""
    t = fresh(0)
    with torch.no_grad():
        apply_rope(t["q"], t["cos"], t["sin"], positions=t["positions"], out=t["q"])
        for seed in (1, 2):
            x = fresh(seed)["q"].requires_grad_()
            out = x.detach()
            result = apply_rope(x, t["cos"], t["sin"], positions=t["positions"], out=out)
            assert result is out and not result.requires_grad
    assert [kind for kind, *_ in route] == ["whole", "whole", "replay"]


def test_fused_q_and_k_rotated_in_place_replay_at_their_distance(route):
    """q and k rotated in place as views of one fused (batch, seq, heads, dim) projection
    share their byte ranges: replayed where they sit at the recorded distance from each
    other (what elements they share follows from it), the whole path elsewhere."""
    def fused(heads_k_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        buffer = torch.randn(4, 3, 10, 16)
        q, k = (buffer[:, :, 2:], buffer[:, :, :2]) if heads_k_first else (
            buffer[:, :, :8], buffer[:, :, 8:])
        return q.transpose(1, 2), k.transpose(1, 2)

    t = fresh(0)
    for heads_k_first in (False, False, True):
        q, k = fused(heads_k_first)
        apply_rope_qk(q, k, t["cos"], t["sin"], positions=t["positions"], inplace=True)
    assert [kind for kind, *_ in route] == ["whole", "replay", "whole"]
    kinds = [(kind, pointers) for kind, _, pointers in route]
    assert kinds[1][1][:4] != kinds[0][1][:4]  # new addresses


def test_a_call_of_a_non_tensor_names_the_argument(monkeypatch):
    """The replay's key looks at the first tensor before the whole path does: a non-tensor
    there is the whole path's TypeError, not an AttributeError."""
    cos, sin = generate_rope_embeddings(4, 8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got NoneType"):
        apply_rope(None, cos, sin)
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        apply_rope_qk([1.0], torch.randn(1, 1, 4, 8), cos, sin)


class Watcher(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("watcher", ["autograd", "dispatch mode", "function mode",
                                     "compiler", "ROPELIB_BACKEND=eager",
                                     "ROPELIB_BACKEND unset", "os.environ replaced",
                                     "kept wrapper"])
def test_a_watched_call_is_not_replayed(route, monkeypatch, watcher):
    """Where anybody could see a difference (autograd recording, a dispatch or function
    mode, a compiler tracing the call), the backend is another (``ROPELIB_BACKEND`` set to
    another or unset, also in an ``os.environ`` replaced by a dict), or x is a ``torch.func``
    wrapper kept from a finished transform (no storage of its own), the whole path runs."""
    call = CASES["rope rows"][0]
    call(fresh(0))
    route.clear()
    tensors = fresh(1)
    if watcher == "kept wrapper":
        kept = []
        torch.func.grad(lambda x: kept.append(x) or x.sum())(tensors["q"])
        tensors["q"] = kept[0]
        with torch.no_grad():
            call(tensors)
        assert [kind for kind, *_ in route] == ["whole"]
        return
    if watcher == "autograd":
        tensors["q"].requires_grad_()
        call(tensors).sum().backward()
        assert [kind for kind, *_ in route] == ["whole", "whole"]  # forward and backward
        return
    if watcher == "compiler":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    if "ROPELIB_BACKEND" in watcher or "environ" in watcher:  # unset: the C loop (CPU)
        if watcher.endswith("unset"):
            monkeypatch.delenv("ROPELIB_BACKEND")
        elif watcher.endswith("replaced"):
            monkeypatch.setattr(os, "environ", {**os.environ, "ROPELIB_BACKEND": "eager"})
        else:
            monkeypatch.setenv("ROPELIB_BACKEND", "eager")
        call(tensors)
        assert route == []
        return
    context = {"dispatch mode": Watcher(), "function mode": torch.device("cpu")}.get(
        watcher, torch.no_grad())
    with context:
        call(tensors)
    assert [kind for kind, *_ in route] == ["whole"]


def test_an_inference_destination_is_refused_outside_inference_mode(route):
    """The key holds whether each tensor is an inference tensor: a destination made under
    ``torch.inference_mode()`` is refused outside it, after replays of plain ones."""
    call = CASES["rope out="][0]
    call(fresh(0))
    call(fresh(1))
    tensors = fresh(2)
    with torch.inference_mode():
        tensors["q_out"] = torch.empty_like(tensors["q"])
    with pytest.raises(ValueError, match="out is an inference tensor"):
        call(tensors)


INNER = {  # calls not replayed whole, whose rotation (kernels.run_backend) is
    "int32 positions": lambda t: apply_rope_qk(  # converted to a new int64 tensor
        t["q"], t["k"], t["cos"], t["sin"], positions=t["positions"].int()),
    "int offset": lambda t: apply_rope(t["q"], t["cos"], t["sin"], offset=3),  # a slice
}


@pytest.mark.parametrize("name", list(INNER))
def test_the_rotation_inside_a_call_not_replayed_whole_is_replayed(route, monkeypatch,
                                                                    name):
    """A call whose launch the public call's recipe cannot express (a pointer from a tensor
    the whole path makes, or a slice that moves with an int offset) runs its whole path
    every time, and the rotation inside it is replayed from its second call on: the whole
    path's launch for the same tensors, pointer for pointer (where the whole path made a
    tensor of its own, the replay's is its own too)."""
    whole = []
    real = rotation._apply_rope if name == "int offset" else rotation._apply_rope_qk
    target = "_apply_rope" if name == "int offset" else "_apply_rope_qk"
    monkeypatch.setattr(rotation, target, lambda *a: whole.append(1) or real(*a))
    INNER[name](fresh(0))
    INNER[name](fresh(1))
    route.clear()
    tensors = fresh(2)
    replayed = as_tuple(INNER[name](tensors))
    monkeypatch.setattr(replay, "ENABLED", False)
    expected = as_tuple(INNER[name](tensors))
    assert len(whole) == 4
    (kind, launch, pointers), (_, whole_launch, whole_pointers) = route
    assert kind == "replay" and launch == whole_launch
    new = {r.data_ptr(): i for i, r in enumerate(expected)}
    given = {t.data_ptr() for t in tensors.values()}
    for p, w in zip(pointers, whole_pointers, strict=True):
        if w in new:
            assert p == replayed[new[w]].data_ptr()
        elif w in given:
            assert p == w
        else:  # a tensor the whole path made for itself (the int64 positions)
            assert p not in given


def test_a_training_steps_rotations_are_replayed(route):
    """Forward and backward of an eager training step (x records autograd, so the public
    call is not replayed whole): from the second step on, the forward's rotation and the
    backward's inverse rotation are each one replayed launch, into the output and into
    x's gradient."""
    for seed in range(3):
        route.clear()
        tensors = fresh(seed)
        q = tensors["q"].requires_grad_()
        y = apply_rope(q, tensors["cos"], tensors["sin"], layout="half")
        grad = torch.randn_like(y)
        y.backward(grad)
    (kind, forward, pointers), (kind_back, backward, back_pointers) = route
    assert (kind, kind_back) == ("replay", "replay")
    assert dict(forward.constexprs)["INVERSE"] is False
    assert dict(backward.constexprs)["INVERSE"] is True
    assert pointers[:2] == (q.data_ptr(), y.data_ptr())
    assert back_pointers[:2] == (grad.data_ptr(), q.grad.data_ptr())


def test_a_training_steps_rotation_of_q_and_k_is_replayed(route):
    """apply_rope_qk in a training step (as an attention module makes it): from the second
    step on, one replayed launch each way, for q and k together."""
    for seed in range(3):
        route.clear()
        tensors = fresh(seed)
        q, k = tensors["q"].requires_grad_(), tensors["k"].requires_grad_()
        q_rot, k_rot = apply_rope_qk(q, k, tensors["cos"], tensors["sin"], layout="half")
        torch.autograd.backward((q_rot, k_rot), (torch.randn_like(q), torch.randn_like(k)))
    assert [(kind, dict(launch.constexprs)["INVERSE"]) for kind, launch, _ in route] == [
        ("replay", False), ("replay", True)]


def test_recipes_hold_no_tensor(route):
    """A recipe keeps numbers, dtypes and the launch, nothing of the call's tensors."""
    tensors = fresh(0)
    CASES["qk positions out="][0](tensors)
    watched = [weakref.ref(t) for t in tensors.values()]
    del tensors
    gc.collect()
    assert all(ref() is None for ref in watched)
    assert len(replay._recipes) == 1


def test_threads_replay_their_own_calls(route):
    """Threads calling at once (two with the same shapes, one with others) each get the
    launches a lone call of theirs gets: recording is per thread."""
    shapes = [(4, 3), (4, 3), (2, 5)]

    def call(batch: int, seq: int) -> None:
        cos, sin = generate_rope_embeddings(64, 16)
        q, k = torch.randn(batch, 8, seq, 16), torch.randn(batch, 2, seq, 16)
        apply_rope_qk(q, k, cos, sin, positions=torch.randint(0, 64, (batch, seq)))

    alone = {}
    for shape in shapes:
        call(*shape)
        alone[shape] = route[-1][1]
    replay.clear()
    route.clear()
    start = threading.Barrier(len(shapes))

    def work(shape: tuple[int, int]) -> None:
        start.wait()
        for _ in range(30):
            call(*shape)

    threads = [threading.Thread(target=work, args=(shape,)) for shape in shapes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(route) == 90
    assert sorted(str(launch) for _, launch, _ in route) == sorted(
        str(alone[shape]) for shape in shapes for _ in range(30))
    assert sum(kind == "replay" for kind, *_ in route) >= 90 - 2 * len(shapes)


@pytest.mark.parametrize("layout", ["(B, H, S, D)", "(B, S, H, D) view", "size-1 dims",
                                    "a slice", "strided channels"])
def test_a_planned_new_output_has_the_strides_it_will_be_made_with(layout):
    """The Triton backend plans a new output's strides from its x's (shape, strides, dtype)
    alone; ``eager.new_output`` then makes it: both agree, on a GPU (x's order of dims kept,
    densely, where x's channels are contiguous: PyTorch's preserve_format) and on the CPU
    (contiguous)."""
    from ropelib import eager

    base = torch.randn(2, 6, 3, 16)
    x = {"(B, H, S, D)": base.transpose(1, 2).contiguous(),
         "(B, S, H, D) view": base.transpose(1, 2),
         "size-1 dims": torch.randn(1, 6, 1, 16).transpose(1, 2),
         "a slice": base.transpose(1, 2)[:, :2],
         "strided channels": torch.randn(2, 3, 16, 6).transpose(-1, -2)}[layout]
    for gpu in (True, False):
        planned = triton_rope._new_strides(triton_rope._meta(x), gpu)
        assert planned == eager.new_output(x, gpu).stride()
    on_gpu = {"strided channels": x.contiguous().stride(),  # the kernel's channels: stride 1
              "a slice": x.transpose(1, 2).contiguous().transpose(1, 2).stride()  # dense
              }.get(layout, x.stride())
    assert eager.new_output(x, True).stride() == on_gpu
    assert eager.new_output(x, False).is_contiguous()
