"""Multi-axis RoPE under a hostile user (issue 33, items 1, 2, 6-10, 13).

Every expected value comes from an independent reference: float64 angles written from the
definition (``sum_a p_a W[i, a]``), PyTorch's own indexing, or the 1D module's behaviour.
The data race runs in a fresh interpreter, so that a crash (a read past a table) fails the
test instead of the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import (
    RoPEMixed,
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    apply_rope,
    axis_frequencies,
    kernels,
    mrope_positions,
    rope_frequencies,
)
from ropelib.multiaxis import axis_rows

F64 = torch.float64


def run_isolated(code: str, timeout: float = 240) -> str:
    """Run ``code`` in a fresh interpreter (this ropelib); fail on a non-zero exit, a crash
    included; return what it printed."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=timeout, env=os.environ.copy())
    assert result.returncode == 0, (
        f"exit status {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result.stdout


# --------------------------------------------------------------------------- item 1

RACE = """
import sys, threading, time
import torch
from ropelib import RotaryEmbedding, StandardAttentionWithRoPE, axis_frequencies

sys.setswitchinterval(1e-6)
torch.set_num_threads(1)
W = axis_frequencies(16, [2, 3, 3], base=100.0)
THREADS, ROUNDS, SECONDS = 4, 40, 20.0


def exact(p):
    angles = p.to(torch.float64) @ W.T  # W holds one nonzero per pair: an exact product
    return angles.cos(), angles.sin()


def race(make, call, check):
    '''ROUNDS fresh shared objects (or SECONDS, whichever ends first), each called by THREADS
    threads with rising positions; returns the problems seen (wrong rows, errors).'''
    problems, stop = [], time.monotonic() + SECONDS
    for _ in range(ROUNDS):
        if time.monotonic() > stop:
            break
        shared, start = make(), threading.Barrier(THREADS)

        def work(seed):
            g = torch.Generator().manual_seed(seed)
            start.wait()
            for step in range(1, 60):
                high = 1 + step * (seed + 5) * 3  # each thread rises at its own pace
                p = torch.randint(0, high, (33, 3), generator=g)
                p[0] = high - 1
                try:
                    error = check(p, call(shared, p))
                except Exception as e:  # noqa: BLE001 (every error is a finding here)
                    problems.append(repr(e)[:200])
                    return
                if error > 1e-6:
                    problems.append(f"rows off by {error:.3g} at max position {high - 1}")
                    return

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return problems


def rows_error(p, rows):
    cos, sin = exact(p)
    return max((rows[0].double() - cos).abs().max().item(),
               (rows[1].double() - sin).abs().max().item())


torch.manual_seed(0)
attn = StandardAttentionWithRoPE(32, 2, frequencies=W, max_position_embeddings=1)
x = torch.randn(1, 33, 32)
fresh = StandardAttentionWithRoPE(32, 2, frequencies=W, max_position_embeddings=4096)
fresh.load_state_dict(attn.state_dict())


def attention_error(p, out):
    with torch.no_grad():  # a module that never grows (its cache covers every position)
        return (out - fresh(x, x, x, positions=p)).abs().max().item()


def shared_attention():
    attn.rotary = StandardAttentionWithRoPE(32, 2, frequencies=W,
                                            max_position_embeddings=1).rotary
    return attn


found = race(lambda: RotaryEmbedding(16, frequencies=W, max_position_embeddings=1),
             lambda rotary, p: rotary(positions=p), rows_error)
with torch.no_grad():
    found += race(shared_attention, lambda module, p: module(x, x, x, positions=p),
                  attention_error)
print(len(found), "problems")
assert not found, found[:5]
"""


def test_item1_threads_sharing_a_multi_axis_module_get_exact_rows():
    """Four threads call one ``RotaryEmbedding(frequencies=W)`` (then one shared attention
    module) with rising positions while Python switches threads every microsecond: every
    row equals the float64 angles and no call raises. The old cache replaced cos and sin one
    after the other and let a smaller build overwrite a bigger one."""
    run_isolated(RACE, timeout=200)


# --------------------------------------------------------------------------- item 2


def _tables(length=100, pairs=4):
    """cos/sin tables of the diagonal, float32, from float64 angles m * theta_i."""
    theta = 100.0 ** (-torch.arange(pairs, dtype=F64) / pairs)
    angles = torch.arange(length, dtype=F64)[:, None] * theta
    return angles.cos().float(), angles.sin().float(), angles


AXES = torch.tensor([0, 1, 2, 0])
BAD_PAIRS = {  # (cos, sin) pairs an operator must refuse before its loop reads them
    "sin shorter": lambda c, s: (c, s[:10].clone()),
    "sin narrower": lambda c, s: (c, s[:, :2].clone()),
    "sin float64": lambda c, s: (c, s.double()),
    "sin on another device": lambda c, s: (c, s.to("meta")),
}


def _call(op, cos, sin, positions=None, axes=None):
    x = torch.ones(1, 100, 8)
    if op == "axis_rows":
        return axis_rows(cos, sin, positions[0], axes)
    if op == "rotate":
        return torch.ops.ropelib.rotate(x, cos, sin, "half", 8, False, positions, axes)
    with Passthrough():  # watched, out= is the operator and a copy into out
        return kernels.rotate_each([x], [torch.empty_like(x)], cos, sin, "half", 8, False,
                                   positions, axes)


class Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", BAD_PAIRS)
@pytest.mark.parametrize("op", ["axis_rows", "rotate", "rotate_into_out", "rotate with axes",
                                "rotate_into_out with axes"])
def test_item2_every_operator_checks_its_table_pair_before_the_loop(op, case):
    """``axis_rows(cos100, sin[:10].clone(), ...)`` used to be accepted
    and read past sin's memory (as did ropelib::rotate and the out= operator called
    directly)."""
    cos, sin, _ = _tables()
    cos, sin = BAD_PAIRS[case](cos, sin)
    positions = axes = None
    if op == "axis_rows" or op.endswith("axes"):
        positions, axes = torch.randint(0, 100, (1, 100, 3)), AXES
    with pytest.raises(ValueError, match=r"cos and sin must have the same shape, dtype and "
                                         r"device, got \(100, 4\) torch.float32 on cpu and"):
        _call(op.split()[0], cos, sin, positions, axes)


BAD_OPERANDS = {
    "axis_rows short pair_axes": (
        lambda c, s, p: axis_rows(c, s, p[0], torch.tensor([0])),
        r"pair_axes must have shape \(4,\) \(one axis per column of the tables\), got \(1,\)"),
    "axis_rows 1-D positions": (
        lambda c, s, p: axis_rows(c, s, p[0, 0], AXES),
        r"positions must have shape \(\.\.\., seq, k\), got \(3,\)"),
    "axis_rows float positions": (
        lambda c, s, p: axis_rows(c, s, p[0].float(), AXES),
        r"positions must be an integer tensor, got torch.float32"),
    "rotate short rows": (
        lambda c, s, p: torch.ops.ropelib.rotate(torch.ones(1, 100, 8), c[:5].clone(),
                                                 s[:5].clone(), "half", 8),
        r"cos/sin rows \(5, 4\) do not broadcast to x's rows \(1, 100, 4\)"),
    "rotate narrow tables": (
        lambda c, s, p: torch.ops.ropelib.rotate(torch.ones(1, 100, 8), c[:, :2].clone(),
                                                 s[:, :2].clone(), "half", 8),
        r"cos/sin must have rotary_dim // 2 = 4 columns, got shape \(100, 2\)"),
    "rotate short axes": (
        lambda c, s, p: torch.ops.ropelib.rotate(torch.ones(1, 100, 8), c, s, "half", 8,
                                                 False, p, torch.tensor([0])),
        r"axes must have shape \(4,\) \(one axis per pair\), got \(1,\)"),
    "rotate short positions": (
        lambda c, s, p: torch.ops.ropelib.rotate(torch.ones(1, 100, 8), c, s, "half", 8,
                                                 False, p[:, :7], AXES),
        r"positions must have shape \(\.\.\., seq, k\) with 3 dims, broadcastable to x's rows "
        r"\(1, 100\), got \(1, 7, 3\)"),
    "apply_rope small out": (
        lambda c, s, p: apply_rope(torch.ones(1, 100, 8), c, s, layout="half",
                                   out=torch.empty(1, 10, 8)),
        r"out must match x: shape \(1, 100, 8\), dtype torch.float32, device cpu; got shape "
        r"\(1, 10, 8\)"),
}


@pytest.mark.parametrize("case", BAD_OPERANDS)
def test_item2_operators_refuse_operands_their_loop_would_read_past(case):
    fn, match = BAD_OPERANDS[case]
    cos, sin, _ = _tables()
    with pytest.raises((ValueError, TypeError), match=match):
        fn(cos, sin, torch.randint(0, 100, (1, 100, 3)))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64])
