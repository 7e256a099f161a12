"""What a call on a GPU issues, counted on the CPU (issue 44, items 1, 2 and 5).

On a GPU every PyTorch operation is a launch of several microseconds, more than the
rotation of a decode step costs. A CUDA call of ``apply_rope`` / ``apply_rope_qk`` with
positions, a 0-d offset tensor or M-RoPE axes must issue exactly one launch of the Triton
kernel and no other device operation: the range checks of the coordinates run inside that
launch. Here CPU tensors take the route of CUDA tensors (``rotation._on_device`` says yes,
``ROPELIB_BACKEND=triton``), the launch is stubbed and recorded, and a
``TorchDispatchMode`` records every ATen operation the call makes; any operation but views
and the allocation of the new outputs fails the test. The same route then runs through
Triton's interpreter, against float64 references, and with the interpreter's device-side
assertions on, bad coordinates fail with a message that names them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from reference import angles, rope_by_pairs, thetas
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import (
    KVCache,
    StandardAttentionWithRoPE,
    _checks,
    apply_rope,
    apply_rope_qk,
    apply_rope_qk_to_cache,
    attention,
    kernels,
    masks,
    rotation,
)
from ropelib.tables import generate_rope_embeddings

pytest.importorskip("triton")
triton_rope = pytest.importorskip("ropelib.triton_rope")
interpreter = pytest.importorskip("triton.runtime.interpreter")

F64 = torch.float64
ALLOCATIONS = {"empty_like", "empty", "empty_strided", "new_empty"}


class Recorder(TorchDispatchMode):
    """Every ATen operation run under it, by name, but those on meta tensors (which hold no
    memory and run nothing: the Triton backend plans a new output's strides on one)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[torch._ops.OpOverload] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if not (isinstance(result, torch.Tensor) and result.is_meta):
            self.ops.append(func)
        return result

    def device_work(self) -> list[str]:
        """The operations that would run on the device: all but views and allocations."""
        return [str(op) for op in self.ops
                if not op.is_view and op.overloadpacket.__name__ not in ALLOCATIONS]

    def allocations(self) -> int:
        return sum(op.overloadpacket.__name__ in ALLOCATIONS for op in self.ops)


def take_device_route(monkeypatch) -> None:
    """CPU tensors on the route of CUDA tensors: values not read on the host, the Triton
    backend; the recorder does not count as a dispatch mode for ``plain_call`` (it stands
    for nobody watching)."""
    monkeypatch.setenv("ROPELIB_BACKEND", "triton")
    monkeypatch.setattr(rotation, "_on_device", lambda t: True)
    monkeypatch.setattr(_checks, "is_in_torch_dispatch_mode", lambda: False)


@pytest.fixture
def device_route(monkeypatch):
    """``take_device_route`` for the test."""
    take_device_route(monkeypatch)


@pytest.fixture
def launches(device_route, monkeypatch):
    """The stubbed launches, each's prepared ``Launch`` (no tensor kept: a reference held
    here would make autograd copy a gradient it could otherwise take as it is)."""
    calls = []
    monkeypatch.setattr(triton_rope, "_launch", lambda x, launch, tensors: calls.append(launch))
    return calls


def decode_inputs():
    cos, sin = generate_rope_embeddings(64, 16)
    q, k = torch.randn(4, 8, 1, 16), torch.randn(4, 2, 1, 16)
    return q, k, cos, sin


CASES = {  # name: (call, new outputs, constexprs the launch must have)
    "qk positions out=": (lambda q, k, c, s, p, o, a, m: apply_rope_qk(
        q, k, c, s, layout="half", positions=p, out=(o[0], o[1])), 0, {"MODE": 1, "CHECK": True}),
    "qk positions": (lambda q, k, c, s, p, o, a, m: apply_rope_qk(
        q, k, c, s, positions=p), 2, {"MODE": 1, "CHECK": True}),
    "qk in place": (lambda q, k, c, s, p, o, a, m: apply_rope_qk(
        o[0], o[1], c, s, positions=p, inplace=True), 0, {"MODE": 1, "BLOCK_R": 0}),
    "offset tensor": (lambda q, k, c, s, p, o, a, m: apply_rope(
        q, c, s, offset=o[2]), 1, {"MODE": 1, "STEP": True, "CHECK": True}),
    "repeat_last": (lambda q, k, c, s, p, o, a, m: apply_rope(
        q, c, s, positions=p, short_table="repeat_last"), 1, {"CLAMP": True}),
    "M-RoPE axes": (lambda q, k, c, s, p, o, a, m: apply_rope_qk(
        q, k, c, s, layout="half", positions=m, axes=a), 2, {"MODE": 2, "CHECK": True}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_device_call_is_one_launch_and_nothing_else(launches, name):
    """One launch per call, the range check inside it (CHECK), and no other operation: no
    comparison, reduction, assertion, clamp or arange on the device, no host read."""
    call, new, constexprs = CASES[name]
    q, k, cos, sin = decode_inputs()
    positions = torch.randint(0, 64, (4, 1))
    outs = (torch.empty_like(q), torch.empty_like(k), torch.tensor(5))
    axes, mrope = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), torch.randint(0, 64, (1, 3))
    with Recorder() as recorder:
        call(q, k, cos, sin, positions, outs, axes, mrope)
    assert len(launches) == 1
    assert recorder.device_work() == []
    assert recorder.allocations() == new
    assert dict(launches[0].constexprs).items() >= constexprs.items()


class CountingEnviron(dict):
    """A copy of the environment that counts the reads of ``ROPELIB_BACKEND``."""

    reads = 0

    def get(self, key, default=None):
        self.reads += key == "ROPELIB_BACKEND"
        return super().get(key, default)

    def __getitem__(self, key):
        self.reads += key == "ROPELIB_BACKEND"
        return super().__getitem__(key)


@pytest.mark.parametrize("name", ["qk positions out=", "qk in place", "qk new", "out=",
                                  "in place", "0-d offset", "cache"])
def test_a_later_call_of_a_signature_checks_only_addresses(launches, monkeypatch, name):
    """The first call of a signature runs every check and keeps a plan; a later call with
    the same signature (issue 56, item 1) reads ``ROPELIB_BACKEND`` once, asks no backend
    (``choose_backend``), keys no tensor for the kernel's verdict (``triton_rope._meta``)
    and works out no tensor's span of addresses (the plan holds their extents), and
    launches once."""
    q, k, cos, sin = decode_inputs()
    positions = torch.randint(0, 64, (4, 1))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    caches = torch.zeros(2, 4, 2, 8, 16)
    call = {
        "qk positions out=": lambda: apply_rope_qk(q, k, cos, sin, positions=positions,
                                                   out=(q_out, k_out)),
        "qk in place": lambda: apply_rope_qk(q, k, cos, sin, positions=positions,
                                             inplace=True),
        "qk new": lambda: apply_rope_qk(q, k, cos, sin, positions=positions),
        "out=": lambda: apply_rope(q, cos, sin, positions=positions, out=q_out),
        "in place": lambda: apply_rope(q, cos, sin, positions=positions, out=q),
        "0-d offset": lambda: apply_rope(q, cos, sin, offset=torch.tensor(3)),
        "cache": lambda: apply_rope_qk_to_cache(q, k, k.clone(), cos, sin, *caches,
                                                torch.tensor(3)),
    }[name]
    call()
    environ = CountingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    checks = []
    for module, attribute in ((triton_rope, "_meta"), (kernels, "byte_span"),
                              (kernels, "choose_backend")):
        real = getattr(module, attribute)
        monkeypatch.setattr(module, attribute, lambda *a, _n=attribute, _r=real: (
            checks.append(_n), _r(*a))[1])
    for _ in range(3):
        call()
    assert len(launches) == 4 and environ.reads == 3 and checks == []


def test_threads_share_the_plans_and_get_their_own_launches(launches, monkeypatch):
    """Threads calling at once, some with the same signature (one ``rotation.Plan``, made by
    whichever thread comes first) and some with others, each get the launch a lone call of
    theirs gets (those equal the float64 rotation: test_the_device_route_equals_float64).
    The launches are stubbed: Triton's interpreter itself is not thread-safe."""
    import threading

    cos, sin = generate_rope_embeddings(12, 16)
    cases = [("half", 3), ("half", 3), ("interleaved", 3), ("half", 5), ("interleaved", 5)]

    def call(layout: str, seq: int) -> None:
        q, k = torch.randn(2, 4, seq, 16), torch.randn(2, 2, seq, 16)
        apply_rope_qk(q, k, cos, sin, layout=layout, positions=torch.randint(0, 12, (2, seq)))

    alone = []
    for case in cases:
        call(*case)
        alone.append(launches.pop())
    rotation._plans.clear()
    seen = {}
    monkeypatch.setattr(triton_rope, "_launch", lambda x, launch, tensors: seen.setdefault(
        threading.get_ident(), []).append(launch))
    start = threading.Barrier(len(cases))

    def work(case: tuple[str, int]) -> None:
        start.wait()
        for _ in range(50):
            call(*case)
        seen[threading.get_ident()].append(case)

    threads = [threading.Thread(target=work, args=(case,)) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = {ran[-1]: ran[:-1] for ran in seen.values()}
    assert len(seen) == len(cases) and len(rotation._plans) == 4  # one a layout and length
    for case, launch in zip(cases, alone, strict=True):
        assert got[case] == [launch] * 50


@pytest.mark.parametrize("storage", ["(B, H, S, D)", "(B, S, H, D)"])
def test_a_strided_view_takes_the_same_route(launches, storage):
    """x as a (B, S, H, D) view costs nothing more than a contiguous x: one launch, no copy
    of x or of the output, new output only where none is given (item 5)."""
    cos, sin = generate_rope_embeddings(6, 16)
    x = torch.randn(2, 3, 6, 16) if storage == "(B, H, S, D)" else torch.randn(
        2, 6, 3, 16).transpose(1, 2)
    buffer, work = torch.empty_like(x), x.clone()
    for call, new in ((lambda: apply_rope(x, cos, sin, layout="half"), 1),
                      (lambda: apply_rope(x, cos, sin, layout="half", out=buffer), 0),
                      (lambda: apply_rope(work, cos, sin, layout="half", out=work), 0)):
        launches.clear()
        with Recorder() as recorder:
            call()
        assert len(launches) == 1 and recorder.device_work() == []
        assert recorder.allocations() == new


AXES = torch.tensor([0, 1, 1, 2, 0, 1, 2, 2])
ROWS_AT = torch.tensor([[3, 0, 11, 7, 7], [1, 2, 9, 4, 10]])  # (batch, seq) in a 12-row table
TOKENS_AT = torch.tensor([[0, 4, 9], [1, 4, 9], [2, 5, 9], [3, 5, 10], [11, 6, 10]])  # (t, h, w)
TRAINED = {  # name: (the call's keywords, the angles of its 5 rows' 8 pairs, (seq, pairs) or
    # (batch, 1, seq, pairs), and constexprs both launches have)
    "rows": ({}, angles(torch.arange(5), thetas(16)), {"CHECK": False}),
    "positions": ({"positions": ROWS_AT}, angles(ROWS_AT, thetas(16))[:, None],
                  {"CHECK": True}),
    "0-d offset": ({"offset": torch.tensor(7)}, angles(torch.arange(7, 12), thetas(16)),
                   {"STEP": True, "CHECK": True}),
    "repeat_last": ({"positions": torch.tensor([3, 11, 12, 40, 0]),
                     "short_table": "repeat_last"},
                    angles(torch.tensor([3, 11, 11, 11, 0]), thetas(16)), {"CLAMP": True}),
    "M-RoPE axes": ({"positions": TOKENS_AT, "axes": AXES},
                    TOKENS_AT.to(F64)[:, AXES] * thetas(16), {"MODE": 2, "CHECK": True}),
}


def trained(rotate: str, where: dict) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                               Callable[[], list[torch.Tensor]]]:
    """A training step's inputs (x, or q and k, recording autograd), their grads to come and
    the forward: ``rotate`` is ``apply_rope`` or ``apply_rope_qk``."""
    xs = [torch.randn(2, 4, 5, 16, requires_grad=True)]
    if rotate == "apply_rope_qk":
        xs.append(torch.randn(2, 2, 5, 16, requires_grad=True))
    cos, sin = generate_rope_embeddings(12, 16)
    grads = [torch.randn(x.shape) for x in xs]
    if rotate == "apply_rope":
        return xs, grads, lambda: [apply_rope(xs[0], cos, sin, layout="half", **where)]
    return xs, grads, lambda: list(apply_rope_qk(*xs, cos, sin, layout="half", **where))


@pytest.mark.parametrize("name", list(TRAINED))
@pytest.mark.parametrize("rotate", ["apply_rope", "apply_rope_qk"])
def test_a_training_step_is_one_launch_each_way(launches, rotate, name):
    """Training (for apply_rope_qk, an attention module's step): the forward is one launch
    into the new outputs, the backward one launch of the inverse rotation into the new
    gradients, with positions, a 0-d offset, repeat_last and M-RoPE too: the coordinates'
    range is checked (and clamped, and a 0-d offset spelled out) inside both launches, as
    in a call without autograd; no table gradient, no copy, no other operation (item 2)."""
    xs, grads, forward_call = trained(rotate, TRAINED[name][0])
    with Recorder() as forward:
        outputs = forward_call()
    with Recorder() as backward:
        torch.autograd.backward(outputs, grads)
    assert [dict(launch.constexprs)["INVERSE"] for launch in launches] == [False, True]
    for launch in launches:
        constexprs = dict(launch.constexprs)
        assert {key: constexprs[key] for key in TRAINED[name][2]} == TRAINED[name][2]
    for recorder in (forward, backward):
        assert recorder.device_work() == [] and recorder.allocations() == len(xs)


@pytest.mark.parametrize("name", list(TRAINED))
@pytest.mark.parametrize("rotate", ["apply_rope", "apply_rope_qk"])
def test_a_training_steps_gradients_on_the_device_route_equal_float64(device_route, rotate,
                                                                      name):
    """The same steps through Triton's interpreter: each gradient is its output's gradient
    rotated back by each row's angles (R_Theta^T = R_{-Theta}), against float64."""
    xs, grads, forward_call = trained(rotate, TRAINED[name][0])
    torch.autograd.backward(forward_call(), grads)
    for x, grad in zip(xs, grads, strict=True):
        torch.testing.assert_close(x.grad.to(F64), rope_by_pairs(grad, -TRAINED[name][1],
                                                                 "half"),
                                   rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", list(TRAINED))
def test_a_training_steps_double_backward_on_the_device_route_equals_float64(device_route,
                                                                          name):
    """With ``create_graph=True`` the gradient R_Theta^T g is itself differentiable (through
    the operator, its pending coordinates made plain first): its derivative along v is
    R_Theta v, against float64."""
    where, table, _ = TRAINED[name]
    x = torch.randn(2, 4, 5, 16, requires_grad=True)
    cos, sin = generate_rope_embeddings(12, 16)
    grad = torch.randn(2, 4, 5, 16, requires_grad=True)
    (grad_x,) = torch.autograd.grad(apply_rope(x, cos, sin, layout="half", **where), x, grad,
                                    create_graph=True)
    v = torch.randn(2, 4, 5, 16)
    (along,) = torch.autograd.grad(grad_x, grad, v)
    torch.testing.assert_close(along.to(F64), rope_by_pairs(v, table, "half"), rtol=2e-6,
                               atol=2e-6)


@pytest.mark.parametrize("name", ["positions", "offset"], ids=["positions", "0-d offset"])
def test_coordinates_changed_before_the_backward_are_an_error(device_route, name):
    """A training step keeps the coordinates it was given for its backward (no copy): ones
    changed in place before the backward stop it with autograd's error, never a gradient
    at other positions."""
    where = {name: torch.arange(5) if name == "positions" else torch.tensor(3)}
    x = torch.randn(2, 4, 5, 16, requires_grad=True)
    cos, sin = generate_rope_embeddings(12, 16)
    y = apply_rope(x, cos, sin, **where)
    where[name] += 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(torch.randn_like(y))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_the_device_route_equals_float64(device_route, layout):
    """The same calls through Triton's interpreter: positions, a 0-d offset tensor (row s at
    offset + s), repeat_last (clamped in the kernel) and M-RoPE, each against the float64
    rotation; and their gradient, the inverse rotation."""
    q, k, cos, sin = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16), *(
        generate_rope_embeddings(12, 16))
    positions = torch.randint(0, 12, (2, 5))

    def want(x, p):
        return rope_by_pairs(x, angles(p, thetas(16)), layout)

    tol = {"rtol": 2e-6, "atol": 2e-6}
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions)
    torch.testing.assert_close(q_rot.to(F64), want(q, positions[:, None]), **tol)
    torch.testing.assert_close(k_rot.to(F64), want(k, positions[:, None]), **tol)
    torch.testing.assert_close(apply_rope(q, cos, sin, layout=layout, offset=torch.tensor(7))
                               .to(F64), want(q, torch.arange(7, 12)), **tol)
    past = torch.tensor([3, 11, 12, 40, 0])  # 12 and 40 read the last row, 11
    torch.testing.assert_close(
        apply_rope(q, cos, sin, layout=layout, positions=past, short_table="repeat_last")
        .to(F64), want(q, past.clamp_max(11)), **tol)
    axes = torch.tensor([0, 1, 1, 2, 0, 1, 2, 2])
    mrope = torch.randint(0, 12, (5, 3))
    table = mrope.to(F64)[:, axes] * thetas(16)  # (seq, pairs): pair i at coordinate axes[i]
    torch.testing.assert_close(apply_rope(q, cos, sin, layout=layout, positions=mrope,
                                          axes=axes).to(F64), rope_by_pairs(q, table, layout),
                               **tol)
    x = q.clone().requires_grad_()
    apply_rope(x, cos, sin, layout=layout, offset=torch.tensor(2)).backward(k.repeat(1, 2, 1, 1))
    torch.testing.assert_close(x.grad.to(F64), rope_by_pairs(
        k.repeat(1, 2, 1, 1), -angles(torch.arange(2, 7), thetas(16)), layout), **tol)


@pytest.mark.parametrize("backend", ["native", "eager"])
def test_other_backends_settle_the_pending_coordinates(device_route, monkeypatch, backend):
    """A backend other than the kernel gets the coordinates made plain first (the rows of
    an offset spelled out, clamped, their range asserted with PyTorch operations)."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    cos, sin = generate_rope_embeddings(12, 16)
    q = torch.randn(2, 4, 5, 16)
    torch.testing.assert_close(
        apply_rope(q, cos, sin, offset=torch.tensor(7)).to(F64),
        rope_by_pairs(q, angles(torch.arange(7, 12), thetas(16))), rtol=2e-6, atol=2e-6)
    past = torch.tensor([3, 11, 12, 40, 0])
    torch.testing.assert_close(
        apply_rope(q, cos, sin, positions=past, short_table="repeat_last").to(F64),
        rope_by_pairs(q, angles(past.clamp_max(11), thetas(16))), rtol=2e-6, atol=2e-6)
    with pytest.raises(RuntimeError, match="positions must be >= 0 and < the cos/sin table"):
        apply_rope(q, cos, sin, offset=torch.tensor(8))


@pytest.fixture
def assertions_on(device_route, monkeypatch):
    """Triton's interpreter with its device-side assertions on (as the CUDA kernel is
    compiled): a failed one raises, with the kernel's message."""
    monkeypatch.setattr(interpreter.interpreter_builder, "options",
                        interpreter.InterpreterOptions(debug=True, sanitize_overflow=False))


