"""ropelib.positions (issue 24, section 4): positions as models build them, checked against
what Hugging Face's generation and packing collator build, and used to decode a left-padded
batch with the attention module (each row must equal that row decoded alone). The two
Hugging Face checks run on the CPU: they compare the positions its generate and collator
build there."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ropelib import (
    KVCache,
    StandardAttentionWithRoPE,
    positions_after_cache,
    positions_from_cu_seqlens,
    positions_from_padding_mask,
)

F64 = torch.float64
LENGTHS = [6, 3, 1, 5]  # real tokens per row; the batch is left-padded to 6


def left_padded_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.tensor([[0] * (total - n) + [1] * n for n in lengths])


def test_padding_mask_positions_written_out(device):
    mask = left_padded_mask([4, 2, 0], 4).to(device)
    expected = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 0, 0]], device=device)
    for m in (mask, mask.bool(), mask.to(torch.uint8)):
        assert torch.equal(positions_from_padding_mask(m), expected)
    assert torch.equal(positions_from_padding_mask(mask, new_tokens=1), expected[:, -1:])
    assert positions_from_padding_mask(mask, new_tokens=np.int64(0)).shape == (3, 0)


def test_positions_after_cache_written_out(device):
    assert torch.equal(positions_after_cache(3, 5), torch.tensor([5, 6, 7]))
    assert torch.equal(positions_after_cache(3, 5, device=device),
                       torch.tensor([5, 6, 7], device=device))
    assert torch.equal(positions_after_cache(np.int64(2), np.int32(1)), torch.tensor([1, 2]))
    offset = torch.tensor([4, 0, 2], dtype=torch.int16, device=device)
    assert torch.equal(positions_after_cache(2, offset),
                       torch.tensor([[4, 5], [0, 1], [2, 3]], device=device))
    assert positions_after_cache(0, 3).shape == (0,)


def test_cu_seqlens_positions_written_out(device):
    cu = torch.tensor([0, 3, 3, 5, 9], dtype=torch.int32, device=device)  # an empty document
    assert torch.equal(positions_from_cu_seqlens(cu),
                       torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3], device=device))
    assert positions_from_cu_seqlens(torch.tensor([0])).shape == (0,)


ERRORS = {
    "float mask": (lambda: positions_from_padding_mask(torch.ones(2, 3)), ValueError,
                   r"attention_mask must be a \(batch, length\) bool or integer tensor .*got "
                   r"shape \(2, 3\) and dtype torch.float32"),
    "1-d mask": (lambda: positions_from_padding_mask(torch.ones(3, dtype=torch.bool)),
                 ValueError, r"attention_mask must be a \(batch, length\).*got shape \(3,\)"),
    "list mask": (lambda: positions_from_padding_mask([[1, 1]]), TypeError,
                  r"attention_mask must be a torch.Tensor, got list"),
    "too many new tokens": (lambda: positions_from_padding_mask(torch.ones(1, 3, dtype=int),
                                                                new_tokens=4),
                            ValueError, r"new_tokens must be an int in \[0, 3\].*got 4"),
    "negative offset": (lambda: positions_after_cache(2, -1), ValueError,
                        r"offset must be a non-negative int or a \(batch,\) integer tensor, "
                        r"got -1"),
    "negative row offset": (lambda: positions_after_cache(2, torch.tensor([1, -2])), ValueError,
                            r"offset must be >= 0, got min -2"),
    "float row offset": (lambda: positions_after_cache(2, torch.tensor([1.0])), TypeError,
                         r"offset must hold integer positions, got dtype torch.float32"),
    "bool new tokens": (lambda: positions_after_cache(True, 0), ValueError,
                        r"new_tokens must be a non-negative int, got True"),
    "cu_seqlens from 1": (lambda: positions_from_cu_seqlens(torch.tensor([1, 3])), ValueError,
                          r"cu_seqlens must start at 0 and never decrease .*got \[1, 3\]"),
    "decreasing cu_seqlens": (lambda: positions_from_cu_seqlens(torch.tensor([0, 3, 2])),
                              ValueError, r"never decrease"),
    "2-d cu_seqlens": (lambda: positions_from_cu_seqlens(torch.zeros(2, 2, dtype=int)),
                       ValueError, r"cu_seqlens must have shape \(documents \+ 1,\), got \(2, 2\)"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_name_the_argument(case):
    """CPU only: the messages do not depend on the device."""
    call, exc, pattern = ERRORS[case]
    with pytest.raises(exc, match=pattern):
        call()


def test_padding_positions_equal_hugging_face_generate():
    """A tiny Llama built from its config (no download) generates greedily from a left-padded
    batch; the position_ids its generate passes to every forward (prefill and each decode
    step) are ropelib's positions for the mask so far."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    mask = left_padded_mask(LENGTHS, 6)
    input_ids = torch.randint(3, 40, mask.shape).masked_fill(mask == 0, 0)
    seen = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True)
    new = 4
    with torch.no_grad():
        model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, pad_token_id=0)
    assert len(seen) == new
    assert torch.equal(seen[0], positions_from_padding_mask(mask))
    for step, positions in enumerate(seen[1:], start=1):
        so_far = torch.cat([mask, torch.ones(len(LENGTHS), step, dtype=mask.dtype)], 1)
        assert torch.equal(positions, positions_from_padding_mask(so_far, new_tokens=1))
        assert torch.equal(positions, positions_after_cache(1, so_far[:, :-1].sum(-1)))