def test_item2_axis_rows_reads_integer_positions_of_any_width(dtype):
    """int32 positions were handed to the loop as int64 (two read as one): rows of wrong
    table entries, or an error that contradicted itself ("must be in [0, 100) ... got
    positions in [1, 99]")."""
    cos, sin, angles = _tables()
    positions = torch.tensor([[1, 99, 5], [7, 0, 42], [3, 3, 3]], dtype=dtype)
    rows = axis_rows(cos, sin, positions, AXES.int())
    index = positions.long()[:, AXES]  # pair i reads the table row of coordinate AXES[i]
    expected = angles[index, torch.arange(4)]
    torch.testing.assert_close(rows[0].double(), expected.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(rows[1].double(), expected.sin(), rtol=0, atol=1e-7)
    narrow = axis_rows(cos, sin, positions, AXES.to(dtype))
    assert torch.equal(narrow[0], rows[0]) and torch.equal(narrow[1], rows[1])


def test_item2_an_out_of_range_int32_position_is_reported_as_it_is():
    cos, sin, _ = _tables()
    with pytest.raises(ValueError, match=r"positions must be in \[0, 100\).*got positions in "
                                         r"\[1, 100\]"):
        axis_rows(cos, sin, torch.tensor([[1, 100, 5]], dtype=torch.int32),
                                    AXES)


def test_item2_apply_rope_names_tables_of_two_dtypes():
    cos, sin, _ = _tables()
    with pytest.raises(ValueError, match=r"cos and sin must have the same dtype, got "
                                         r"torch.float32 and torch.float64"):
        apply_rope(torch.ones(1, 100, 8), cos, sin.double())


# --------------------------------------------------------------------------- items 6-10

SECTIONS = {"chunked": [2, 3, 3], "interleaved": [4, 2, 2]}


def exact_angles(positions: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """sum_a p_a W[i, a], accumulated pair by pair in Python floats."""
    rows = positions.to(F64).reshape(-1, positions.shape[-1]).tolist()
    out = [[sum(p * float(W[i, a]) for a, p in enumerate(row)) for i in range(W.shape[0])]
           for row in rows]
    return torch.tensor(out, dtype=F64).reshape(*positions.shape[:-1], W.shape[0])


def explicit_w(head_dim: int, sections: list[int], base: float, order: str) -> torch.Tensor:
    """M-RoPE's W from its definition: pair i turns with base^(-2i/d) along its one axis."""
    k, half = len(sections), head_dim // 2
    axes = [a for a, s in enumerate(sections) for _ in range(s)] if order == "chunked" else [
        next((a for a in range(1, k) if i % k == a and i < k * sections[a]), 0)
        for i in range(half)]
    W = torch.zeros(half, k, dtype=F64)
    for i, a in enumerate(axes):
        W[i, a] = base ** (-2.0 * i / head_dim)
    return W


@pytest.mark.parametrize("order", ["chunked", "interleaved"])
def test_item6_axis_frequencies_under_the_meta_device_are_the_cpu_numbers(order):
    with torch.device("meta"):
        W = axis_frequencies(16, SECTIONS[order], base=100.0, order=order)
    assert W.device.type == "cpu"
    torch.testing.assert_close(W, explicit_w(16, SECTIONS[order], 100.0, order), rtol=1e-15,
                               atol=0)


@pytest.mark.parametrize("w", ["chunked", "interleaved", "mixed"])
def test_item6_meta_built_module_with_frequencies_loads_with_assign(w):
    """Built under torch.device("meta") with its W made there too, then
    load_state_dict(..., assign=True): the module computes what its source computes, and its
    rows are the float64 angles (the 1D module does the same, tests/test_safety.py)."""

    def frequencies():
        W = axis_frequencies(16, SECTIONS.get(w, [2, 3, 3]), base=100.0,
                             order=w if w != "mixed" else "chunked")
        if w == "mixed":  # pairs turning with two axes: rows computed, not gathered
            W[:, 1] += 0.25 * W[:, 0]
        return W

    torch.manual_seed(0)
    source = StandardAttentionWithRoPE(32, 2, layout="half", frequencies=frequencies())
    with torch.device("meta"):
        module = StandardAttentionWithRoPE(32, 2, layout="half", frequencies=frequencies())
    module.load_state_dict(source.state_dict(), assign=True)
    x, p = torch.randn(2, 6, 32), torch.randint(0, 50, (2, 6, 3))
    torch.testing.assert_close(module(x, x, x, positions=p), source(x, x, x, positions=p),
                               rtol=0, atol=0)
    cos, sin = module.rotary(positions=p)
    angles = exact_angles(p, frequencies())
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=1e-7)


def test_item6_rope_mixed_on_the_meta_device_then_loaded_or_reset():
    source = RoPEMixed(16, 2, generator=torch.Generator().manual_seed(3))
    with torch.device("meta"):
        module = RoPEMixed(16, 2)
    assert module.frequencies.is_meta
    module.load_state_dict(source.state_dict(), assign=True)
    p = torch.randint(0, 9, (5, 2))
    W = source.frequencies.detach().double()
    angles = torch.stack([exact_angles(p, W[h]) for h in range(2)])[None]
    cos, sin = module(p)
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=1e-7)
    with torch.device("meta"):
        fresh = RoPEMixed(16, 2)
    fresh.to_empty(device="cpu").reset_parameters(torch.Generator().manual_seed(3))
    assert torch.equal(fresh.frequencies, source.frequencies)