@pytest.mark.parametrize(("call", "message"), [
    (lambda q, c, s: apply_rope(q, c, s, positions=torch.tensor([0, 1, 12, 3, 4])),
     "positions must be >= 0 and < the cos/sin table length"),
    (lambda q, c, s: apply_rope(q, c, s, positions=torch.tensor([0, -1, 2, 3, 4]),
                                short_table="repeat_last"), "positions must be >= 0"),
    (lambda q, c, s: apply_rope(q, c, s, offset=torch.tensor(8)),
     "offset \\+ row must be >= 0 and < the cos/sin table length"),
    (lambda q, c, s: apply_rope(q, c, s, positions=torch.zeros(5, 2, dtype=torch.long),
                                axes=torch.tensor([0, 1, 2, 0, 1, 0, 1, 0])),
     "axes must be in \\[0, k\\)"),
], ids=["past the table", "negative, repeat_last", "offset past the table", "axis"])
@pytest.mark.parametrize("trains", [False, True], ids=["no grad", "training"])
def test_the_kernel_names_what_is_out_of_range(assertions_on, call, message, trains):
    """The range checks left to the kernel fail by name (on a GPU: a device-side assertion
    with this message, then an error at the next synchronization), also in a training
    step's forward."""
    cos, sin = generate_rope_embeddings(12, 16)
    with pytest.raises(interpreter.InterpreterError, match=message):
        call(torch.randn(2, 4, 5, 16, requires_grad=trains), cos, sin)


