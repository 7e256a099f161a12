"""Regional compilation (issue 33, item 5): each layer compiled on its own, fullgraph, as
torchtitan and Hugging Face compile a model's repeated blocks.

The layers share their Python code, so the second layer's differing config number (a base,
a linear factor) makes dynamo recompile that code with the number symbolic. ropelib checks
its config numbers once, when a module is built, so the graph holds no check on them. Each
compiled layer is compared with an eager copy of itself (same weights); the eager modules
are checked against float64 references and transformers in test_rope_types_hf.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ropelib import StandardAttentionWithRoPE, mrope_positions

D, H = 32, 4
TOL = {"rtol": 2e-5, "atol": 2e-5}

GEMMA3 = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}

LAYERS = {
    "gemma3 layer types": [{"scaling": GEMMA3, "layer_type": "sliding_attention"},
                           {"scaling": GEMMA3, "layer_type": "full_attention"}],
    "linear factors 2 and 4": [{"scaling": {"rope_type": "linear", "factor": 2.0}},
                               {"scaling": {"rope_type": "linear", "factor": 4.0}}],
    "yarn factors 4 and 16": [
        {"scaling": {"rope_type": "yarn", "factor": f, "original_max_position_embeddings": 8}}
        for f in (4.0, 16.0)],
    # past the trained length 8, so the compiled graph computes the grown base
    "dynamic NTK factors 2 and 3": [
        {"scaling": {"rope_type": "dynamic", "factor": f}, "max_position_embeddings": 8}
        for f in (2.0, 3.0)],
    "bases 1e4 and 5e5": [{"base": 1e4}, {"base": 5e5}],
    # Qwen2-VL's M-RoPE with YaRN (attention factors 1.14 and 1.21), at image positions
    "qwen2-vl yarn factors 4 and 8": [
        {"scaling": {"rope_type": "yarn", "factor": f, "original_max_position_embeddings": 8,
                     "mrope_section": [2, 1, 1]}} for f in (4.0, 8.0)],
}
IMAGE = mrope_positions([2, (1, 2, 4), 2])  # 12 tokens


def layer(**kw) -> StandardAttentionWithRoPE:
    """The same weights for every layer: they differ only in their RoPE."""
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(D, H, layout="half", **kw).eval()


@pytest.mark.parametrize("case", list(LAYERS))
def test_each_layer_compiled_on_its_own_equals_eager(case):
    torch._dynamo.reset()
    eager = [layer(**kw) for kw in LAYERS[case]]
    compiled = [torch.compile(copy.deepcopy(m), fullgraph=True, backend="aot_eager")
                for m in eager]
    x = torch.randn(2, 12, D)
    kw = {"positions": IMAGE} if eager[0].rotary.num_axes > 1 else {}
    with torch.no_grad():
        for _ in range(2):  # the second pass runs the graphs already built
            h_eager, h_compiled = x, x
            for e, c in zip(eager, compiled, strict=True):
                h_eager = e(h_eager, h_eager, h_eager, is_causal=True, **kw)
                h_compiled = c(h_compiled, h_compiled, h_compiled, is_causal=True, **kw)
                torch.testing.assert_close(h_compiled, h_eager, **TOL)
    # the layers' RoPE really differs: the same weights and input give different outputs
    assert not torch.allclose(eager[0](x, x, x, **kw), eager[1](x, x, x, **kw), **TOL)
