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

import torch

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