def test_a_compiled_module_slices_its_tables_instead_of_computing_rows():
    """torch.compile of the attention module without positions (a prefill, item 3): the
    graph holds the rotation operator on a slice of the module's tables, and no arange, no
    float64 angles, cos or sin (which the graph computed at every call before, while the
    eager module sliced the same tables); its output equals the eager module's."""
    module = StandardAttentionWithRoPE(64, 4, num_kv_heads=2, bias=False, layout="half").eval()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(1, 32, 64)
    with torch.no_grad():
        compiled = torch.compile(module, backend=capture, fullgraph=True)(x, x, x,
                                                                          is_causal=True)
        torch.testing.assert_close(compiled, module(x, x, x, is_causal=True))
    code = graphs[0].code
    assert code.count("torch.ops.ropelib.rotate_qk.default") == 1
    for computed in ("arange", "torch.cos", "torch.sin", "float64"):
        assert computed not in code, computed


def module_steps():
    """A module with RoPE and one without (the same shapes), 3 rows of one new token each,
    and the slot of the step."""
    kw = {"num_kv_heads": 2, "bias": False, "layout": "half"}
    return (StandardAttentionWithRoPE(64, 4, **kw).eval(),
            StandardAttentionWithRoPE(64, 4, rope=False, **kw).eval(),
            torch.randn(3, 1, 64), torch.tensor(5))


