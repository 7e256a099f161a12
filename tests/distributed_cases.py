"""The cases of test_distributed.py, run by each of its processes (issue 38, item 3).

``python tests/distributed_cases.py RANK WORLD_SIZE PORT RESULT.json`` joins a gloo process
group on 127.0.0.1:PORT, runs every case in ``CASES`` and writes ``{case: "ok" or the
traceback}``. Every case seeds the generator alike on all ranks, so each rank can compute
the single-process float64 result itself (``reference.py``, or the same model unsplit) and
compare its share of the distributed one with it.
"""

from __future__ import annotations

import json
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

from ropelib import (  # noqa: E402
    StandardAttentionWithRoPE,
    apply_rope,
    apply_rope_qk,
    generate_rope_embeddings,
    positions_for_context_parallel,
    positions_from_cu_seqlens,
)

F64 = torch.float64
TOL = {"rtol": 0, "atol": 1e-12}
B, H, N, D = 2, 4, 8, 8  # x: (batch, heads, seq, head_dim); each dim splits over 2 ranks


def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def rotated(x: torch.Tensor, positions, layout: str, rotary_dim: int = D) -> torch.Tensor:
    """The single-process float64 rotation: R_{Theta,m} of RoFormer eq. (15) per row."""
    table = reference.angles(positions, reference.thetas(rotary_dim))
    return reference.rope_by_matrix(x, table, layout)


def tables(length: int = 16, rotary_dim: int = D):
    return generate_rope_embeddings(length, rotary_dim, dtype=F64)


