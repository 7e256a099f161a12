"""ropelib.book.baselines against the papers: sinusoidal embeddings, Shaw et al., T5 buckets, ALiBi.

The references here are written out independently of ropelib: the formulas of the papers in
float64 Python, hand-derived values, and (for T5) Hugging Face's bucket function transcribed
as plainly as possible.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ropelib.book.baselines import (
    ScoreTerms,
    absolute_score_terms,
    alibi_bias,
    alibi_slopes,
    relative_positions,
    shaw_bias,
    shaw_relative_index,
    sinusoidal_embeddings,
    t5_bias,
    t5_relative_bucket,
)

F64 = torch.float64


def is_toeplitz(b: torch.Tensor) -> bool:
    """Every diagonal constant: B[..., i+1, j+1] == B[..., i, j]."""
    return torch.equal(b[..., 1:, 1:], b[..., :-1, :-1])


# --------------------------------------------------------------------------- positions

def test_relative_positions_square_and_offset():
    rel = relative_positions(3, 3)
    assert rel.dtype == torch.int64
    assert rel.tolist() == [[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]  # n - m
    # two queries at the end of five keys: positions 3 and 4
    assert relative_positions(2, 5).tolist() == [[-3, -2, -1, 0, 1], [-4, -3, -2, -1, 0]]
    assert relative_positions(2, 2, q_offset=10).tolist() == [[-10, -9], [-11, -10]]


def test_relative_positions_errors():
    with pytest.raises(ValueError, match="q_offset"):
        relative_positions(5, 3)
    with pytest.raises(ValueError, match="q_len"):
        relative_positions(-1, 3)
    with pytest.raises(TypeError, match="k_len"):
        relative_positions(1, 2.0)
    with pytest.raises(ValueError, match="q_offset"):
        relative_positions(1, 2, q_offset=-1)


# --------------------------------------------------------------------------- sinusoidal

def vaswani_pe(pos: float, dim: int, base: float = 10000.0) -> list[float]:
    """Vaswani et al. section 3.5, entry by entry: PE(pos, 2i) = sin(pos / base^(2i/d)),
    PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    row = []
    for c in range(dim):
        i = c // 2
        angle = pos / base ** (2 * i / dim)
        row.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
    return row


@pytest.mark.parametrize("num_positions,dim,base", [(50, 16, 10000.0), (7, 2, 10000.0),
                                                    (20, 10, 100.0)])
def test_sinusoidal_matches_paper_formula(num_positions, dim, base):
    pe = sinusoidal_embeddings(num_positions, dim, base, dtype=F64)
    ref = torch.tensor([vaswani_pe(p, dim, base) for p in range(num_positions)], dtype=F64)
    assert pe.shape == (num_positions, dim) and pe.dtype == F64
    torch.testing.assert_close(pe, ref, rtol=0, atol=1e-12)
    pe32 = sinusoidal_embeddings(num_positions, dim, base)
    assert pe32.dtype == torch.float32
    torch.testing.assert_close(pe32, ref.float(), rtol=0, atol=1e-6)


def test_sinusoidal_first_rows_by_hand():
    pe = sinusoidal_embeddings(2, 4, dtype=F64)
    # position 0: sin 0 = 0, cos 0 = 1 in every pair
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # position 1, d = 4: frequencies 1 and 10000^(-1/2) = 0.01
    torch.testing.assert_close(pe[1], torch.tensor([math.sin(1), math.cos(1), math.sin(0.01),
                                                    math.cos(0.01)], dtype=F64))


def test_sinusoidal_positions_argument_and_dot_product_is_relative():
    positions = torch.tensor([-3, 0, 5, 1000])
    pe = sinusoidal_embeddings(4, 8, positions=positions, dtype=F64)
    ref = torch.tensor([vaswani_pe(float(p), 8) for p in positions], dtype=F64)
    torch.testing.assert_close(pe, ref, rtol=0, atol=1e-12)
    # p_m . p_n = sum_i cos((m - n) w_i): shifting both positions changes nothing
    table = sinusoidal_embeddings(300, 8, dtype=F64)
    gram = table @ table.T
    torch.testing.assert_close(gram[1:, 1:], gram[:-1, :-1], rtol=0, atol=1e-12)


