"""Plans of device calls: what the first call of a signature worked out, kept for the next.

A call of ``apply_rope``, ``apply_rope_qk`` or ``apply_rope_qk_to_cache`` on the device
route (values not read on the host; nobody watching: no compiler, tracer, ``torch.func``
transform, dispatch mode or gradient) has a signature (``signature``): the shapes, strides,
dtypes and devices of its tensors, its options, ``ROPELIB_BACKEND`` (read per call) and
whether its destinations are its own inputs. The first call of a signature runs every check
and chooses the backend; ``make`` keeps the result as a ``Plan`` (the Triton kernel's
prepared launch, or word that another backend takes such calls) in a bounded dict owned by
this module, never on the caller's tensors. A later call with the same signature finds it
(``signature``), checks only what depends on addresses (overlaps of its destinations, done by
the caller) and launches (``ropelib.triton_rope.launch``); values (positions, offsets, axes,
slots) are checked in the kernel, on every call.

A plan holds numbers and dtypes, never a tensor. It is valid for a signature because the
first call's checks and its launch's numbers read nothing else, and because the kernel's
tensors are the caller's own (``make`` keeps a plan only when the tables, coordinates and
axes the checks hand on start where the caller's do: a slice at row 0, a reshape, an int64
tensor as it is; a gather, a copy or a slice at another row depends on values and takes
no plan).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from types import ModuleType
from typing import NamedTuple

import torch

from . import kernels
from ._checks import new_output

MAX_PLANS = 512  # signatures kept; the dict is emptied when full (a plan is cheap to remake)
_OPTION_TYPES = (str, int, bool, type(None))


class Plan(NamedTuple):
    """A signature's plan: ``kernel``, the Triton backend (``ropelib.triton_rope``) that runs
    such calls with ``launch`` (its ``prepare``'s; None: the tensors are empty, nothing to
    launch), or None when another backend takes them (they take the full path).
    ``extents``: the bytes each tensor of ``checked`` spans, whose addresses must be apart
    (``apart``); ``in_place``: every destination is its x itself."""

    kernel: ModuleType | None
    launch: object = None
    extents: tuple[int, ...] = ()
    in_place: bool = False


_plans: dict[tuple, Plan] = {}


def signature(tensors: Sequence[torch.Tensor | None], options: Sequence[object]
              ) -> tuple[tuple | None, Plan | None]:
    """(The key, the plan kept under it or None) of a call with these tensors (None where
    an optional one is not given) and
    options (str, int, bool or None): ``ROPELIB_BACKEND``, the options and per tensor its
    shape, strides, dtype, device and negation bit. (None, None) when the call takes no
    plan: a tensor that is not a plain ``torch.Tensor`` or records autograd, or an option
    of another type. (The caller has asked ``watcher`` first: nobody watches the call.)"""
    for option in options:
        if type(option) not in _OPTION_TYPES:
            return None, None
    grad = torch.is_grad_enabled()
    key = [os.environ.get("ROPELIB_BACKEND"), *options]
    for t in tensors:  # one pass: each tensor checked and keyed
        if t is None:
            key.append(None)
        elif type(t) is torch.Tensor and not (grad and t.requires_grad):
            key.append((t.shape, t.stride(), t.dtype, t.device, t.is_neg()))
        else:
            return None, None
    key = tuple(key)
    return key, _plans.get(key)


def make(key: tuple, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
         cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
         coordinates: torch.Tensor | None, axes: torch.Tensor | None,
         pending: kernels.UncheckedRange | None, given: Sequence[torch.Tensor | None],
         slot: torch.Tensor | None = None) -> Plan | None:
    """The plan of a checked call, kept under ``key``: the backend ``kernels`` chooses for
    its operands (x's ``(..., heads, seq, head_dim)``, the destinations given or None, the
    rows or tables, the coordinates still ``pending``, axes, a cache step's slot) and, for
    the Triton kernel, its prepared launch. ``given``: the caller's tensors for the tables,
    coordinates, axes (and slot); the kernel takes them in later calls, so the plan is the
    Triton kernel's only where each operand starts at its caller's tensor's address. None
    when the backend refuses the call (the full path raises it, after the checks it runs
    first)."""
    try:
        backend, examined = kernels.choose_backend(xs, outs, cos, sin, rotary_dim, coordinates)
    except ValueError:
        return None
    operands = (cos, sin, coordinates, axes) + (() if slot is None else (slot,))
    own = all(a is None if b is None else (a is not None and a.data_ptr() == b.data_ptr())
              for a, b in zip(operands, given, strict=True))
    if backend.prepare is not None and own:
        same = in_place(xs, outs)
        plan = Plan(backend, backend.prepare(examined, xs, outs, layout, rotary_dim, False,
                                             axes, pending, slot is not None, same),
                    tuple(end - start for start, end in map(kernels.byte_span, checked(
                        xs, outs, cos, sin, same))), same)
    else:
        plan = Plan(None)
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan
    return plan


def run(plan: Plan, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
        cos: torch.Tensor, sin: torch.Tensor, coordinates: torch.Tensor | None,
        axes: torch.Tensor | None, slot: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The call of a Triton ``plan`` with the caller's tensors (x's ``(..., heads, seq,
    head_dim)``, their destinations, None for new ones (``new_output``), the tables or rows,
    the caller's positions or 0-d offset, axes and cache slot, as ``make`` saw them): one
    launch. Returns the destinations."""
    outs = [new_output(x) if o is None else o for x, o in zip(xs, outs, strict=True)]
    plan.kernel.launch(plan.launch, xs, outs, cos, sin, coordinates, axes, slot)
    return outs


def checked(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
            sin: torch.Tensor, in_place: bool) -> tuple[torch.Tensor, ...]:
    """The tensors whose addresses a call with destinations given must keep apart: x's and
    the tables with the destinations (without them when each is its x); none for new
    destinations; a cache step's two caches."""
    if outs[0] is None:
        return tuple(o for o in outs if o is not None)
    return (*xs, cos, sin) if in_place else (*xs, *outs, cos, sin)


def apart(plan: Plan, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` (``checked``'s) span addresses of which no two meet, each from its
    first element's address over ``plan.extents`` bytes: then no destination can share an
    element with another tensor of the call. Where two meet, the exact checks decide."""
    spans = sorted(zip(map(torch.Tensor.data_ptr, tensors), plan.extents, strict=True))
    last = 0
    for start, extent in spans:
        if start < last:
            return False
        last = start + extent
    return True


def in_place(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None]) -> bool:
    """Whether every destination is its x itself (an option of the signature: the launch
    then copies no pass-through channels, and only x's and the tables' addresses need to
    be apart)."""
    return all(map(operator.is_, xs, outs))
