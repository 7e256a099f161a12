"""RoPE on DTensors: sharding rules for the operators ``ropelib::rotate`` and
``ropelib::rotate_out``.

A rotation works on each token's channel pairs with that token's rows of cos and sin, so
it splits over every dim but the channels:

- **x sharded over a batch or head dim** (tensor parallelism shards the heads): every rank
  rotates its own slice with the tables' rows, which are replicated (or sharded alike,
  when the gathered rows carry that dim).
- **x sharded over the sequence**: the rows of the tables (or the positions of multi-axis
  RoPE) are sharded the same way, so each rank turns its tokens by their global
  positions. A DTensor's shards are contiguous pieces of the global sequence; for the
  load-balanced split of context parallelism, rotate plain local tensors with
  ``ropelib.positions_for_context_parallel`` instead.
- **x Partial** (a sum or mean still to be reduced): the rotation is linear, so it rotates
  each rank's part and the result stays Partial.
- **x sharded over the channels**: a pair may span two ranks; DTensor redistributes x to
  one of the placements above first (a collective), and the result has that placement.

``apply_rope`` calls ``dtensor_arguments`` when x or a table is not a plain tensor: it
registers the rules on first use, so ``import ropelib`` never imports
``torch.distributed.tensor`` (about a second). Plain tables (and positions, axes) with a
DTensor x are taken as replicated: the same on every rank, as ``RotaryEmbedding`` builds
them. Whoever calls the operators on DTensors without ``apply_rope`` calls
``register_sharding_rules()`` once first.

Only ``torch.Tensor`` arguments take part: under FSDP2 (``fully_shard``) the parameters are
gathered into plain tensors before the forward, so the rotation sees plain q and k and
needs none of this; the rotary tables of ``RotaryEmbedding`` are buffers, which
``fully_shard`` leaves alone on each rank.
"""

from __future__ import annotations

import sys

import torch

_registered = False


def dtensor_class() -> type | None:
    """``torch.distributed.tensor.DTensor`` if that module was imported, else None: a
    DTensor can exist only then, so nothing is imported to find out."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def dtensor_arguments(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      positions: torch.Tensor | None, axes: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                 torch.Tensor | None]:
    """``apply_rope``'s arguments ready for the operators when some are DTensors: plain
    ``cos``, ``sin``, ``positions`` and ``axes`` beside a DTensor x become replicated
    DTensors on x's mesh, and the sharding rules are registered. Arguments that hold no
    DTensor come back as they are.

    Raises:
        TypeError: a DTensor table with a plain x (which placement x has is unknown).
        ValueError: plain positions of the length of x's local shard, not of its global
            sequence.
    """
    dtensor = dtensor_class()
    if dtensor is None:
        return cos, sin, positions, axes
    tables = [name for name, t in (("cos", cos), ("sin", sin), ("positions", positions),
                                   ("axes", axes)) if isinstance(t, dtensor)]
    if not isinstance(x, dtensor):
        if tables:
            raise TypeError(
                f"{' and '.join(tables)} {'is a DTensor' if len(tables) == 1 else 'are DTensors'}"
                " but x is a plain torch.Tensor; pass x as a DTensor too (e.g. "
                "DTensor.from_local(x, mesh, placements)), or plain tables "
                "(cos.full_tensor(), sin.full_tensor()) for a plain x")
        return cos, sin, positions, axes
    register_sharding_rules()
    if positions is not None and not isinstance(positions, dtensor):
        _check_global_positions(x, positions, axes is not None)
    mesh = x.device_mesh
    return tuple(t if t is None or isinstance(t, dtensor) else _replicated(t, mesh, dtensor)
                 for t in (cos, sin, positions, axes))


def _replicated(t: torch.Tensor, mesh, dtensor: type) -> torch.Tensor:
    from torch.distributed.tensor import Replicate

    return dtensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _check_global_positions(x: torch.Tensor, positions: torch.Tensor, multi_axis: bool) -> None:
    """Refuses plain positions that fit x's local shard along the sequence but not its
    global length: the positions of a DTensor x are those of its global sequence."""
    seq_dim = -2 if multi_axis else -1
    if positions.ndim < -seq_dim:
        return
    local, global_ = x.to_local().shape[-2], x.shape[-2]
    if positions.shape[seq_dim] == local != global_:
        raise ValueError(
            f"positions cover {local} tokens, the length of this rank's shard of x, but x is a "
            f"DTensor whose global sequence has {global_} (placements {x.placements}); pass the "
            f"positions of the whole sequence (shape (..., {global_})), or rotate the local "
            "tensor x.to_local() with this rank's positions")


def register_sharding_rules() -> None:
    """Registers the sharding rules of ``ropelib::rotate`` and ``ropelib::rotate_out`` with
    DTensor (``torch.distributed.tensor.experimental.register_sharding``); once per
    process, later calls do nothing."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor.experimental import register_sharding

    from . import kernels  # noqa: F401  (defines the operators)

    register_sharding(torch.ops.ropelib.rotate.default)(_rotate_strategies)
    register_sharding(torch.ops.ropelib.rotate_out.default)(_rotate_out_strategies)
    _registered = True


