"""RoPE on DTensors: sharding rules of ``ropelib::rotate`` and ``ropelib::rotate_qk``.

A rotation splits over every dim but the channels: x sharded over batch or heads rotates its
slice with replicated rows; over the sequence, the rows (or multi-axis positions) are sharded
alike, so each rank turns its tokens by their global positions (context parallelism's
load-balanced split: rotate local tensors with ``ropelib.positions_for_context_parallel``);
Partial x stays Partial (the rotation is linear); over the channels, DTensor redistributes x
first. A destination (``out=``) takes a copy of the result. ``apply_rope`` hands the checks
plain tables (``plain_arguments``, which registers the rules on first use) and the operator
replicated rows (``replicated_arguments``); who calls the operators on DTensors directly
calls ``register_sharding_rules()`` first. FSDP2 needs none of this.
"""

from __future__ import annotations

import sys

import torch

_registered = False


def dtensor_class() -> type | None:
    """``DTensor`` if ``torch.distributed.tensor`` was imported, else None (none can exist)."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def plain_arguments(rotated: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor,
                    positions: torch.Tensor | None, axes: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                               torch.Tensor | None]:
    """cos, sin, positions and axes of a DTensor call (``rotated``: ``(x,)`` or ``(q, k)``) as
    plain tensors for the checks and the rows; refuses DTensors mixed with plain tensors."""
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
    """The tensors beside a DTensor x replicated on its mesh; unchanged for a plain x."""
    dtensor = dtensor_class()
    if dtensor is None or not isinstance(x, dtensor):
        return tensors
    from torch.distributed.tensor import Replicate

    mesh = x.device_mesh
    return tuple(t if t is None or isinstance(t, dtensor) else
                 dtensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
                 for t in tensors)


def _check_global_positions(x: torch.Tensor, positions: torch.Tensor, multi_axis: bool) -> None:
    """Refuses positions of the length of x's local shard, not of its global sequence."""
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
    """Registers the operators' sharding rules with DTensor, once per process."""
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
    """(output, inputs) placements of ``ropelib::rotate``, one per placement of x."""
    return [([placement], [placement] + inputs[:2] + [None] * 3 + inputs[2:])
            for placement, inputs in _placements(x, cos, positions)]


def _rotate_qk_strategies(q, k, cos, sin, layout, rotary_dim, inverse=False, positions=None,
                          axes=None) -> list[tuple[list, list]]:
    """``ropelib::rotate_qk``: q and k keep placements that one set of rows serves."""
    return [([pq, pk], [pq, pk] + inputs_q[:2] + [None] * 3 + inputs_q[2:])
            for pq, inputs_q in _placements(q, cos, positions)
            for pk, inputs_k in _placements(k, cos, positions) if inputs_q == inputs_k]


_RULES = {"rotate": _rotate_strategies, "rotate_qk": _rotate_qk_strategies}


def _placements(x, table, positions) -> list[tuple[object, list]]:
    """(x's placement, the placements of (cos, sin, positions, axes)) for each under which the
    rotation runs locally."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    def aligned(spec, dim: int):
        """``spec``'s placement for x sharded over dim, aligned at the right of the rows."""
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