def _attention(frequencies, **kw):
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(32, 2, frequencies=frequencies, **kw)


@pytest.mark.parametrize("shape, name", [((5, 4), "positions"), ((2, 5, 4), "positions"),
                                          ((5, 2), "positions"), ((5, 4), "key_positions")])
def test_item7_a_wrong_number_of_axes_is_refused(shape, name):
    """With W (d/2, 3), (N, 4) positions (transformers' (text, t, h, w) rows, transposed)
    used to run and ignore the last column; (N, 2) raised an error about ``axes``."""
    module = _attention(axis_frequencies(16, [2, 3, 3]))
    x = torch.randn(2, 5, 32)
    good = torch.randint(0, 9, (5, 3))
    bad = torch.randint(0, 9, shape)
    kw = {"positions": good, "key_positions": bad} if name == "key_positions" else {
        "positions": bad}
    with pytest.raises(ValueError) as info:
        module(x, x, x, **kw)
    message = str(info.value)
    assert message.startswith(f"{name} must have shape (5, 3) or (batch, 5, 3)")
    assert f"got {shape} (k = {shape[-1]})" in message and "k = 3 coordinates" in message
    assert "(4, batch, seq) with the text positions" in message
    assert "axes" not in message.replace("axis", "")


def test_item7_transformers_four_row_position_ids_as_the_message_says():
    """Following the message: HF's (4, B, N) position ids, last three rows permuted, give
    the rows of the (t, h, w) positions."""
    W = axis_frequencies(16, [2, 3, 3], base=100.0)
    module = _attention(W)
    thw = mrope_positions([2, (1, 2, 4), 1], spatial_merge_size=1)
    text = torch.arange(thw.shape[0])
    hf = torch.cat([text[None], thw.T])[:, None]  # (4, 1, N): text, t, h, w
    x = torch.randn(1, thw.shape[0], 32)
    torch.testing.assert_close(module(x, x, x, positions=hf[-3:].permute(1, 2, 0)),
                               module(x, x, x, positions=thw), rtol=0, atol=0)