def test_sinusoidal_errors():
    with pytest.raises(ValueError, match="dim must be even"):
        sinusoidal_embeddings(4, 5)
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_embeddings(4, 0)
    with pytest.raises(ValueError, match="num_positions"):
        sinusoidal_embeddings(-1, 4)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_embeddings(4, 4, base=1.0)
    with pytest.raises(ValueError, match="positions"):
        sinusoidal_embeddings(4, 4, positions=torch.arange(3))
    with pytest.raises(ValueError, match="dtype"):
        sinusoidal_embeddings(4, 4, dtype=torch.int64)


# --------------------------------------------------------------------------- score terms

def test_absolute_score_terms_sum_to_score_and_match_explicit_products():
    d_model, d_head, lq, lk = 12, 4, 3, 5
    x_q, x_k = torch.randn(2, lq, d_model, dtype=F64), torch.randn(2, lk, d_model, dtype=F64)
    p_q, p_k = torch.randn(lq, d_model, dtype=F64), torch.randn(lk, d_model, dtype=F64)
    w_q, w_k = torch.randn(d_head, d_model, dtype=F64), torch.randn(d_head, d_model, dtype=F64)
    terms = absolute_score_terms(x_q, x_k, p_q, p_k, w_q, w_k)
    assert isinstance(terms, ScoreTerms)
    assert all(t.shape == (2, lq, lk) for t in terms)
    score = ((x_q + p_q) @ w_q.T) @ ((x_k + p_k) @ w_k.T).mT
    torch.testing.assert_close(terms.total(), score, rtol=1e-12, atol=1e-12)
    a = w_q.T @ w_k  # x_m^T W_q^T W_k p_n for one entry, as a bilinear form
    b, i, j = 1, 2, 4
    torch.testing.assert_close(terms.content_position[b, i, j], x_q[b, i] @ a @ p_k[j])
    torch.testing.assert_close(terms.position_content[b, i, j], p_q[i] @ a @ x_k[b, j])
    torch.testing.assert_close(terms.position_position[b, i, j], p_q[i] @ a @ p_k[j])
    torch.testing.assert_close(terms.content_content[b, i, j], x_q[b, i] @ a @ x_k[b, j])


def test_absolute_score_terms_errors():
    x = torch.randn(3, 6)
    w = torch.randn(2, 6)
    with pytest.raises(ValueError, match="x_k"):
        absolute_score_terms(x, torch.randn(3, 5), x, x, w, w)
    with pytest.raises(ValueError, match="w_q and w_k"):
        absolute_score_terms(x, x, x, x, w, torch.randn(3, 6))
    with pytest.raises(TypeError, match="p_q"):
        absolute_score_terms(x, x, x.long(), x, w, w)
    with pytest.raises(ValueError, match="w_q"):
        absolute_score_terms(x, x, x, x, w[0], w)


# --------------------------------------------------------------------------- Shaw et al.

def test_shaw_index_clips():
    idx = shaw_relative_index(4, 4, 2)
    # n - m = [[0,1,2,3],[-1,0,1,2],[-2,-1,0,1],[-3,-2,-1,0]], clipped to [-2, 2], plus 2
    assert idx.tolist() == [[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]]
    assert is_toeplitz(idx)
    assert shaw_relative_index(3, 3, 0).tolist() == [[0] * 3] * 3


def test_shaw_bias_matches_loop_over_pairs():
    lq, lk, d, k = 3, 6, 4, 2
    q = torch.randn(2, lq, d, dtype=F64)
    table = torch.randn(2 * k + 1, d, dtype=F64)
    bias = shaw_bias(q, table, lk)
    assert bias.shape == (2, lq, lk)
    offset = lk - lq
    for b in range(2):
        for i in range(lq):
            for j in range(lk):
                rel = max(-k, min(k, j - (offset + i)))
                torch.testing.assert_close(bias[b, i, j], q[b, i] @ table[rel + k])


