"""RoPE on DTensors: sharding rules for the rotation operators ``ropelib::rotate`` and
``ropelib::rotate_out`` and the q-and-k operators ``ropelib::rotate_qk`` and
``ropelib::rotate_qk_out``.

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

``apply_rope`` calls ``plain_arguments`` when x or a table is not a plain tensor: it
registers the rules on first use, so ``import ropelib`` never imports
``torch.distributed.tensor`` (about a second), and hands the checks and the row selection
plain tables and positions (they speak of the global sequence); ``replicated_arguments``
then gives the operator the rows as DTensors replicated on x's mesh. So plain tables
(and positions, axes) with a DTensor x are taken as replicated: the same on every rank, as
``RotaryEmbedding`` builds them. Whoever calls the operators on DTensors without
``apply_rope`` calls ``register_sharding_rules()`` once first.

FSDP2 (``fully_shard``) needs none of this: it gathers the parameters into plain tensors
before each forward, so the rotation sees plain q and k, and the rotary tables of
``RotaryEmbedding`` are buffers, which it leaves whole on each rank.
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


def plain_arguments(rotated: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor,
                    positions: torch.Tensor | None, axes: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                               torch.Tensor | None]:
    """The first half of a DTensor call of ``apply_rope`` (``rotated = (x,)``) or
    ``apply_rope_qk`` (``(q, k)``): ``cos``, ``sin``, ``positions`` and ``axes`` as plain
    tensors (a DTensor's whole value, ``full_tensor()``), so that the checks and the row
    selection work on them as usual; the sharding rules are registered. Arguments that
    hold no DTensor come back as they are. ``replicated_arguments`` hands the rows to the
    operator.

    Raises:
        TypeError: DTensors mixed with plain tensors to rotate, or DTensor tables with a
            plain x (which placement x has is unknown).
        ValueError: plain positions of the length of x's local shard, not of its global
            sequence.
    """
    dtensor = dtensor_class()
    if dtensor is None:
        return cos, sin, positions, axes
    names = ("x",) if len(rotated) == 1 else ("q", "k")
    distributed = [isinstance(t, dtensor) for t in rotated]
    if any(distributed) and not all(distributed):
        raise TypeError(f"{names[distributed.index(True)]} is a DTensor but "
                        f"{names[distributed.index(False)]} is a plain torch.Tensor; pass "
                        "both as DTensors (e.g. DTensor.from_local(k, mesh, placements))")
    tables = [name for name, t in (("cos", cos), ("sin", sin), ("positions", positions),
                                   ("axes", axes)) if isinstance(t, dtensor)]
    if not all(distributed):
        if tables:
            these = ("x is a plain torch.Tensor; pass x as a DTensor" if len(names) == 1
                     else "q and k are plain torch.Tensors; pass q and k as DTensors")
            raise TypeError(
                f"{' and '.join(tables)} {'is a DTensor' if len(tables) == 1 else 'are DTensors'}"
                f" but {these} too (e.g. DTensor.from_local(x, mesh, placements)), or plain "
                "tables (cos.full_tensor(), sin.full_tensor())")
        return cos, sin, positions, axes
    register_sharding_rules()
    cos, sin, positions, axes = (t.full_tensor() if isinstance(t, dtensor) else t
                                 for t in (cos, sin, positions, axes))
    if positions is not None:
        _check_global_positions(rotated[0], positions, axes is not None)
    return cos, sin, positions, axes


def replicated_arguments(x: torch.Tensor, *tensors: torch.Tensor | None
                         ) -> tuple[torch.Tensor | None, ...]:
    """The second half of a DTensor call: the table rows, coordinates and axes that the
    operator gets beside a DTensor x, as DTensors replicated on x's mesh (the same on
    every rank, as ``RotaryEmbedding`` builds them); the operator's sharding rules then
    take from them what each rank needs. Unchanged when x is not a DTensor."""
    dtensor = dtensor_class()
    if dtensor is None or not isinstance(x, dtensor):
        return tensors
    from torch.distributed.tensor import Replicate

    mesh = x.device_mesh
    return tuple(t if t is None or isinstance(t, dtensor) else
                 dtensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
                 for t in tensors)


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
    """Registers the sharding rules of the rotation operators (``ropelib::rotate``,
    ``ropelib::rotate_out``, ``ropelib::rotate_qk`` and ``ropelib::rotate_qk_out``) with DTensor
    (``torch.distributed.tensor.experimental.register_sharding``); once per process, later
    calls do nothing."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor.experimental import register_sharding

    from . import kernels  # noqa: F401  (defines the operators)

    for name, rule in _RULES.items():
        register_sharding(getattr(torch.ops.ropelib, name).default)(rule)
    _registered = True