def _rotate_strategies(x, cos, sin, layout, rotary_dim, inverse=False, positions=None,
                       axes=None) -> list[tuple[list, list]]:
    """The placements (output, inputs) under which ``ropelib::rotate`` runs on each rank's
    local tensors, one per placement x may have on a mesh dim (see the module's text)."""
    return [([placement], inputs) for placement, inputs in
            _placements(x, cos, positions, axes, [None, None, None])]


def _rotate_out_strategies(x, cos, sin, layout, rotary_dim, out, positions=None,
                           axes=None) -> list[tuple[list, list]]:
    """``ropelib::rotate_out``'s placements: ``out`` keeps the placement it has (DTensor
    would otherwise write into a redistributed copy), and x is brought to it."""
    keep = set(out.placements)
    return [([], inputs[:5] + [placement] + inputs[5:]) for placement, inputs in
            _placements(x, cos, positions, axes, [None, None]) if placement in keep]


def _placements(x, table, positions, axes, scalars: list) -> list[tuple[object, list]]:
    """(placement of x and the output, placements of the operator's arguments in order)
    for every placement of x on one mesh dim that rotates locally; ``scalars``: the Nones
    of the non-tensor arguments after sin (layout, rotary_dim[, inverse])."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    def tail(placement_of) -> list:
        """Placements of (positions, axes) for a shard of x's dim."""
        return [None if positions is None else placement_of(positions),
                None if axes is None else Replicate()]

    def aligned(spec, dim: int):
        """``spec``'s placement for x sharded over dim (<= seq), its dims aligned with x's
        at the right of the rows; Replicate where it has no such dim or only a size 1."""
        local = dim - (x.ndim - 2) + (spec.ndim - 2)
        if local < 0 or spec.shape[local] == 1:
            return Replicate()
        return Shard(local)

    options = [(Replicate(), [Replicate()] * 3 + scalars + tail(lambda _: Replicate()))]
    for dim in range(x.ndim - 1):  # every dim but the channels
        if positions is not None:  # multi-axis: full tables, rows read by coordinates
            tables = [Replicate()] * 2
            rows = tail(lambda p, d=dim: aligned(p, d) if p.ndim == x.ndim else Replicate())
        else:
            tables = [aligned(table, dim)] * 2
            rows = tail(lambda _: Replicate())
        options.append((Shard(dim), [Shard(dim)] + tables + scalars + rows))
    for placement in x.placements:
        if isinstance(placement, Partial) and placement.reduce_op in ("sum", "avg"):
            options.append((placement, [placement] + [Replicate()] * 2 + scalars
                            + tail(lambda _: Replicate())))
    return options