def test_item8_one_axis_frequencies_take_one_shape_everywhere():
    """k = 1: RotaryEmbedding and the attention module both take (..., seq, 1) and equal 1D
    RoPE of theta = W[:, 0]; the module used to read (N, 1) as (batch, seq)."""
    W = axis_frequencies(16, [8], base=100.0)
    p = torch.tensor([[3], [0], [7], [7], [12]])
    cos, sin = RotaryEmbedding(16, frequencies=W)(positions=p)
    angles = exact_angles(p, W)
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-7)
    one_axis, plain = _attention(W), _attention(None, base=100.0)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(one_axis(x, x, x, positions=p),
                               plain(x, x, x, positions=p[:, 0]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(one_axis(x, x, x, positions=p[None].expand(2, 5, 1)),
                               plain(x, x, x, positions=p[:, 0]), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"positions must have shape \(5, 1\) or \(batch, 5, 1\)"
                                         r".*got \(5,\); add the axis"):
        one_axis(x, x, x, positions=p[:, 0])


def test_item9_base_with_frequencies_is_refused_and_base_reports_none():
    W = axis_frequencies(16, [2, 3, 3], base=100.0)
    with pytest.raises(ValueError, match=r"either frequencies \(multi-axis\) or base, not both; "
                                         r"got base=500.0"):
        RotaryEmbedding(16, 500.0, frequencies=W)
    with pytest.raises(ValueError, match=r"either frequencies \(multi-axis\) or base"):
        _attention(W, base=500.0)
    assert RotaryEmbedding(16, frequencies=W).base is None


def test_item10_numpy_and_tensor_integers_are_integers():
    W = axis_frequencies(np.int64(16), [np.int64(2), torch.tensor(3), np.int32(3)],
                         base=100.0)
    torch.testing.assert_close(W, explicit_w(16, [2, 3, 3], 100.0, "chunked"), rtol=1e-15,
                               atol=0)
    assert torch.equal(axis_frequencies(16, np.array([2, 3, 3])), axis_frequencies(16, [2, 3, 3]))
    mixed = RoPEMixed(np.int64(16), torch.tensor(2), generator=torch.Generator().manual_seed(1))
    assert torch.equal(mixed.frequencies, RoPEMixed(
        16, 2, generator=torch.Generator().manual_seed(1)).frequencies)
    segments = [np.int64(3), (np.int64(1), torch.tensor(2), 4), torch.tensor(2),
                torch.tensor([2, 2, 2])]
    expected = mrope_positions([3, (1, 2, 4), 2, (2, 2, 2)])
    assert torch.equal(mrope_positions(segments, spatial_merge_size=np.int64(1)), expected)
    assert expected[:3].tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    assert expected[3:11].tolist() == [[3, 3 + h, 3 + w] for h in range(2) for w in range(4)]
    with pytest.raises(ValueError, match=r"a text segment must be a length >= 0"):
        mrope_positions([np.int64(-1)])
    with pytest.raises(ValueError, match=r"sections must be a non-empty list of positive ints"):
        axis_frequencies(8, [np.float64(2.0), 2])


def test_item10_longrope_factor_lists_as_numpy_arrays():
    """transformers accepts NumPy arrays as short_factor / long_factor; so does ropelib, and
    the frequencies are 1 / (ext_i base^(2i/d)) with the long factors past L0."""
    short, long = np.linspace(1.0, 2.0, 8), np.linspace(1.0, 16.0, 8)
    config = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
              "original_max_position_embeddings": 64, "factor": 4.0}
    for seq_len, ext in ((10, short), (100, long)):
        expected = [1.0 / (float(e) * 1e4 ** (2 * i / 16)) for i, e in enumerate(ext)]
        got = rope_frequencies(16, 1e4, scaling=config, seq_len=seq_len, dtype=F64)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=F64), rtol=1e-14, atol=0)


