"""ropelib.book.toy: the look-back task's data, the toy decoder's position schemes and checkpoints."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ropelib.book.toy import (
    IGNORE,
    POSITIONS,
    ToyConfig,
    ToyDecoder,
    checkpoint_entry,
    lookback_accuracy,
    lookback_batch,
    lookback_loss,
    model_from_entry,
)

SMALL = {"vocab_size": 8, "max_distance": 4, "embed_dim": 16, "num_heads": 2, "num_layers": 2}


def small(position: str, seed: int = 0) -> ToyDecoder:
    torch.manual_seed(seed)
    return ToyDecoder(ToyConfig(position=position, **SMALL)).eval()


def test_lookback_targets_are_the_token_k_back_or_ignored():
    tokens, distances, targets = lookback_batch(3, 20, 8, 5,
                                                generator=torch.Generator().manual_seed(1))
    assert tokens.shape == distances.shape == targets.shape == (3, 20)
    assert int(distances.min()) >= 1 and int(distances.max()) <= 5
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 8
    for b in range(3):
        for m in range(20):
            k = int(distances[b, m])
            expected = int(tokens[b, m - k]) if m >= k else IGNORE
            assert int(targets[b, m]) == expected
    assert (targets[:, 5:] != IGNORE).all()       # every position past K has a target


def test_lookback_batch_is_reproducible_and_checks_its_arguments():
    first = lookback_batch(2, 9, 8, 3, generator=torch.Generator().manual_seed(7))
    second = lookback_batch(2, 9, 8, 3, generator=torch.Generator().manual_seed(7))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="length must be a positive int, got 0"):
        lookback_batch(2, 0, 8, 3)
    with pytest.raises(ValueError, match="max_distance"):
        lookback_batch(2, 4, 8, True)


@pytest.mark.parametrize("position", POSITIONS)
def test_every_scheme_is_causal_and_gives_logits(position):
    model = small(position)
    tokens, distances, _ = lookback_batch(2, 12, 8, 4, generator=torch.Generator().manual_seed(0))
    logits = model(tokens, distances)
    assert logits.shape == (2, 12, 8) and torch.isfinite(logits).all()
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 8          # change the future of position 6
    again = model(changed, distances)
    torch.testing.assert_close(again[:, :7], logits[:, :7], rtol=0, atol=1e-6)
    assert (again[:, 7:] - logits[:, 7:]).abs().max() > 1e-4


def test_the_schemes_differ_only_in_how_positions_enter():
    """Same weights: NoPE and sinusoidal differ (the embeddings are added); NoPE and RoPE
    agree at position 0 (rotation by angle 0) and differ after it."""
    tokens, distances, _ = lookback_batch(1, 10, 8, 4, generator=torch.Generator().manual_seed(3))
    none, sinusoidal, rope = small("none"), small("sinusoidal"), small("rope")
    sinusoidal.load_state_dict(none.state_dict())
    rope.load_state_dict(none.state_dict())
    base = none(tokens, distances)
    assert (sinusoidal(tokens, distances) - base).abs().max() > 1e-3
    rotated = rope(tokens, distances)
    torch.testing.assert_close(rotated[:, 0], base[:, 0], rtol=0, atol=1e-6)
    assert (rotated[:, 1:] - base[:, 1:]).abs().max() > 1e-3


def test_rope_scaling_reaches_the_tables():
    model = small("rope")
    tokens, distances, _ = lookback_batch(2, 16, 8, 4, generator=torch.Generator().manual_seed(2))
    plain = model(tokens, distances)
    same = model(tokens, distances, scaling={"rope_type": "linear", "factor": 1.0})
    torch.testing.assert_close(same, plain, rtol=0, atol=0)
    pi = model(tokens, distances, scaling={"rope_type": "linear", "factor": 4.0})
    assert (pi - plain).abs().max() > 1e-3
    with pytest.raises(ValueError, match="position='rope' only"):
        small("alibi")(tokens, distances, scaling={"rope_type": "linear", "factor": 2.0})


def captured_attention_kwargs(model: ToyDecoder, tokens, distances, **kw) -> list[dict]:
    seen = []
    handles = [attn.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs),
                                              with_kwargs=True) for attn in model.attns]
    model(tokens, distances, **kw)
    for handle in handles:
        handle.remove()
    return seen


def test_alibi_model_gives_every_layer_the_alibi_bias_and_the_causal_mask():
    """Two heads: slopes 2^-4 and 2^-8, bias -slope * (m - n) for n <= m, -inf after m."""
    tokens, distances, _ = lookback_batch(1, 6, 8, 4, generator=torch.Generator().manual_seed(4))
    seen = captured_attention_kwargs(small("alibi"), tokens, distances)
    assert len(seen) == SMALL["num_layers"]
    expected = torch.full((2, 6, 6), float("-inf"))
    for h, slope in enumerate((2.0 ** -4, 2.0 ** -8)):
        for m in range(6):
            for n in range(m + 1):
                expected[h, m, n] = -slope * (m - n)
    for kwargs in seen:
        torch.testing.assert_close(kwargs["attn_mask"], expected, rtol=0, atol=1e-7)


def test_rope_model_rotates_with_the_scaled_angles():
    """With PI of factor s every layer gets cos(m theta_i / s), theta_i = base^(-2i/d)."""
    tokens, distances, _ = lookback_batch(1, 6, 8, 4, generator=torch.Generator().manual_seed(4))
    seen = captured_attention_kwargs(small("rope"), tokens, distances,
                                     scaling={"rope_type": "linear", "factor": 4.0})
    head_dim = SMALL["embed_dim"] // SMALL["num_heads"]
    theta = [10000.0 ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    angles = torch.tensor([[m * t / 4.0 for t in theta] for m in range(6)], dtype=torch.float64)
    for kwargs in seen:
        assert kwargs["is_causal"] is True
        cos, sin = kwargs["rope_embeddings"]
        torch.testing.assert_close(cos, angles.cos().float(), rtol=0, atol=1e-7)
        torch.testing.assert_close(sin, angles.sin().float(), rtol=0, atol=1e-7)


def test_loss_and_accuracy_count_only_positions_with_a_target():
    model = small("rope")
    data = lookback_batch(2, 10, 8, 4, generator=torch.Generator().manual_seed(5))
    tokens, distances, targets = data
    with torch.no_grad():
        logits = model(tokens, distances)
    picked = [(b, m) for b in range(2) for m in range(10) if int(targets[b, m]) != IGNORE]
    manual = sum(float(F.cross_entropy(logits[b, m][None], targets[b, m][None]))
                 for b, m in picked) / len(picked)
    with torch.no_grad():
        loss = lookback_loss(model, *data).item()
    assert loss == pytest.approx(manual, rel=1e-5)
    late = [(b, m) for b, m in picked if m >= 6]
    hits = sum(int(logits[b, m].argmax() == targets[b, m]) for b, m in late)
    assert lookback_accuracy(model, *data, from_position=6) == pytest.approx(hits / len(late))
    with pytest.raises(ValueError, match="from_position=10"):
        lookback_accuracy(model, *data, from_position=10)


def test_checkpoint_round_trip_keeps_the_float16_weights():
    model = small("sinusoidal")
    entry = checkpoint_entry(model, [2.0, 1.0], scaling={"rope_type": "linear", "factor": 2.0})
    assert entry["losses"] == [2.0, 1.0] and entry["config"]["position"] == "sinusoidal"
    assert all(v.dtype == torch.float16 for v in entry["state_dict"].values())
    restored = model_from_entry(entry)
    assert not restored.training
    for name, value in model.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], value.half().float(),
                                   rtol=0, atol=0)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="config.position must be one of"):
        ToyDecoder(ToyConfig(position="learned"))
    with pytest.raises(ValueError, match="config.num_layers"):
        ToyDecoder(ToyConfig(num_layers=0))
    with pytest.raises(ValueError, match=r"tokens and distances must both be \(batch, seq\)"):
        small("none")(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))
