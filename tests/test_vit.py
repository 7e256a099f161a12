"""ropelib.book.vit: the direction task is what its docstring says, the models place
positions as named, and a short run learns reproducibly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ropelib import axis_frequencies, axis_tables
from ropelib.book.vit import (
    DIRECTIONS,
    FIRST_BACKGROUND,
    MARK_A,
    MARK_B,
    POSITIONS,
    TinyViT,
    direction_accuracy,
    direction_batch,
    grid_positions,
    run_experiment,
    train_vit,
)


def test_grid_positions_are_raster_order():
    assert grid_positions(3).tolist() == [[r, c] for r in range(3) for c in range(3)]


@pytest.mark.parametrize("grid", [5, 8, 12])
def test_direction_batch_labels_say_where_a_is_relative_to_b(grid):
    tokens, marked, labels = direction_batch(500, grid, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (500, grid * grid)
    assert ((tokens == MARK_A).sum(1) == 1).all() and ((tokens == MARK_B).sum(1) == 1).all()
    assert (tokens[tokens > MARK_B] >= FIRST_BACKGROUND).all()
    a = (tokens == MARK_A).long().argmax(1)
    b = (tokens == MARK_B).long().argmax(1)
    assert torch.equal(a, marked)
    dy, dx = a // grid - b // grid, a % grid - b % grid
    expected = {"above": (dy < 0) & (dx == 0), "below": (dy > 0) & (dx == 0),
                "left": (dx < 0) & (dy == 0), "right": (dx > 0) & (dy == 0)}
    for index, name in enumerate(DIRECTIONS):
        assert torch.equal(labels == index, expected[name]), name
    distance = dy.abs() + dx.abs()
    assert distance.min() == 1 and distance.max() == 3
    assert set(labels.tolist()) == {0, 1, 2, 3}
    # every row and column of the grid is used by A
    assert set((a // grid).tolist()) == set(range(grid))


def test_direction_batch_is_reproducible_and_checks_arguments():
    one = direction_batch(4, 6, generator=torch.Generator().manual_seed(3))
    two = direction_batch(4, 6, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(one, two, strict=True))
    with pytest.raises(ValueError, match="max_distance must be < grid"):
        direction_batch(2, 3, max_distance=3)
    with pytest.raises(ValueError, match="vocab_size must be > 3"):
        direction_batch(2, 8, vocab_size=3)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        direction_batch(0, 8)


def test_rope_tables_place_each_patch_as_named():
    axial = TinyViT("rope-axial")
    cos, _ = axial.rope_tables(12)
    W = axis_frequencies(8, [2, 2], base=100.0, spectrum="per_axis")
    expected, _ = axis_tables(grid_positions(12), W)
    assert cos.shape == (1, 1, 144, 4) and torch.equal(cos[0, 0], expected)
    one_d = TinyViT("rope-1d")
    cos, _ = one_d.rope_tables(12)
    raster = torch.arange(144)[:, None]
    expected, _ = axis_tables(raster, axis_frequencies(8, [4], base=100.0, spectrum="per_axis"))
    assert torch.equal(cos[0, 0], expected)
    mixed = TinyViT("rope-mixed", generator=torch.Generator().manual_seed(0))
    cos, _ = mixed.rope_tables(5)
    assert cos.shape == (1, 2, 25, 4) and cos.requires_grad
    assert TinyViT("absolute").rope_tables(8) is None
    ten, _ = TinyViT("rope-axial", base=10.0).rope_tables(12)
    expected, _ = axis_tables(grid_positions(12),
                              axis_frequencies(8, [2, 2], base=10.0, spectrum="per_axis"))
    assert torch.equal(ten[0, 0], expected)


def test_rope_mixed_learns_one_frequency_matrix_per_block():
    # Heo et al.'s RoPE-Mixed (naver-ai/rope-vit): W per head and per layer
    model = TinyViT("rope-mixed", num_layers=2, generator=torch.Generator().manual_seed(0))
    W0, W1 = (m.frequencies for m in model.mixed)
    assert W0.shape == W1.shape == (2, 4, 2) and not torch.allclose(W0, W1)
    for layer, W in enumerate((W0, W1)):
        cos, _ = model.rope_tables(3, layer)
        expected, _ = axis_tables(grid_positions(3), W[1].detach().double())
        torch.testing.assert_close(cos[0, 1].double(), expected.double(), rtol=0, atol=1e-6)
    tokens, marked, labels = direction_batch(4, 3, max_distance=1,
                                             generator=torch.Generator().manual_seed(1))
    torch.nn.functional.cross_entropy(model(tokens, marked, 3), labels).backward()
    assert W0.grad.abs().sum() > 0 and W1.grad.abs().sum() > 0   # each block uses its own


def test_absolute_embeddings_are_resampled_to_other_grids():
    model = TinyViT("absolute", grid=4, embed_dim=8)
    table = model.absolute_table(4)
    assert table.shape == (1, 16, 8)
    # raster order: patch (r, c) is row r * 4 + c of the table
    assert torch.equal(table[0, 2 * 4 + 3], model.absolute[0, :, 2, 3])
    with torch.no_grad():  # a ramp along the rows, constant along the columns
        model.absolute.copy_(torch.arange(4.0)[None, None, :, None].expand(1, 8, 4, 4))
    big = model.absolute_table(7)[0, :, 0].reshape(7, 7)
    assert big.shape == (7, 7)
    torch.testing.assert_close(big, big[:, :1].expand(7, 7))  # still constant along columns
    assert (big[1:, 0] > big[:-1, 0]).all()  # still rising along the rows
    tokens, marked, _ = direction_batch(3, 7, generator=torch.Generator().manual_seed(0))
    assert model(tokens, marked, 7).shape == (3, 4)


def test_models_check_their_arguments():
    with pytest.raises(ValueError, match="position must be one of"):
        TinyViT("alibi")
    with pytest.raises(ValueError, match="multiple of 4"):
        TinyViT("rope-axial", embed_dim=12, num_heads=2)
    with pytest.raises(ValueError, match="a label of bases must start with one of"):
        run_experiment(["rope-axial"], bases={"alibi, base 10": 10.0}, progress=False)
    with pytest.raises(ValueError, match="base must be a number > 1 or None, got 1.0"):
        TinyViT("rope-axial", base=1.0)
    model = TinyViT("rope-axial")
    with pytest.raises(ValueError, match=r"tokens must be \(batch, grid \* grid\)"):
        model(torch.zeros(2, 10, dtype=torch.long), torch.zeros(2, dtype=torch.long), 3)


@pytest.mark.parametrize("position", POSITIONS)
def test_a_short_run_lowers_the_loss_and_is_reproducible(position):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, losses = train_vit(position, steps=40, batch=16, lr=1e-2, seed=5)
        _, again = train_vit(position, steps=40, batch=16, lr=1e-2, seed=5)
    finally:
        torch.set_num_threads(threads)
    assert len(losses) == 40 and losses == again
    assert not model.training
    # fresh data: the trained model's loss is below the untrained one's
    tokens, marked, labels = direction_batch(256, 8, generator=torch.Generator().manual_seed(99))
    fresh = TinyViT(position, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        trained_loss = F.cross_entropy(model(tokens, marked, 8), labels)
        untrained_loss = F.cross_entropy(fresh(tokens, marked, 8), labels)
    assert trained_loss < untrained_loss
    acc = direction_accuracy(model, 8, samples=64)
    assert 0.0 <= acc <= 1.0


def test_rope_axial_learns_the_task_and_run_experiment_reports_it():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = run_experiment(["rope-axial"], test_grids=(8, 10), steps=150, batch=32,
                                 lr=1e-2, samples=256, progress=False)
    finally:
        torch.set_num_threads(threads)
    entry = results["rope-axial"]
    assert set(entry) == {"accuracy", "losses", "parameters"}
    assert entry["parameters"] == sum(p.numel() for p in TinyViT("rope-axial").parameters())
    # 150 steps suffice for axial RoPE on this task: far above chance (25%)
    assert entry["accuracy"][8] > 0.9 and entry["accuracy"][10] > 0.8
