"""Python frames one call of ropelib enters on the CPU (``sys.setprofile``'s "call" events),
in all and in ropelib's own files, with how often the call switches from one of ropelib's
files to another: a measure of how much code a reader follows through one call.

    python benchmarks/frames.py

Cases: ``apply_rope(x, cos, sin)`` of a (1, 4, 16, 64) float32 x; its forward and
backward (x records autograd, ``.sum().backward()``); a decode step of
``StandardAttentionWithRoPE`` with a ``KVCache`` and ``cache_position`` under
``torch.no_grad()``. Each case runs once before it is counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from ropelib import KVCache, StandardAttentionWithRoPE, apply_rope, generate_rope_embeddings


def count(call: Callable[[], object]) -> tuple[int, int, int, int]:
    """(frames, of which in ropelib, ropelib's files entered, switches between them)."""
    call()
    files = []

    def profile(frame, event, arg):
        if event == "call":
            files.append(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    own = [f for f in files if "/ropelib/" in f]
    switches = sum(a != b for a, b in zip(own[:-1], own[1:], strict=True))
    return len(files), len(own), len(set(own)), switches


def cases() -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16, 64)
    cos, sin = generate_rope_embeddings(16, 64)
    trained = x.clone().requires_grad_()
    module = StandardAttentionWithRoPE(64, 4, num_kv_heads=2, bias=False, layout="half").eval()
    token, slot = torch.randn(3, 1, 64), torch.tensor(5)

    def decode_step():
        with torch.no_grad():
            return module(token, token, token, kv_cache=KVCache(capacity=16),
                          cache_position=slot)

    return {
        "apply_rope (CPU)": lambda: apply_rope(x, cos, sin),
        "forward + backward": lambda: apply_rope(trained, cos, sin).sum().backward(),
        "module decode step": decode_step,
    }


def main() -> None:
    for name, call in cases().items():
        frames, own, files, switches = count(call)
        print(f"{name:22s} {frames:4d} frames, {own:4d} in ropelib ({files} files, "
              f"{switches} switches)")


if __name__ == "__main__":
    main()