def test_cu_seqlens_positions_equal_hugging_face_flattening():
    """DataCollatorWithFlattening packs documents into one row with position_ids that
    restart per document, and FlashAttention's cu_seq_lens: ropelib turns the latter into the
    former."""
    transformers = pytest.importorskip("transformers")
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    documents = [[5, 6, 7, 8], [9], [10, 11, 12], [13, 14]]
    batch = collator([{"input_ids": d} for d in documents], return_tensors="pt")
    positions = positions_from_cu_seqlens(batch["cu_seq_lens_q"])
    assert torch.equal(positions, batch["position_ids"][0])
    assert torch.equal(positions, torch.cat([torch.arange(len(d)) for d in documents]))


def decode_left_padded(module, x: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Prefill the left-padded prompt ``x[:, :len]`` (mask ``(batch, len)``), then decode
    ``steps`` more tokens one at a time; the outputs ``(batch, len + steps, D)``."""
    length = mask.shape[1]
    cache = KVCache()
    prompt = x[:, :length]
    outs = [module(prompt, prompt, prompt, is_causal=True, kv_cache=cache,
                   positions=positions_from_padding_mask(mask),
                   attn_mask=mask.bool()[:, None, None, :])]
    for t in range(steps):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        xt = x[:, length + t:length + t + 1]
        outs.append(module(xt, xt, xt, is_causal=True, kv_cache=cache,
                           positions=positions_after_cache(1, mask[:, :-1].sum(-1)),
                           attn_mask=mask.bool()[:, None, None, :]))
    return torch.cat(outs, 1)


def decode_alone(module, x: torch.Tensor, prompt: int, steps: int) -> torch.Tensor:
    """The same tokens of one row, unpadded: prefill ``prompt`` tokens, then ``steps`` more."""
    cache = KVCache()
    outs = [module(x[:, :prompt], x[:, :prompt], x[:, :prompt], is_causal=True,
                   kv_cache=cache)]
    for t in range(prompt, prompt + steps):
        outs.append(module(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], is_causal=True,
                           kv_cache=cache))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 4},
                                     {"rope_type": "dynamic", "factor": 2.0,
                                      "original_max_position_embeddings": 4}],
                         ids=["default", "yarn", "dynamic"])
def test_left_padded_batch_decodes_like_each_row_alone(layout, scaling, device):
    """Rows of 6, 3, 1 and 5 prompt tokens, left-padded to 6, then 5 decode steps, in
    float64: every real token's output equals that row decoded alone. With dynamic NTK the
    whole batch shares the frequencies of its longest row (as in Hugging Face), so there the
    check is for the longest row, which has no padding; and since dynamic NTK keeps the
    frequencies of the longest length seen (Hugging Face's rule), each run starts from a
    fresh copy of the module."""
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(32, 4, num_kv_heads=2, layout=layout, scaling=scaling,
                                       max_position_embeddings=4).double().eval().to(device)
    mask = left_padded_mask(LENGTHS, 6).to(device)
    steps = 5
    x = torch.randn(len(LENGTHS), 6 + steps, 32, dtype=F64).to(device)
    with torch.no_grad():
        batch = decode_left_padded(copy.deepcopy(module), x, mask, steps)
        assert batch.device == device
        rows = [0] if scaling and scaling["rope_type"] == "dynamic" else range(len(LENGTHS))
        for row in rows:
            real = torch.cat([mask[row].bool(), mask.new_ones(steps, dtype=torch.bool)])
            alone = decode_alone(copy.deepcopy(module), x[row:row + 1, real], LENGTHS[row],
                                 steps)
            torch.testing.assert_close(batch[row:row + 1, real], alone, rtol=1e-12, atol=1e-12)
