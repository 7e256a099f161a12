"""ropelib.analysis: RoFormer's long-term-decay quantity."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from ropelib.analysis import decay_upper_bound


def decay_reference(distance: float, head_dim: int, base: float = 10000.0) -> float:
    """(1 / (d/2)) * sum_{j=1}^{d/2} |sum_{k<j} exp(i * distance * theta_k)|, with plain loops."""
    half = head_dim // 2
    total = 0.0
    for j in range(1, half + 1):
        s = sum(cmath.exp(1j * distance * base ** (-2.0 * k / head_dim)) for k in range(j))
        total += abs(s)
    return total / half


def test_decay_bound_at_distance_zero_is_exactly_32_5():
    assert decay_upper_bound(0, 128) == 32.5
    assert decay_upper_bound(0, 64) == 16.5  # (d/2 + 1) / 2


@pytest.mark.parametrize("head_dim,base", [(128, 10000.0), (16, 10000.0), (64, 500000.0)])
def test_decay_bound_matches_loop_reference(head_dim, base):
    distances = np.array([0.0, 1.0, 7.0, 50.0, 1234.0, -30.0])
    values = decay_upper_bound(distances, head_dim, base)
    assert values.shape == distances.shape
    expected = [decay_reference(float(r), head_dim, base) for r in distances]
    np.testing.assert_allclose(values, expected, rtol=1e-10, atol=1e-12)


def test_decay_bound_shape_symmetry_and_decay():
    grid = np.arange(0, 2001).reshape(3, 667)
    values = decay_upper_bound(grid, 128)
    assert values.shape == (3, 667)
    assert np.all(values <= 32.5 + 1e-12)  # |S_j| <= j (triangle inequality)
    np.testing.assert_allclose(decay_upper_bound(-grid, 128), values, rtol=1e-12, atol=1e-12)
    flat = values.ravel()
    assert flat[1000:].max() < 0.5 * flat[0]  # the long-term decay the paper plots


# ----------------------------------------------------------------- chapters 5 and 6 helpers

from reference import rotation_matrix, thetas  # noqa: E402

from ropelib.analysis import (  # noqa: E402
    base_is_feasible,
    cosine_sum,
    feasible_bases,
    first_feasible_base,
    first_negative_distance,
    most_similar_distances,
    peaked_query_key,
    phasor_partial_sums,
    relative_scores,
    rope_thetas,
    smallest_feasible_base,
    wavelengths,
)


def test_thetas_and_wavelengths_match_python_floats():
    for d, base in [(8, 10000.0), (128, 500000.0)]:
        np.testing.assert_allclose(rope_thetas(d, base), thetas(d, base).numpy(), rtol=1e-14)
        expected = [2 * np.pi / base ** (-2.0 * i / d) for i in range(d // 2)]
        np.testing.assert_allclose(wavelengths(d, base), expected, rtol=1e-13)


def test_cosine_sum_toy_value_and_all_ones_score():
    assert cosine_sum(20, [1.0, 0.3, 0.05]) == pytest.approx(
        np.cos(20) + np.cos(6) + np.cos(1), abs=1e-15)
    assert round(float(cosine_sum(20, [1.0, 0.3, 0.05])), 3) == 1.909
    # q = k = all ones: the score at distance D is 2 * sum_i cos(D theta_i)
    d, D = 16, 37
    ones = torch.ones(d, dtype=torch.float64)
    R = rotation_matrix(-D * thetas(d), d)                # R_{Theta,n-m} with m - n = D
    assert float(ones @ R @ ones) == pytest.approx(2 * float(cosine_sum(D, rope_thetas(d))),
                                                   abs=1e-12)


def test_most_similar_distances_by_brute_force_over_all_pairs():
    for theta in ([1.0], [1.0, 0.1, 0.01, 0.001], rope_thetas(16).tolist()):
        top = 300
        best, best_pair = -2.0, None
        for a in range(top + 1):
            for b in range(a + 1, top + 1):
                s = sum(math.cos((b - a) * t) for t in theta) / len(theta)
                if s > best + 1e-15:
                    best, best_pair = s, (a, b)
        gap, similarity = most_similar_distances(theta, top)
        assert gap == best_pair[1] - best_pair[0]
        assert similarity == pytest.approx(best, abs=1e-13)
    gap, similarity = most_similar_distances([1.0], 4096)
    assert gap == 710 and similarity > 1 - 1e-8  # 710 is within 6e-5 of 113 turns


def test_partial_sums_are_a_walk_of_unit_steps():
    walk = phasor_partial_sums(50.0, 32)
    assert walk.shape == (17,) and walk[0] == 0
    np.testing.assert_allclose(np.abs(np.diff(walk)), 1.0, rtol=1e-14)
    ref = [sum(cmath.exp(1j * 50.0 * 10000.0 ** (-2.0 * k / 32)) for k in range(j))
           for j in range(17)]
    np.testing.assert_allclose(walk, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(phasor_partial_sums(0.0, 32).real, np.arange(17), atol=0)
    assert phasor_partial_sums(np.zeros((2, 3)), 8).shape == (2, 3, 5)


def test_relative_scores_match_the_explicit_block_diagonal_matrix():
    gen = torch.Generator().manual_seed(3)
    d, base = 12, 500.0
    q = torch.randn(4, d, dtype=torch.float64, generator=gen)
    k = torch.randn(4, d, dtype=torch.float64, generator=gen)
    distances = np.array([0.0, 1.0, 5.0, -3.0, 250.0])
    scores = relative_scores(q, k, distances, base)
    assert scores.shape == (4, 5)
    for p in range(4):
        for j, D in enumerate(distances):
            R = rotation_matrix(-D * thetas(d, base), d)    # R_{Theta,n-m}, n - m = -D
            assert scores[p, j] == pytest.approx(float(q[p] @ R @ k[p]), abs=1e-12)
    with pytest.raises(ValueError, match="head_dim"):
        relative_scores(np.ones(4), np.ones(6), distances)
    with pytest.raises(ValueError, match="even"):
        relative_scores(np.ones(5), np.ones(5), distances)


def test_peaked_pair_has_its_maximum_at_the_chosen_distance():
    q, k = peaked_query_key(300, 64)
    distances = np.arange(0, 2001)
    scores = relative_scores(q, k, distances)
    assert int(np.argmax(scores)) == 300
    assert scores[300] == pytest.approx(32.0, abs=1e-12)
    assert np.sort(scores)[-2] < 32.0 - 1e-3
    np.testing.assert_allclose(scores, cosine_sum(distances - 300, rope_thetas(64)), atol=1e-12)


def brute_first_negative(base, max_distance, d):
    for m in range(max_distance):
        if sum(math.cos(m * base ** (-2.0 * i / d)) for i in range(d // 2)) < 0:
            return m
    return None


@pytest.mark.parametrize("base", [30.0, 1000.0, 10000.0, 50000.0])
def test_first_negative_distance_by_plain_loops(base):
    assert first_negative_distance(base, 3000, 32) == brute_first_negative(base, 3000, 32)
    assert base_is_feasible(base, 3000, 32) == (brute_first_negative(base, 3000, 32) is None)


def test_first_feasible_base_scans_a_non_monotone_set():
    grid = np.logspace(2, 5, 61)
    flags = feasible_bases(grid, 400, 64)
    expected = [brute_first_negative(b, 400, 64) is None for b in grid]
    np.testing.assert_array_equal(flags, expected)
    assert np.any(np.diff(flags.astype(int)) < 0)          # feasible, then infeasible again
    first = first_feasible_base(grid[::-1], 400, 64)      # order of the list does not matter
    assert first == grid[expected.index(True)]
    assert first_feasible_base([10.0, 20.0], 400, 64) is None
    with pytest.raises(ValueError, match="context_length"):
        base_is_feasible(1e4, 0)


def men_et_al_grid(top_exponent=6):
    """Men et al. 2024 search the bases (i + j/10) 10^x in increasing order (d = 128)."""
    return [(10 * i + j) * 10.0 ** (x - 1) for x in range(3, top_exponent)
            for i in range(1, 10) for j in range(10)]


@pytest.mark.parametrize(("context", "table"), [(1024, 4.3e3), (4000, 2.7e4)])
def test_first_feasible_base_on_men_et_al_grid_matches_their_table(context, table):
    """Their table gives 4.3e3 for "1k" and 2.7e4 for "4k" (two digits; quoted by Su, 2024)."""
    found = first_feasible_base(men_et_al_grid(), context, 128)
    assert found == table
    assert all(not base_is_feasible(b, context, 128) for b in men_et_al_grid() if b < found)


def test_smallest_feasible_base_misses_no_base_of_a_dense_scan():
    low, high = smallest_feasible_base(400, 64, start=100.0)
    assert base_is_feasible(high, 400, 64) and brute_first_negative(high, 400, 64) is None
    assert high == pytest.approx(low * (1 + 1e-9), rel=1e-15)      # rtol = 1e-9
    dense = np.arange(100.0, low, 0.5)                   # every half unit of base below
    assert not feasible_bases(dense, 400, 64).any()


def test_smallest_feasible_base_finds_the_island_a_grid_steps_over():
    """At 2,048 tokens (d = 128) the smallest feasible bases form an island between 11,000
    and 12,000, two neighbours of Men et al.'s grid, whose search returns 16,000."""
    low, high = smallest_feasible_base(2048, 128)
    assert 11000 < low < 12000
    assert first_feasible_base(men_et_al_grid(), 2048, 128) == 16000
    integer = math.ceil(high)
    assert base_is_feasible(integer, 2048, 128)
    assert brute_first_negative(integer, 2048, 128) is None
    assert not any(base_is_feasible(b, 2048, 128) for b in range(integer - 50, integer))
    assert not base_is_feasible(12000, 2048, 128)


def test_smallest_feasible_base_start_and_errors():
    low, high = smallest_feasible_base(1024, 128, start=5e5)          # 5e5 passes already
    assert low == high == 5e5
    assert smallest_feasible_base(1, 16) == (1000.0, 1000.0)
    low, _ = smallest_feasible_base(1024, 128)
    again, _ = smallest_feasible_base(1024, 128, start=low / 2)
    assert again == pytest.approx(low, rel=1e-8)
    with pytest.raises(ValueError, match="start"):
        smallest_feasible_base(1024, start=0.0)
    with pytest.raises(ValueError, match="rtol"):
        smallest_feasible_base(1024, rtol=0.5)
    with pytest.raises(ValueError, match="context_length"):
        smallest_feasible_base(0)
    with pytest.raises(ValueError, match="head_dim"):
        smallest_feasible_base(1024, 7)
    with pytest.raises(RuntimeError, match="no passing base"):
        smallest_feasible_base(4096, 128, max_steps=3)