def test_the_module_decode_step_fused_issues_the_step_without_rope_less_its_writes(
        launches, monkeypatch):
    """The attention module's ``cache_position`` step on the device route (its slots not
    read on the host): with RoPE fused with the cache write it issues exactly the operations
    of the same step without RoPE, less that step's two cache writes (``index_copy_``) and
    its assertion of the slots' range (four operations and the assertion, which the fused
    launch makes itself), plus the one launch."""
    with_rope, without, x, slot = module_steps()
    monkeypatch.setattr(attention, "_on_host", lambda slots: False)
    work = {}
    with torch.no_grad():
        for module in (with_rope, without):
            cache = KVCache(capacity=16)
            module(x, x, x, kv_cache=cache, cache_position=slot)  # the buffers made
            launches.clear()
            with Recorder() as recorder:
                module(x, x, x, kv_cache=cache, cache_position=slot)
            work[module] = (Counter(op.split(".")[1] for op in recorder.device_work()),
                            len(launches))
    (fused, fused_launches), (plain, plain_launches) = work[with_rope], work[without]
    assert (fused_launches, plain_launches) == (1, 0)
    assert fused - plain == Counter()
    assert plain - fused == Counter({"index_copy_": 2, "ge": 1, "lt": 1, "bitwise_and": 1,
                                     "all": 1, "_assert_async": 1})


