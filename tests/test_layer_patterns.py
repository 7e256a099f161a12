"""Chapter 13's book support: per-layer position schemes, the counting task, the band split."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from reference import angles, attention_module_reference, rope_by_matrix, thetas

from ropelib.book.layer_patterns import (
    VARIANTS,
    PatternConfig,
    PatternDecoder,
    accuracy_by_length,
    attention_stack,
    counting_batch,
    layer_inputs,
    local_mask,
    pair_contributions,
    train,
    train_variant,
    variant_layers,
    variant_windows,
)
from ropelib.book.toy import IGNORE, lookback_batch

F64 = torch.float64


def test_variant_layers_name_the_five_schemes():
    assert variant_layers("full RoPE", 2) == ({"rope_type": "default", "rope_theta": 1e4},) * 2
    assert variant_layers("NoPE", 3) == (None, None, None)
    mixed = variant_layers("3:1 RoPE/NoPE", 8)
    assert [layer is None for layer in mixed] == [False, False, False, True] * 2
    assert variant_layers("partial 25%", 1)[0]["partial_rotary_factor"] == 0.25
    assert variant_layers("p-RoPE 25%", 1)[0]["rope_type"] == "proportional"
    assert set(VARIANTS) == {"full RoPE", "partial 25%", "p-RoPE 25%", "NoPE", "3:1 RoPE/NoPE",
                             "local RoPE + global NoPE"}
    assert variant_layers("local RoPE + global NoPE", 8) == mixed
    assert variant_windows("local RoPE + global NoPE", 8, window=5) == (5, 5, 5, None) * 2
    assert variant_windows("3:1 RoPE/NoPE", 4, window=5) == (None,) * 4
    with pytest.raises(ValueError, match=r"window must be a positive int, got 0"):
        variant_windows("NoPE", 2, window=0)
    with pytest.raises(ValueError, match=r"name must be one of .*got 'RoPE'"):
        variant_layers("RoPE", 2)
    with pytest.raises(ValueError, match=r"num_layers must be a positive int, got 0"):
        variant_layers("NoPE", 0)


def test_attention_stack_builds_each_layer_from_its_config():
    stack = attention_stack(16, 2, [None, {"rope_type": "default", "rope_theta": 500.0},
                                    {"rope_type": "proportional", "partial_rotary_factor": 0.5}])
    assert stack[0].rotary is None
    assert stack[1].rotary.base == 500.0 and stack[1].rotary_dim == 8
    assert stack[2].rotary_dim == 8  # p-RoPE: tables over the whole head
    torch.testing.assert_close(stack[2].rotary.inv_freq.double(),
                               torch.cat([thetas(8)[:2], torch.zeros(2, dtype=F64)]),
                               rtol=1e-6, atol=0)


def test_decoder_layers_use_their_own_position_scheme():
    torch.manual_seed(0)
    model = PatternDecoder(PatternConfig(layers=variant_layers("p-RoPE 25%", 2), embed_dim=32,
                                         num_heads=2, vocab_size=8, max_distance=4)).double()
    x = torch.randn(2, 9, 32, dtype=F64)
    inv = thetas(16).clone()
    inv[2:] = 0.0  # floor(0.25 * 16 / 2) = 2 rotating pairs
    a = angles(torch.arange(9), inv)
    expected, _ = attention_module_reference(model.attns[0], x, x, x, a, a, causal=True)
    torch.testing.assert_close(model.attns[0](x, x, x, is_causal=True), expected,
                               rtol=1e-10, atol=1e-10)
    tokens, distances, _ = lookback_batch(2, 9, 8, 4, generator=torch.Generator().manual_seed(0))
    assert model(tokens, distances).shape == (2, 9, 8)
    with pytest.raises(ValueError, match=r"distances must be \(batch, seq\) = \(2, 9\)"):
        model(tokens)


def test_counting_batch_and_the_symmetry_without_a_mask():
    tokens, targets = counting_batch(5, 6, 10, generator=torch.Generator().manual_seed(0))
    assert (tokens[:, 0] == 0).all() and (tokens[:, 1:] == tokens[:, 1:2]).all()
    assert (tokens[:, 1] >= 1).all() and torch.equal(targets[0], torch.arange(6))
    torch.manual_seed(0)
    model = PatternDecoder(PatternConfig(layers=(None, None), vocab_size=10, max_distance=0,
                                         embed_dim=16, num_heads=2))
    with torch.no_grad():
        both = model(tokens, causal=False)
        causal = model(tokens)
    # without the mask every position after the first sees the same tokens: same output
    torch.testing.assert_close(both[:, 2:], both[:, 1:2].expand_as(both[:, 2:]))
    assert (causal[:, 2:] - causal[:, 1:2]).abs().amax() > 1e-3
    with pytest.raises(ValueError, match=r"length \(11\) must be <= vocab_size \(10\)"):
        counting_batch(1, 11, 10)


def test_train_is_reproducible_and_learns_the_counting_task():
    def run():
        torch.manual_seed(0)
        model = PatternDecoder(PatternConfig(layers=(None,), vocab_size=6, max_distance=0,
                                             embed_dim=16, num_heads=2))
        seen = []
        losses = train(model, partial(counting_batch, 8, 6, 6), 40, seed=3, lr=1e-2,
                       progress=lambda steps: (seen.append(1) or s for s in steps))
        return losses, seen

    first, seen = run()
    second, _ = run()
    assert first == second and len(first) == 40 and len(seen) == 40
    assert sum(first[-5:]) / 5 < 0.5 * math.log(6)


def test_one_cycle_follows_pytorchs_schedule_up_to_lr_and_down():
    """``one_cycle=True`` is AdamW stepped by ``OneCycleLR(max_lr=lr, total_steps=steps)``,
    written out here as a loop; without it the rate stays at ``lr`` (another run)."""
    def fresh():
        torch.manual_seed(0)
        return PatternDecoder(PatternConfig(layers=(None,), vocab_size=6, max_distance=0,
                                            embed_dim=16, num_heads=2))

    batches = partial(counting_batch, 8, 6, 6)
    losses = train(fresh(), batches, 12, seed=3, lr=1e-2, one_cycle=True)
    model, generator = fresh(), torch.Generator().manual_seed(3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=12)
    rates, by_hand = [], []
    for _ in range(12):
        tokens, targets = batches(generator=generator)
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
        by_hand.append(loss.item())
    assert losses == by_hand
    assert max(rates) == pytest.approx(1e-2, rel=0.02) and rates[-1] < 1e-4 and rates[0] < 1e-3
    assert train(fresh(), batches, 12, seed=3, lr=1e-2) != losses


def test_accuracy_by_length_counts_only_queries_with_targets():
    class Oracle(torch.nn.Module):  # answers every look-back query right
        config = PatternConfig(layers=(None,), vocab_size=5, max_distance=3)

        def forward(self, tokens, distances):
            source = (torch.arange(tokens.shape[1]) - distances).clamp(min=0)
            right = torch.gather(tokens, 1, source)
            return torch.nn.functional.one_hot(right, 5).float()

    assert accuracy_by_length(Oracle(), [8, 16], tokens_per_length=64, seed=0,
                              from_position=3) == [1.0, 1.0]
    _, _, targets = lookback_batch(8, 8, 5, 3, generator=torch.Generator().manual_seed(0))
    assert (targets[:, :1] == IGNORE).all()


def test_pair_contributions_sum_to_the_score_and_match_rotation_matrices():
    torch.manual_seed(1)
    model = PatternDecoder(PatternConfig(layers=variant_layers("full RoPE", 2), embed_dim=32,
                                         num_heads=2, vocab_size=8, max_distance=4))
    tokens, distances, _ = lookback_batch(3, 12, 8, 4, generator=torch.Generator().manual_seed(2))
    x = layer_inputs(model, tokens, distances)[1]
    attn = model.attns[1]
    w_q, b_q = attn.q_proj.weight.detach().to(F64), attn.q_proj.bias.detach().to(F64)
    w_k, b_k = attn.k_proj.weight.detach().to(F64), attn.k_proj.bias.detach().to(F64)
    q = (x.to(F64) @ w_q.T + b_q).unflatten(-1, (2, 16)).transpose(1, 2)
    k = (x.to(F64) @ w_k.T + b_k).unflatten(-1, (2, 16)).transpose(1, 2)
    table = angles(torch.arange(12), thetas(16))
    q_rot, k_rot = rope_by_matrix(q, table), rope_by_matrix(k, table)  # RoFormer's R_m

    def per_pair(a, b, dist):
        return (a[..., dist:, :] * b[..., :12 - dist, :]).unflatten(-1, (8, 2)).sum(-1)

    for dist in (0, 1, 5, 11):
        rotated, plain = pair_contributions(attn, x, dist)
        assert rotated.shape == (3, 2, 12 - dist, 8)
        torch.testing.assert_close(rotated.to(F64), per_pair(q_rot, k_rot, dist),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(plain.to(F64), per_pair(q, k, dist), rtol=1e-4, atol=1e-5)
        score = (q_rot[..., dist:, :] * k_rot[..., :12 - dist, :]).sum(-1)
        torch.testing.assert_close(rotated.sum(-1).to(F64), score, rtol=1e-4, atol=1e-5)
    rotated, plain = pair_contributions(attn, x, 0)
    torch.testing.assert_close(rotated, plain)  # distance 0: the rotation cancels
    with pytest.raises(ValueError, match=r"distance must be an int in 0 .. 11, got 12"):
        pair_contributions(attn, x, 12)
    nope = PatternDecoder(PatternConfig(layers=(None,), embed_dim=32, num_heads=2))
    with pytest.raises(ValueError, match=r"attn must rotate"):
        pair_contributions(nope.attns[0], x, 0)


def test_layer_inputs_are_what_the_blocks_read():
    torch.manual_seed(0)
    model = PatternDecoder(PatternConfig(layers=variant_layers("3:1 RoPE/NoPE", 4), embed_dim=16,
                                         num_heads=2, vocab_size=8, max_distance=4))
    tokens, distances, _ = lookback_batch(2, 10, 8, 4, generator=torch.Generator().manual_seed(0))
    inputs = layer_inputs(model, tokens, distances)
    h = model.embed(tokens, distances)
    for i in range(4):
        torch.testing.assert_close(inputs[i], model.attn_norms[i](h))
        h = model.block(i, h)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, distances), model.readout(model.out_norm(h)))


def test_local_layers_see_only_their_window():
    window = 3
    mask = local_mask(6, window)
    expected = torch.tensor([[0 <= m - n < window for n in range(6)] for m in range(6)])
    assert torch.equal(mask, expected)
    assert torch.equal(local_mask(6, window, causal=False), expected | expected.T)
    torch.manual_seed(0)
    layers = variant_layers("local RoPE + global NoPE", 4)
    model = PatternDecoder(PatternConfig(
        layers=layers, windows=variant_windows("local RoPE + global NoPE", 4, window=window),
        embed_dim=32, num_heads=2, vocab_size=8, max_distance=0)).double()
    h = torch.randn(1, 10, 32, dtype=F64)
    changed = h.clone()
    changed[0, 2] += torch.randn(32, dtype=F64)  # a key 3 or more before the last query
    for layer in range(3):                       # local RoPE layers: the last query misses it
        out, out_changed = model.block(layer, h), model.block(layer, changed)
        torch.testing.assert_close(out[0, 5:], out_changed[0, 5:], rtol=0, atol=0)
        assert (out[0, 2:5] - out_changed[0, 2:5]).abs().max() > 1e-6
    out, out_changed = model.block(3, h), model.block(3, changed)   # the global NoPE layer
    assert (out[0, 5:] - out_changed[0, 5:]).abs().max() > 1e-6
    with pytest.raises(ValueError, match=r"one window \(or None\) per layer: 4 layers, got 2"):
        PatternDecoder(PatternConfig(layers=layers, windows=(3, None)))


def test_train_variant_is_the_documented_run_of_its_seed():
    """Chapter 13 trains seed 0 itself and reads seeds 1 and 2 from a script's run: both call
    ``train_variant``, so a run must follow only from its variant and seed."""
    batches = partial(lookback_batch, 2, 8, 4, 2)
    sizes = dict(vocab_size=4, max_distance=2, embed_dim=8, num_heads=2)
    name = "local RoPE + global NoPE"
    model, losses = train_variant(name, 1, batches, steps=3, num_layers=4, window=4, **sizes)
    assert model.config.windows == (4, 4, 4, None)
    assert model.config.layers == variant_layers(name, 4)
    # the seeding its docstring states, written out
    torch.manual_seed(100 * 1 + VARIANTS.index(name))
    by_hand = PatternDecoder(PatternConfig(layers=variant_layers(name, 4),
                                           windows=(4, 4, 4, None), **sizes))
    assert losses == train(by_hand, batches, 3, seed=1)
    other = train_variant(name, 2, batches, steps=3, num_layers=4, window=4, **sizes)[1]
    assert other != losses
    with pytest.raises(ValueError, match="name must be one of"):
        train_variant("RoPE", 0, batches, steps=1, num_layers=4, window=4, **sizes)