def test_shaw_bias_is_toeplitz_for_a_constant_query():
    q = torch.randn(4, dtype=F64).expand(7, 4)
    assert is_toeplitz(shaw_bias(q, torch.randn(5, 4, dtype=F64), 7))


def test_shaw_bias_errors():
    q = torch.randn(3, 4)
    with pytest.raises(ValueError, match="2K \\+ 1 rows"):
        shaw_bias(q, torch.randn(4, 4), 3)
    with pytest.raises(ValueError, match="d_head=4"):
        shaw_bias(q, torch.randn(5, 3), 3)
    with pytest.raises(ValueError, match="max_relative_position"):
        shaw_relative_index(2, 2, -1)


# --------------------------------------------------------------------------- T5

def hf_t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """Hugging Face's T5Attention._relative_position_bucket, transcribed."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return relative_buckets + torch.where(is_small, relative_position, if_large)


# Hand derivation, bidirectional, 32 buckets, max_distance 128: each direction gets 16 buckets
# and max_exact = 8. Keys after the query (n - m > 0) add 16. A distance r < 8 is bucket r;
# r >= 8 is 8 + floor(log(r / 8) / log(128 / 8) * 8) = 8 + floor(2 log2(r / 8)), capped at 15:
#   r = 20: 2 log2(2.5) = 2.64 -> 10;  r = 32: 2 log2(4) = 4 -> 12;
#   r = 127: 2 log2(15.875) = 7.98 -> 15;  r = 1000: 13.9 -> 21, capped to 15.
BIDIRECTIONAL_CASES = [(0, 0), (-3, 3), (3, 19), (-7, 7), (-8, 8), (-20, 10), (20, 26),
                       (-32, 12), (-127, 15), (-1000, 15), (1000, 31)]
# Unidirectional: all 32 buckets for n <= m, max_exact = 16; keys after the query are bucket 0.
# r >= 16 is 16 + floor(log(r / 16) / log(128 / 16) * 16) = 16 + floor(16 log2(r / 16) / 3):
#   r = 20: 16 * 0.3219 / 3 = 1.72 -> 17;  r = 64: 16 * 2 / 3 = 10.67 -> 26;
#   r = 200: 16 * 3.64 / 3 = 19.4 -> 35, capped to 31.
UNIDIRECTIONAL_CASES = [(5, 0), (0, 0), (-5, 5), (-15, 15), (-20, 17), (-64, 26), (-200, 31)]


@pytest.mark.parametrize("rel,bucket", BIDIRECTIONAL_CASES)
def test_t5_bucket_hand_derived_bidirectional(rel, bucket):
    assert int(t5_relative_bucket(torch.tensor(rel))) == bucket


@pytest.mark.parametrize("rel,bucket", UNIDIRECTIONAL_CASES)
def test_t5_bucket_hand_derived_unidirectional(rel, bucket):
    assert int(t5_relative_bucket(torch.tensor(rel), bidirectional=False)) == bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (64, 512), (4, 3)])
def test_t5_bucket_matches_hugging_face(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-2000, 2001)
    ours = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, hf_t5_bucket(rel, bidirectional, num_buckets, max_distance))
    assert int(ours.min()) >= 0 and int(ours.max()) <= num_buckets - 1


def test_t5_bucket_monotone_in_distance():
    r = torch.arange(0, 500)
    before = t5_relative_bucket(-r)  # keys at or before the query
    assert torch.all(before[1:] >= before[:-1])


def test_t5_bias_gathers_the_table_and_is_toeplitz():
    heads, buckets = 3, 32
    weight = torch.randn(buckets, heads, dtype=F64)
    bias = t5_bias(weight, 40, 40)
    assert bias.shape == (heads, 40, 40)
    assert is_toeplitz(bias)
    for i, j in [(0, 0), (5, 2), (2, 39), (39, 0)]:
        bucket = int(hf_t5_bucket(torch.tensor(j - i)))
        torch.testing.assert_close(bias[:, i, j], weight[bucket])
    # decoding: the last query of a length-40 sequence sees the last row of the full matrix
    torch.testing.assert_close(t5_bias(weight, 1, 40), bias[:, -1:, :])


def test_t5_errors():
    with pytest.raises(TypeError, match="relative_position"):
        t5_relative_bucket(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="num_buckets must be even"):
        t5_relative_bucket(torch.tensor([1]), num_buckets=31)
    with pytest.raises(ValueError, match="num_buckets"):
        t5_relative_bucket(torch.tensor([1]), num_buckets=2)
    with pytest.raises(ValueError, match="max_distance"):
        t5_relative_bucket(torch.tensor([1]), max_distance=8)
    with pytest.raises(TypeError, match="bidirectional"):
        t5_relative_bucket(torch.tensor([1]), bidirectional=1)
    with pytest.raises(ValueError, match="weight"):
        t5_bias(torch.randn(32), 3, 3)


# --------------------------------------------------------------------------- ALiBi

def test_alibi_slopes_eight_heads_from_the_paper():
    # Press et al., section 3: "for a model with 8 heads, the slopes we use are the
    # geometric sequence 1/2^1, 1/2^2, ..., 1/2^8"
    expected = torch.tensor([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
                            dtype=F64)
    assert torch.equal(alibi_slopes(8, dtype=F64), expected)
    assert alibi_slopes(8).dtype == torch.float32


@pytest.mark.parametrize("heads", [1, 2, 4, 16, 32])
def test_alibi_slopes_powers_of_two(heads):
    # 2^(-8h/H): start at 2^(-8/H) with ratio 2^(-8/H)
    expected = torch.tensor([2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)], dtype=F64)
    torch.testing.assert_close(alibi_slopes(heads, dtype=F64), expected, rtol=1e-15, atol=0)


def test_alibi_slopes_twelve_heads_by_hand():
    # Not a power of two: the 8 slopes of H = 8 (2^-1 .. 2^-8), then every other slope of
    # H = 16 (2^(-h/2) for h = 1, 3, 5, 7) until there are 12.
    expected = [2.0 ** -h for h in range(1, 9)] + [2.0 ** (-h / 2) for h in (1, 3, 5, 7)]
    torch.testing.assert_close(alibi_slopes(12, dtype=F64), torch.tensor(expected, dtype=F64),
                               rtol=1e-15, atol=0)


def authors_get_slopes(n: int) -> list[float]:
    """The ALiBi authors' get_slopes (recursive, repeated multiplication), transcribed."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + authors_get_slopes(2 * closest)[0::2][: n - closest]


@given(heads=st.integers(1, 100))
def test_alibi_slopes_match_authors_code(heads):
    torch.testing.assert_close(alibi_slopes(heads, dtype=F64),
                               torch.tensor(authors_get_slopes(heads), dtype=F64),
                               rtol=1e-12, atol=0)


def test_alibi_bias_formula_and_toeplitz():
    heads, length = 4, 9
    bias = alibi_bias(length, length, heads, dtype=F64)
    slopes = [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)]
    for h in range(heads):
        for m in range(length):
            for n in range(length):
                assert float(bias[h, m, n]) == -slopes[h] * abs(m - n)
    assert is_toeplitz(bias)
    assert torch.equal(bias, bias.mT)  # symmetric: -slope |m - n|
    assert not torch.signbit(bias.diagonal(dim1=-2, dim2=-1)).any()  # +0.0 on the diagonal
    # decoding: one query at position 8 against keys 0..8 is the last row
    assert torch.equal(alibi_bias(1, length, heads, dtype=F64), bias[:, -1:, :])


def test_alibi_errors():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads"):
        alibi_bias(2, 2, 2.0)
    with pytest.raises(ValueError, match="q_offset"):
        alibi_bias(3, 2, 2)