def test_the_module_decode_step_on_the_device_route_equals_the_host_route(monkeypatch):
    """The same fused step through the Triton kernel (the interpreter), its slots left to
    the launch, against the host's route (the slots read and checked first, then the
    compiled loop or PyTorch): the same output, keys and values in the cache's slot."""
    module, _, x, slot = module_steps()
    results = []
    for route in ("host", "device"):
        if route == "device":  # device_route's settings, and the slots left to the launch
            take_device_route(monkeypatch)
            monkeypatch.setattr(attention, "_on_host", lambda slots: False)
        cache = KVCache(capacity=16)
        with torch.no_grad():
            out = module(x, x, x, kv_cache=cache, cache_position=slot)
        results.append((out, cache._key_buffer[..., 5, :], cache._value_buffer[..., 5, :]))
    for host, device in zip(*results, strict=True):
        assert host.abs().sum() > 0
        torch.testing.assert_close(device, host, rtol=1e-5, atol=1e-5)


def test_the_module_decode_step_without_a_mask_finds_no_empty_rows(launches, monkeypatch):
    """A ``cache_position`` step without ``attn_mask`` masks each query to the slots up to
    its own, so no row is empty: on the device route (mask values not read) it issues no
    search for empty rows and no zeroing (``any``, ``bitwise_not``, ``bitwise_or``,
    ``masked_fill``), which a step with a padding mask (that may hide a row's every slot)
    still issues. (Its values: the decode tests, where the CPU takes the same path.)"""
    module, _, x, slot = module_steps()
    monkeypatch.setattr(masks, "_on_device", lambda t: True)
    monkeypatch.setattr(attention, "_on_host", lambda slots: False)
    padding = torch.ones(3, 1, 1, 16, dtype=torch.bool)
    padding[0, ..., :6] = False  # row 0 hides every slot up to its own: an empty row
    empty_row_ops = {"any", "bitwise_not", "bitwise_or", "masked_fill"}
    for attn_mask, issued in ((None, set()), (padding, empty_row_ops)):
        with torch.no_grad(), Recorder() as recorder:
            module(x, x, x, kv_cache=KVCache(capacity=16), cache_position=slot,
                   attn_mask=attn_mask)
        work = {op.split(".")[1] for op in recorder.device_work()}
        assert work & empty_row_ops == issued, work