# --------------------------------------------------------------------------- item 13


@pytest.mark.parametrize("w", ["m-rope", "mixed"])
def test_item13_a_jit_trace_of_the_m_rope_module_refuses_negative_positions(w):
    """Eager refuses a negative coordinate; the trace used to drop its assertion
    (``torch._assert_async`` is not recorded) and rotate by the negative angle."""
    W = axis_frequencies(16, [2, 3, 3], base=100.0)
    if w == "mixed":
        W[:, 2] += 0.5 * W[:, 0]
    module = _attention(W).eval().requires_grad_(False)
    x, p = torch.randn(1, 5, 32), torch.randint(0, 9, (5, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(lambda x, p: module(x, x, x, positions=p), (x, p))
    other = torch.randint(0, 30, (5, 3))
    torch.testing.assert_close(traced(x, other), module(x, x, x, positions=other), rtol=1e-5,
                               atol=1e-6)
    bad = other.clone()
    bad[2, 1] = -4
    with pytest.raises(ValueError, match=r"positions must be >= 0, got min -4"):
        module(x, x, x, positions=bad)
    with pytest.raises((RuntimeError, ValueError), match=r"positions must be >= 0, got min -4"):
        traced(x, bad)


def _traced_1d(case):
    """The call under test, as a function of (x, positions), with its objects built once."""
    cos, sin, _ = _tables(40, 8)
    if case == "apply_rope":
        return torch.randn(1, 5, 16), lambda x, p: apply_rope(x, cos, sin, positions=p)
    if case == "apply_rope with axes":
        axes = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
        return torch.randn(1, 5, 16), lambda x, p: apply_rope(
            x, cos, sin, positions=torch.stack([p, p // 2, p], -1), layout="half", axes=axes)
    if case == "RotaryEmbedding":
        rotary = RotaryEmbedding(16, max_position_embeddings=4)
        return torch.randn(8), lambda x, p: rotary(positions=p)[0] * x
    module = _attention(None, layout="half").requires_grad_(False)
    return torch.randn(1, 5, 32), lambda x, p: module(x, x, x, positions=p)


@pytest.mark.parametrize("case", ["apply_rope", "apply_rope with axes", "RotaryEmbedding",
                                  "attention"])
def test_item13_traces_of_the_1d_paths_refuse_negative_positions_too(case):
    """The same dropped assertion let a trace index the tables with a negative position
    (Python indexing from the end) where eager refuses it."""
    x, fn = _traced_1d(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(fn, (x, torch.tensor([0, 3, 1, 4, 2])))
    good = torch.tensor([7, 9, 2, 30, 0])
    torch.testing.assert_close(traced(x, good), fn(x, good), rtol=1e-5, atol=1e-6)
    bad = torch.tensor([7, 9, -2, 30, 0])
    with pytest.raises(ValueError, match=r"positions must be >= 0"):
        fn(x, bad)
    with pytest.raises((RuntimeError, ValueError), match=r"positions must be >= 0"):
        traced(x, bad)


def test_item13_the_nonnegative_operator_passes_opcheck_and_names_the_minimum():
    p = torch.tensor([[3, 0, 5], [1, 2, 9]])
    torch.library.opcheck(torch.ops.ropelib.nonnegative.default, (p,))
    assert torch.equal(torch.ops.ropelib.nonnegative(p), p)
    with pytest.raises(ValueError, match=r"positions must be >= 0, got min -3"):
        torch.ops.ropelib.nonnegative(torch.tensor([4, -3, 1]))


def test_item7_rotary_embedding_names_the_k_it_saw_and_the_four_row_form():
    rotary = RotaryEmbedding(16, frequencies=axis_frequencies(16, [2, 3, 3]))
    with pytest.raises(ValueError, match=r"positions must have shape \(\.\.\., seq, k\) with k = "
                                         r"3 axes .*got \(2, 5, 4\) \(k = 4\); transformers' "
                                         r"Qwen2-VL .*position_ids\[-3:\]\.permute\(1, 2, 0\)"):
        rotary(positions=torch.zeros(2, 5, 4, dtype=torch.long))


@pytest.mark.parametrize("backend", ["native", "eager"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_operators_read_integer_coordinates_of_any_width(backend, dtype, monkeypatch):
    """``torch.ops.ropelib.rotate`` takes coordinates of any integer dtype (its checks
    accept them): each CPU backend rotates, and the tables' gradient is scattered, as with
    int64 coordinates."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    x = torch.randn(1, 2, 3, 8)
    positions = torch.tensor([[[1, 99, 5], [7, 0, 42], [3, 3, 3]]])[None]  # (1, 1, 3, 3)
    results = []
    for p, axes in ((positions, AXES), (positions.to(dtype), AXES.to(dtype))):
        cos, sin, _ = _tables()
        cos.requires_grad_()
        rotated = torch.ops.ropelib.rotate(x, cos, sin, "half", 8, False, p, axes)
        rotated.sum().backward()
        results.append((rotated.detach(), cos.grad))
    assert torch.equal(results[1][0], results[0][0])
    assert torch.equal(results[1][1], results[0][1])


def test_axis_rows_refuses_axes_out_of_range_without_positions_too():
    cos, sin, _ = _tables()
    with pytest.raises(ValueError, match=r"pair_axes in \[0, 3\).*got .*pair_axes in \[-1, 2\]"):
        axis_rows(cos, sin, torch.zeros(0, 3, dtype=torch.long), torch.tensor([0, -1, 1, 2]))
