"""positions_for_context_parallel (issue 38, item 2), in one process: the layouts written
out from their definitions, PyTorch's own head-tail load balancer (the split its
``context_parallel`` applies), packed documents, and the errors. The run with a real
process group is in test_distributed.py."""

from __future__ import annotations

import bisect
import itertools

import pytest
import torch

from ropelib import apply_rope, generate_rope_embeddings, positions_for_context_parallel


def test_load_balanced_split_written_out():
    """N = 8 over R = 2: chunks of 2, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2."""
    assert positions_for_context_parallel(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert positions_for_context_parallel(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert positions_for_context_parallel(8, 2, 1, load_balance=False).tolist() == [4, 5, 6, 7]
    assert positions_for_context_parallel(8, 2, 0).dtype == torch.int64


@pytest.mark.parametrize(("seq_len", "world_size"), [(12, 3), (16, 4), (8, 1), (0, 2)])
def test_load_balanced_split_equals_pytorch_head_tail_balancer(seq_len, world_size):
    """PyTorch's ``_HeadTailLoadBalancer`` (what ``context_parallel`` uses) reorders the
    sequence so that rank r's contiguous shard is its tokens: the same positions."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )

    order = _HeadTailLoadBalancer(seq_len, world_size, "cpu")._generate_indices()[0]
    for rank, shard in enumerate(order.long().chunk(world_size) if seq_len else
                                 [order.long()] * world_size):
        assert torch.equal(positions_for_context_parallel(seq_len, world_size, rank), shard)


@pytest.mark.parametrize("load_balance", [True, False])
def test_every_token_on_exactly_one_rank(load_balance):
    """The ranks' positions together are 0 .. N-1, each once; contiguous chunks in order."""
    shards = [positions_for_context_parallel(24, 3, r, load_balance=load_balance)
              for r in range(3)]
    together = torch.cat(shards)
    assert sorted(together.tolist()) == list(range(24))
    assert torch.equal(together, torch.arange(24)) != load_balance


@pytest.mark.parametrize("load_balance", [True, False])
def test_packed_documents_restart_per_document(load_balance):
    """Each token's position is its distance from the start of its document (found by
    bisection in the boundaries), for the tokens the rank holds."""
    bounds = [0, 5, 7, 16, 24]
    cu = torch.tensor(bounds)
    for rank in range(2):
        tokens = positions_for_context_parallel(24, 2, rank, load_balance=load_balance)
        expected = [t - bounds[bisect.bisect_right(bounds, t) - 1] for t in tokens.tolist()]
        got = positions_for_context_parallel(24, 2, rank, load_balance=load_balance,
                                             cu_seqlens=cu)
        assert got.tolist() == expected


def test_rank_rotation_equals_rows_of_unsplit_rotation():
    """apply_rope on a rank's tokens with these positions gives the rows of the unsplit
    rotation that belong to those tokens; local positions 0.. would not."""
    x = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    cos, sin = generate_rope_embeddings(16, 8, dtype=torch.float64)
    full = apply_rope(x, cos, sin)
    tokens = positions_for_context_parallel(16, 2, 1)
    shard = apply_rope(x[..., tokens, :], cos, sin, positions=tokens)
    torch.testing.assert_close(shard, full[..., tokens, :], rtol=0, atol=1e-12)
    assert not torch.allclose(apply_rope(x[..., tokens, :], cos, sin), full[..., tokens, :])


# Packed documents split one by one (issue 43, item 13) -------------------------------------------

@pytest.mark.parametrize(("lengths", "world_size"), [([4, 8, 4], 2), ([6, 12, 24, 6], 3),
                                                     ([16], 4), ([2, 2], 1)])
def test_per_document_split_equals_pytorch_per_document_balancer(lengths, world_size):
    """PyTorch's ``_PerDocumentHeadTailLoadBalancer`` orders the tokens so that each rank
    holds, in every document, a head chunk and a tail chunk (2R chunks a document).
    Positions are the tokens' offsets in their documents. The order itself is private and
    has changed: torch 2.13 lists it document-major (document 0's chunks rank by rank, then
    document 1's, ...), torch 2.15 rank-major (rank 0's chunks document by document, then
    rank 1's: R contiguous shards). Both layouts are read here, and ropelib's positions must
    be one of them for every rank."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer,
    )

    order = _PerDocumentHeadTailLoadBalancer([lengths], world_size, "cpu")._generate_indices()[0]
    order = order.long()
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    starts = cu[:-1].repeat_interleave(torch.tensor(lengths))  # each token's document start
    pairs = [2 * (length // (2 * world_size)) for length in lengths]  # a rank's tokens a doc
    document_major, at = [[] for _ in range(world_size)], 0
    for length, pair in zip(lengths, pairs, strict=True):
        for rank in range(world_size):
            document_major[rank].append(order[at + rank * pair: at + (rank + 1) * pair])
        at += length
    document_major = [torch.cat(tokens) for tokens in document_major]
    rank_major = list(order.split(sum(pairs)))
    got = [positions_for_context_parallel(sum(lengths), world_size, rank, cu_seqlens=cu,
                                          per_document=True) for rank in range(world_size)]
    def holds(layout: list[torch.Tensor]) -> bool:
        return all(torch.equal(g, tokens - starts[tokens])
                   for g, tokens in zip(got, layout, strict=True))

    assert holds(document_major) or holds(rank_major), (got, order)


def test_per_document_split_of_pytorch_docstring_example():
    """The example drawn in ``_PerDocumentHeadTailLoadBalancer``'s docstring: documents of 4,
    8 and 4 tokens on 2 ranks; rank 0's queries are tokens 0, 3, 4, 5, 10, 11, 12, 15."""
    cu = torch.tensor([0, 4, 12, 16])
    rank0 = positions_for_context_parallel(16, 2, 0, cu_seqlens=cu, per_document=True)
    assert rank0.tolist() == [0, 3, 0, 1, 6, 7, 0, 3]
    rank1 = positions_for_context_parallel(16, 2, 1, cu_seqlens=cu, per_document=True)
    assert rank1.tolist() == [1, 2, 2, 3, 4, 5, 1, 2]  # tokens 1, 2, 6..9, 13, 14
    contiguous = positions_for_context_parallel(16, 2, 1, cu_seqlens=cu, per_document=True,
                                                load_balance=False)
    assert contiguous.tolist() == [2, 3, 4, 5, 6, 7, 2, 3]  # the second half of each
    # the default split is over the packed sequence (PyTorch's default balancer)
    assert positions_for_context_parallel(16, 2, 0, cu_seqlens=cu).tolist() == [
        0, 1, 2, 3, 0, 1, 2, 3]


def test_per_document_rotation_equals_each_documents_rotation():
    """q of packed documents rotated on each rank with these positions: the rank's rows of
    each document rotated whole, from its own position 0 (float64)."""
    lengths = [8, 4, 12]
    cu = torch.tensor([0, 8, 12, 24])
    x = torch.randn(1, 2, 24, 8, dtype=torch.float64)
    cos, sin = generate_rope_embeddings(12, 8, dtype=torch.float64)
    whole = torch.cat([apply_rope(part, cos, sin) for part in x.split(lengths, dim=-2)], -2)
    covered = []
    for rank in range(2):
        mine = positions_for_context_parallel(24, 2, rank, cu_seqlens=cu, per_document=True)
        tokens = torch.cat([cu[d] + mine_d for d, mine_d in enumerate(
            mine.split([length // 2 for length in lengths]))])
        covered += tokens.tolist()
        torch.testing.assert_close(apply_rope(x[..., tokens, :], cos, sin, positions=mine),
                                   whole[..., tokens, :], rtol=0, atol=1e-12)
    assert sorted(covered) == list(range(24))


ERRORS = {
    "uneven load-balanced": (
        dict(seq_len=10, world_size=2, rank=0), ValueError,
        r"seq_len=10 does not split into 2 \* world_size = 4 equal chunks \(load-balanced: "
        r"rank r holds chunks r and 3 - r\); pad the sequence to a multiple of 4, e.g. 12, or "
        r"pass load_balance=False"),
    "uneven contiguous": (
        dict(seq_len=10, world_size=3, rank=0, load_balance=False), ValueError,
        r"seq_len=10 does not split into world_size = 3 equal chunks; pad the sequence to a "
        r"multiple of 3, e.g. 12$"),
    "uneven for both": (dict(seq_len=10, world_size=3, rank=0), ValueError,
                        r"multiple of 6, e.g. 12$"),
    "rank too large": (dict(seq_len=8, world_size=2, rank=2), ValueError,
                       r"rank must be an int in \[0, 2\) \(world_size=2\), got 2"),
    "float rank": (dict(seq_len=8, world_size=2, rank=1.0), ValueError,
                   r"rank must be an int .*got 1.0"),
    "no ranks": (dict(seq_len=8, world_size=0, rank=0), ValueError,
                 r"world_size must be a positive int, got 0"),
    "negative length": (dict(seq_len=-4, world_size=2, rank=0), ValueError,
                        r"seq_len must be a non-negative int, got -4"),
    "documents too short": (dict(seq_len=8, world_size=2, rank=0,
                                 cu_seqlens=torch.tensor([0, 3, 6])), ValueError,
                            r"cu_seqlens must end at seq_len=8 .*got cu_seqlens\[-1\]=6"),
    "bad cu_seqlens": (dict(seq_len=8, world_size=2, rank=0, cu_seqlens=torch.tensor([1, 8])),
                       ValueError, r"cu_seqlens must start at 0"),
    "per document without documents": (
        dict(seq_len=8, world_size=2, rank=0, per_document=True), ValueError,
        r"per_document=True splits each packed document on its own: pass cu_seqlens"),
    "documents of other lengths": (
        dict(seq_len=12, world_size=2, rank=0, per_document=True,
             cu_seqlens=torch.tensor([0, 6, 12])), ValueError,
        r"but document 0 has 6 tokens; pad each document to a multiple of 4"),
    "per document not a bool": (dict(seq_len=8, world_size=2, rank=0, per_document=1),
                                TypeError, r"per_document must be a bool, got int"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_name_the_argument(case):
    kwargs, exc, pattern = ERRORS[case]
    with pytest.raises(exc, match=pattern):
        positions_for_context_parallel(**kwargs)