def _rotate_strategies(x, cos, sin, layout, rotary_dim, inverse=False, positions=None,
                       axes=None) -> list[tuple[list, list]]:
    """The placements (output, inputs) under which ``ropelib::rotate`` runs on each rank's
    local tensors, one per placement x may have on a mesh dim (see the module's text)."""
    return [([placement], [placement] + inputs[:2] + [None] * 3 + inputs[2:])
            for placement, inputs in _placements(x, cos, positions)]


def _rotate_out_strategies(x, cos, sin, layout, rotary_dim, out, positions=None,
                           axes=None) -> list[tuple[list, list]]:
    """``ropelib::rotate_out``'s placements: ``out`` keeps the placement it has (DTensor
    would otherwise write into a redistributed copy), and x is brought to it."""
    return _in_place([([], [placement] + inputs[:2] + [None, None, placement] + inputs[2:])
                      for placement, inputs in _placements(x, cos, positions)
                      if placement in out.placements], "out", out)


def _rotate_qk_strategies(q, k, cos, sin, layout, rotary_dim, inverse=False, positions=None,
                          axes=None) -> list[tuple[list, list]]:
    """``ropelib::rotate_qk``: q and k each keep a placement of their own (q sharded over
    its heads beside an MQA k replicated, or k sharded unevenly), each result that of its
    input, wherever one set of rows serves both."""
    return [([pq, pk], [pq, pk] + inputs[:2] + [None] * 3 + inputs[2:])
            for pq, pk, inputs in _pair_placements(q, k, cos, positions)]


def _rotate_qk_out_strategies(q, k, cos, sin, layout, rotary_dim, q_out, k_out,
                              positions=None, axes=None) -> list[tuple[list, list]]:
    """``ropelib::rotate_qk_out``: ``q_out`` and ``k_out`` keep their placements, as
    ``out`` does for ``rotate_out``, and q and k are brought to them."""
    return _in_place([([], [pq, pk] + inputs[:2] + [None] * 2 + [pq, pk] + inputs[2:])
                      for pq, pk, inputs in _pair_placements(q, k, cos, positions)
                      if pq in q_out.placements and pk in k_out.placements],
                     "q_out and k_out", q_out)


def _pair_placements(q, k, table, positions) -> list[tuple[object, object, list]]:
    """(q's placement, k's, the placements of (cos, sin, positions, axes)) for every pair of
    ``_placements`` of q and of k that need the same placements of the rows."""
    return [(pq, pk, inputs_q) for pq, inputs_q in _placements(q, table, positions)
            for pk, inputs_k in _placements(k, table, positions) if inputs_q == inputs_k]


def _in_place(strategies: list, name: str, out) -> list:
    """The strategies of an operator that writes into ``name``; a ValueError when none
    keeps its placement (it is sharded over the channels, or q_out and k_out need other
    rows)."""
    if not strategies:
        raise ValueError(f"{name} must be replicated or sharded over a dim other than the "
                         f"channels, for the rotation to write into each rank's shard; got "
                         f"placements {out.placements}. Pass a destination laid out like x, "
                         "or none")
    return strategies


_RULES = {"rotate": _rotate_strategies, "rotate_out": _rotate_out_strategies,
          "rotate_qk": _rotate_qk_strategies, "rotate_qk_out": _rotate_qk_out_strategies}


def _placements(x, table, positions) -> list[tuple[object, list]]:
    """For every placement of x on one mesh dim under which the rotation runs locally: that
    placement (also the result's) and the placements of (cos, sin, positions, axes),
    None where an argument is None. Multi-axis positions (given only with axes) carry
    x's dims; the full tables they index are replicated."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    def aligned(spec, dim: int):
        """``spec``'s placement for x sharded over dim (<= seq), its dims aligned with x's
        at the right of the rows; Replicate where it has no such dim or only a size 1."""
        local = dim - (x.ndim - 2) + (spec.ndim - 2)
        if local < 0 or spec.shape[local] == 1:
            return Replicate()
        return Shard(local)

    replicated = [Replicate()] * 2 + ([None, None] if positions is None else [Replicate()] * 2)
    options = [(Replicate(), replicated)]
    for dim in range(x.ndim - 1):  # every dim but the channels
        if positions is None:
            inputs = [aligned(table, dim)] * 2 + [None, None]
        else:
            rows = aligned(positions, dim) if positions.ndim == x.ndim else Replicate()
            inputs = [Replicate()] * 2 + [rows, Replicate()]
        options.append((Shard(dim), inputs))
    for placement in x.placements:
        if isinstance(placement, Partial) and placement.reduce_op in ("sum", "avg"):
            options.append((placement, replicated))
    return options
