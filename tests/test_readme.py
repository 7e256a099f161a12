"""The README's Python examples run verbatim, in order, in one namespace."""

import re
from pathlib import Path

import torch

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 2, "the README lost its quick start"
    namespace: dict = {}
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb  # the recipe swaps it: restore it after
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    finally:
        modeling_llama.apply_rotary_pos_emb = original
    printed = capsys.readouterr().out
    assert "torch.Size([2, 256, 512]) torch.Size([2, 8, 256, 256])" in printed
    out, pad_mask = namespace["out"], namespace["pad_mask"]
    assert out.shape == (2, 256, 512) and not out.isnan().any()
    assert not pad_mask[1, -10:].any() and namespace["causal"].shape == (2, 256, 512)
    assert "[[10, 10, 10], [11, 11, 11], [12, 12, 12]]" in printed
    assert namespace["mm_out"].shape == (1, 31, 1024) and not namespace["mm_out"].isnan().any()
    # the transformers recipe: generate() through ropelib's drop-in gives the same ids
    assert torch.equal(namespace["before"], namespace["after"])
    assert namespace["after"].shape == (1, 16)