def check_dtensor_placement(dim: int) -> None:
    """x sharded over ``dim`` (0 batch, 1 heads, 2 sequence): the result keeps the
    placement, each rank's shard is its slice of the float64 rotation, and so is the
    gradient; with plain and with replicated DTensor tables, per-batch positions, a
    partial rotation and ``out=``."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m = mesh()
    x, w = torch.randn(B, H, N, D, dtype=F64), torch.randn(B, H, N, D, dtype=F64)
    cos, sin = tables()
    pos = torch.randint(0, 16, (B, N))
    for layout in ("interleaved", "half"):
        for table_kind in ("plain", "dtensor"):
            for rd, positions in ((D, None), (D // 2, None), (D, pos)):
                c, s = tables(16, rd)
                if table_kind == "dtensor":
                    c, s = (distribute_tensor(t, m, [Replicate()]) for t in (c, s))
                expected = rotated(x, torch.arange(N) if positions is None else positions,
                                   layout, rd)
                xd = distribute_tensor(x, m, [Shard(dim)]).requires_grad_()
                y = apply_rope(xd, c, s, layout=layout, positions=positions, rotary_dim=rd)
                assert y.placements == (Shard(dim),), (y.placements, layout, table_kind, rd)
                torch.testing.assert_close(y.to_local(), expected.chunk(2, dim)[dist.get_rank()],
                                           **TOL)
                (y * distribute_tensor(w, m, [Shard(dim)])).sum().backward()
                # dL/dx = R^T w: the rotation of w by the opposite angles
                grad = rotated(w, -(torch.arange(N) if positions is None else positions),
                               layout, rd)
                torch.testing.assert_close(xd.grad.full_tensor(), grad, **TOL)
        out = distribute_tensor(torch.zeros(B, H, N, D, dtype=F64), m, [Shard(dim)])
        result = apply_rope(distribute_tensor(x, m, [Shard(dim)]), cos, sin, layout=layout,
                            out=out)
        assert result is out and out.placements == (Shard(dim),)
        torch.testing.assert_close(out.full_tensor(), rotated(x, torch.arange(N), layout), **TOL)


def case_dtensor_over_heads() -> None:
    check_dtensor_placement(1)


def case_dtensor_over_batch() -> None:
    check_dtensor_placement(0)


def case_dtensor_query_and_key_together() -> None:
    """apply_rope_qk on q (4 heads) and k (2 heads) sharded alike over the batch, the heads
    or the sequence, at per-batch positions: each result keeps the placement and each
    rank's shard is its slice of the float64 rotation."""
    from torch.distributed.tensor import Shard, distribute_tensor

    m = mesh()
    q, k = torch.randn(B, H, N, D, dtype=F64), torch.randn(B, H // 2, N, D, dtype=F64)
    pos = torch.randint(0, 16, (B, N))
    for dim in (0, 1, 2):
        qd, kd = (distribute_tensor(t, m, [Shard(dim)]) for t in (q, k))
        q_rot, k_rot = apply_rope_qk(qd, kd, *tables(), layout="half", positions=pos)
        for result, t in ((q_rot, q), (k_rot, k)):
            assert result.placements == (Shard(dim),), (result.placements, dim)
            torch.testing.assert_close(result.full_tensor(), rotated(t, pos, "half"), **TOL)


def case_dtensor_query_and_key_keep_their_own_placements() -> None:
    """Issue 43 item 10: q sharded over its heads beside an MQA k replicated, and beside a k
    of 3 heads sharded unevenly over the heads: exact numbers, and each result keeps its
    input's placement (q was all-gathered: q_rot came back Replicate); with out= into
    destinations of those placements too."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m = mesh()
    q = torch.randn(B, H, N, D, dtype=F64)
    pos = torch.randint(0, 16, (B, N))
    for k, k_placement in ((torch.randn(B, 1, N, D, dtype=F64), Replicate()),
                           (torch.randn(B, 3, N, D, dtype=F64), Shard(1))):
        qd, kd = distribute_tensor(q, m, [Shard(1)]), distribute_tensor(k, m, [k_placement])
        q_rot, k_rot = apply_rope_qk(qd, kd, *tables(), layout="half", positions=pos)
        assert q_rot.placements == (Shard(1),), q_rot.placements
        assert k_rot.placements == (k_placement,), k_rot.placements
        assert q_rot.to_local().shape[1] == 2  # this rank's 2 heads: nothing all-gathered
        torch.testing.assert_close(q_rot.full_tensor(), rotated(q, pos, "half"), **TOL)
        torch.testing.assert_close(k_rot.full_tensor(), rotated(k, pos, "half"), **TOL)
        q_out = distribute_tensor(torch.zeros_like(q), m, [Shard(1)])
        k_out = distribute_tensor(torch.zeros_like(k), m, [k_placement])
        with torch.no_grad():
            apply_rope_qk(qd, kd, *tables(), layout="half", positions=pos, out=(q_out, k_out))
        assert q_out.placements == (Shard(1),) and k_out.placements == (k_placement,)
        torch.testing.assert_close(q_out.full_tensor(), rotated(q, pos, "half"), **TOL)
        torch.testing.assert_close(k_out.full_tensor(), rotated(k, pos, "half"), **TOL)


def case_dtensor_out_of_another_kind_is_named() -> None:
    """Issue 43 item 15: a plain out= beside a DTensor x (and the reverse) got DTensor's
    generic "mixed torch.Tensor and DTensor" message; it names out and x."""
    import pytest
    from torch.distributed.tensor import Shard, distribute_tensor

    m = mesh()
    x = torch.randn(B, H, N, D, dtype=F64)
    xd = distribute_tensor(x, m, [Shard(1)])
    cos, sin = tables()
    with torch.no_grad():
        with pytest.raises(TypeError, match=r"out is a plain torch.Tensor but x is a DTensor; "
                                            r"pass out of x's kind"):
            apply_rope(xd, cos, sin, out=torch.zeros_like(x))
        with pytest.raises(TypeError, match=r"out is a DTensor but x is a plain torch.Tensor"):
            apply_rope(x, cos, sin, out=torch.zeros_like(xd))
        with pytest.raises(TypeError, match=r"k_out is a plain torch.Tensor but k is a DTensor"):
            apply_rope_qk(xd, xd, cos, sin, out=(torch.zeros_like(xd), torch.zeros_like(x)))


def case_dtensor_over_sequence_gets_its_rows() -> None:
    """Also with the positions a DTensor sharded like x (the operator gets them whole)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    check_dtensor_placement(2)
    m = mesh()
    x, pos = torch.randn(B, H, N, D, dtype=F64), torch.randint(0, 16, (N,))
    y = apply_rope(distribute_tensor(x, m, [Shard(2)]), *tables(),
                   positions=distribute_tensor(pos, m, [Shard(0)]))
    assert y.placements == (Shard(2),)
    torch.testing.assert_close(y.full_tensor(), rotated(x, pos, "interleaved"), **TOL)


def case_dtensor_multi_axis_over_sequence() -> None:
    """M-RoPE positions ``(seq, 3)`` with x sharded over the sequence: the operator's
    positions are sharded with x, the full tables replicated."""
    from torch.distributed.tensor import Shard, distribute_tensor

    x = torch.randn(B, H, N, D, dtype=F64)
    coords = torch.randint(0, 16, (N, 3))
    axes = torch.tensor([0, 1, 2, 1])
    cos, sin = tables()
    y = apply_rope(distribute_tensor(x, mesh(), [Shard(2)]), cos, sin, positions=coords,
                   axes=axes)
    angle = coords[:, axes].to(F64) * reference.thetas(D)
    assert y.placements == (Shard(2),)
    torch.testing.assert_close(y.full_tensor(), reference.rope_by_matrix(x, angle), **TOL)


def case_operators_on_a_two_dim_mesh() -> None:
    """The operators called directly (after ``register_sharding_rules``) on a (1, 2) mesh,
    as tensor parallelism inside data parallelism lays it out: ``rotate`` keeps x's
    placements; ``apply_rope(..., out=out)`` writes into ``out`` where it lies, also when x
    has other placements (out is never moved: its local tensors are the result)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ropelib import distributed

    distributed.register_sharding_rules()
    m = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    x = torch.randn(B, H, N, D, dtype=F64)
    cos, sin = (distribute_tensor(t, m, [Replicate(), Replicate()]) for t in tables(N))
    expected = rotated(x, torch.arange(N), "half")
    placements = [Shard(0), Shard(1)]
    y = torch.ops.ropelib.rotate.default(distribute_tensor(x, m, placements), cos, sin, "half", D)
    assert y.placements == tuple(placements)
    torch.testing.assert_close(y.full_tensor(), expected, **TOL)
    for x_placements in (placements, [Replicate(), Shard(2)]):
        out = distribute_tensor(torch.zeros(B, H, N, D, dtype=F64), m, placements)
        local = out.to_local()
        with torch.no_grad():
            apply_rope(distribute_tensor(x, m, x_placements), cos, sin, layout="half", out=out)
        assert out.placements == tuple(placements)
        assert out.to_local().data_ptr() == local.data_ptr()
        torch.testing.assert_close(local, expected.chunk(2, 1)[dist.get_rank()], **TOL)


def case_dtensor_partial_stays_partial() -> None:
    """A Partial (sum) x: the rotation is linear, so each rank rotates its summand."""
    from torch.distributed.tensor import DTensor, Partial

    x = torch.randn(B, H, N, D, dtype=F64)
    part = x * (0.25 if dist.get_rank() == 0 else 0.75)
    cos, sin = tables()
    y = apply_rope(DTensor.from_local(part, mesh(), [Partial()]), cos, sin)
    assert y.placements == (Partial(),)
    torch.testing.assert_close(y.full_tensor(), rotated(x, torch.arange(N), "interleaved"), **TOL)


def case_dtensor_refusals() -> None:
    """Local positions with a sequence-sharded x, DTensor tables with a plain x: refused
    with messages that say what to pass. A destination sharded over the channels takes the
    rotation (a copy of the result, which DTensor redistributes) and keeps its placement."""
    import pytest
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m = mesh()
    x = torch.randn(B, H, N, D, dtype=F64)
    cos, sin = tables()
    with pytest.raises(ValueError, match=r"positions cover 4 tokens, the length of this rank's "
                       r"shard of x, but x is a DTensor whose global sequence has 8 .*pass the "
                       r"positions of the whole sequence \(shape \(\.\.\., 8\)\)"):
        apply_rope(distribute_tensor(x, m, [Shard(2)]), cos, sin, positions=torch.arange(4))
    out = distribute_tensor(torch.zeros_like(x), m, [Shard(3)])
    with torch.no_grad():
        apply_rope(distribute_tensor(x, m, [Shard(1)]), cos, sin, out=out)
    assert out.placements == (Shard(3),)
    torch.testing.assert_close(out.full_tensor(), rotated(x, torch.arange(N), "interleaved"),
                               **TOL)
    with pytest.raises(TypeError, match=r"cos and sin are DTensors but x is a plain "
                       r"torch.Tensor; pass x as a DTensor too"):
        apply_rope(x, distribute_tensor(cos, m, [Replicate()]),
                   distribute_tensor(sin, m, [Replicate()]))


def case_context_parallel_buffers_match() -> None:
    """PyTorch's ``context_parallel`` shards a positions buffer and the tables (each
    rank keeps its tokens' rows): the positions are ``positions_for_context_parallel``'s,
    for the load-balanced default and for contiguous chunks."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options

    rank, world = dist.get_rank(), dist.get_world_size()
    for load_balance in (True, False):
        _cp_options.enable_load_balance = load_balance
        try:
            buffer = torch.arange(N)[None]
            cos, sin = tables(N)
            full_cos = cos.clone()
            with context_parallel(mesh(), buffers=[buffer, cos, sin], buffer_seq_dims=[1, 0, 0]):
                mine = positions_for_context_parallel(N, world, rank, load_balance=load_balance)
                assert torch.equal(buffer[0], mine), (buffer, mine)
                assert torch.equal(cos, full_cos[mine])
        finally:
            _cp_options.enable_load_balance = True


def gather(t: torch.Tensor, dim: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def case_context_parallel_rotation() -> None:
    """Each rank rotates its share of q and k by ``positions_for_context_parallel`` (both
    splits, one sequence and packed documents): the all-gathered q and k put back in
    order equal the unsplit float64 rotation, and the scores between this rank's queries
    and the other rank's keys equal the unsplit scores there. Local positions 0.. would
    get those scores wrong (checked, so the comparison can fail)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k = torch.randn(B, H, N, D, dtype=F64), torch.randn(B, H, N, D, dtype=F64)
    cos, sin = tables()
    cu = torch.tensor([0, 3, N])
    for load_balance in (True, False):
        tokens = positions_for_context_parallel(N, world, rank, load_balance=load_balance)
        for docs in (None, cu):
            pos = positions_for_context_parallel(N, world, rank, load_balance=load_balance,
                                                 cu_seqlens=docs)
            global_pos = torch.arange(N) if docs is None else positions_from_cu_seqlens(docs)
            for layout in ("interleaved", "half"):
                q_rot = apply_rope(q[..., tokens, :], cos, sin, layout=layout, positions=pos)
                k_rot = apply_rope(k[..., tokens, :], cos, sin, layout=layout, positions=pos)
                order = torch.cat(gather(tokens, 0))
                q_ref, k_ref = (rotated(t, global_pos, layout) for t in (q, k))
                torch.testing.assert_close(torch.cat(gather(q_rot, 2), 2)[..., order.argsort(), :],
                                           q_ref, **TOL)
                k_parts = gather(k_rot, 2)
                torch.testing.assert_close(torch.cat(k_parts, 2)[..., order.argsort(), :],
                                           k_ref, **TOL)
                other = 1 - rank
                other_tokens = gather(tokens, 0)[other]
                scores = q_rot @ k_parts[other].transpose(-1, -2)
                expected = (q_ref @ k_ref.transpose(-1, -2))[..., tokens, :][..., other_tokens]
                torch.testing.assert_close(scores, expected, rtol=0, atol=1e-10)
                local = apply_rope(q[..., tokens, :], cos, sin, layout=layout)
                wrong = local @ apply_rope(k[..., other_tokens, :], cos, sin,
                                           layout=layout).transpose(-1, -2)
                assert not torch.allclose(wrong, expected)


def case_context_parallel_attention_module() -> None:
    """The attention module on this rank's queries with ``positions=``, attending to the
    keys of all ranks (all-gathered, with their positions and a causal mask built from
    them: all-gather context parallelism) gives the unsplit module's output rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    attn = StandardAttentionWithRoPE(16, 2, layout="half").double()
    hidden = torch.randn(B, N, 16, dtype=F64)
    full = attn(hidden, hidden, hidden, is_causal=True)
    for load_balance in (True, False):
        tokens = positions_for_context_parallel(N, world, rank, load_balance=load_balance)
        key_tokens = torch.cat(gather(tokens, 0))
        keys = torch.cat(gather(hidden[:, tokens], 1), 1)
        mask = key_tokens[None, :] <= tokens[:, None]
        out = attn(hidden[:, tokens], keys, keys, attn_mask=mask, positions=tokens,
                   key_positions=key_tokens)
        torch.testing.assert_close(out, full[:, tokens], rtol=0, atol=1e-12)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = StandardAttentionWithRoPE(dim, heads, max_position_embeddings=32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x, x, x, is_causal=True)


def stack() -> nn.Module:
    return nn.Sequential(Block(16, 2), Block(16, 2), Block(16, 2))


def check_fully_shard(meta: bool) -> None:
    """FSDP2: a stack of attention layers sharded over 2 ranks, each on half the batch,
    against the same stack unsplit on the whole batch: the output rows, the gradients
    (averaged over ranks by FSDP, the mean loss of the whole batch unsplit), the
    parameters after an AdamW step, and the next forward. With ``meta``, the sharded stack
    is built on the meta device, ``to_empty`` rebuilds the rotary tables (buffers, which
    FSDP does not shard) and the weights are loaded from the unsplit stack."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    rank, m = dist.get_rank(), mesh()
    torch.manual_seed(2)
    reference_model = stack().double()
    if meta:
        with torch.device("meta"):
            model = stack().double()
    else:
        torch.manual_seed(2)
        model = stack().double()
    for block in model:
        fully_shard(block, mesh=m)
    fully_shard(model, mesh=m)
    if meta:
        model.to_empty(device="cpu")
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(distribute_tensor(reference_model.get_parameter(name), m, p.placements,
                                          src_data_rank=None))
    for block, ref_block in zip(model, reference_model, strict=True):
        assert torch.equal(block.attn.rotary.cos_cached, ref_block.attn.rotary.cos_cached)
    x = torch.randn(4, N, 16, dtype=F64)
    mine = slice(2 * rank, 2 * rank + 2)
    optimizers = [torch.optim.AdamW(net.parameters(), lr=1e-2) for net in (model, reference_model)]
    for _ in range(2):
        out, ref_out = model(x[mine]), reference_model(x)
        torch.testing.assert_close(out, ref_out[mine], rtol=0, atol=1e-12)
        out.square().mean().backward()
        ref_out.square().mean().backward()
        for (name, p), ref in zip(model.named_parameters(), reference_model.parameters(),
                                  strict=True):
            torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=0, atol=1e-12,
                                       msg=lambda text, n=name: f"grad of {n}: {text}")
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        for p, ref in zip(model.parameters(), reference_model.parameters(), strict=True):
            torch.testing.assert_close(p.full_tensor(), ref, rtol=0, atol=1e-12)


def case_fully_shard() -> None:
    check_fully_shard(meta=False)


def case_fully_shard_meta_init() -> None:
    check_fully_shard(meta=True)


CASES = {name[len("case_"):]: fn for name, fn in dict(globals()).items()
         if name.startswith("case_")}


def main(rank: int, world_size: int, port: int, result: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    import torch.distributed.tensor  # noqa: F401  (DTensor, before any case times itself)

    outcomes = {}
    for name, case in CASES.items():
        torch.manual_seed(0)
        try:
            case()
            outcomes[name] = "ok"
        except Exception:  # reported per case by test_distributed.py
            outcomes[name] = traceback.format_exc()
        dist.barrier()
    dist.destroy_process_group()
    result.write_text(json.dumps(outcomes))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
