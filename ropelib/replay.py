"""A call seen before, replayed: the eager GPU call's fast path.

An eager call on a GPU spends most of its time in Python: checking its arguments, choosing
the backend, planning the launch (about 70 us, around a 3 us kernel for a decode step).
All of that follows from what a call's key holds: its tensors' shapes, strides, dtypes and
devices, its options, ``ROPELIB_BACKEND``, inference mode and the current CUDA device. So
the first call with a key runs the whole path (``slow``) and notes the one launch it makes
(``noted``, told by ``ropelib.triton_rope``); a later call with that key replays the
launch with its own addresses: each new output allocated, each pointer its tensor's address
plus the byte offset the first call had there (a view such as positions reshaped), one
launch, the destinations' version counters bumped.

What depends on addresses is checked on every replay, and a call that differs there takes
the whole path: each pointer's 16-byte alignment (the compiled kernel is specialized on
it), whether each destination is its tensor (in place), and whether a destination's bytes
meet another tensor's (the whole path decides what an overlap means). A call is replayed
only where nobody could tell: plain tensors on a GPU, no autograd, compiler, tracer,
``torch.func`` transform, forward-mode AD, dispatch or function mode. A recipe holds
numbers, dtypes and the launcher, never a tensor; at most ``MAX_RECIPES`` are kept.
``ENABLED = False`` turns replays off (benchmarks compare the two paths).

The key's tensor part costs about 1.2 us of Python a tensor. So each kind of call (its
options, which tensors it has, which destinations are their x) also keeps its last
``KNOWN_PER_KIND`` recipes, each with a guard: PyTorch's own check of tensors against
those of the call that recorded it (``TensorGuards``, what ``torch.compile`` checks its
graphs' inputs with: type, dispatch keys, dtype, device, sizes, strides, requires_grad),
done in C++ (0.7-1.9 us for a decode call's 7 tensors on a 2-core VM, where the key took
8.5). A call that one of them passes, made in the same context (``_context``: grad mode
and the thread's dispatch-key exclusions included), takes that recipe without a key; a call
that passes none makes its key (and puts the recipe it finds back among its kind's last).
Guards are made and checked where the thread excludes what a plain one does, and inside an
operator's implementation (the autograd keys excluded) for calls that write none of their
tensors, such as a compiled graph's ``ropelib::rotate_qk`` (``_guards_see``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import torch
from torch.autograd import forward_ad

try:  # private; without it every call makes its key
    from torch._C._dynamo.guards import TensorGuards
except ImportError:
    TensorGuards = None

_ENVIRON = os.environ  # and its own dict and key (private): os.environ.get takes 0.3-0.7 us
try:
    _ENVIRON_DATA, _BACKEND_KEY = _ENVIRON._data, _ENVIRON.encodekey("ROPELIB_BACKEND")
except AttributeError:
    _ENVIRON_DATA, _BACKEND_KEY = _ENVIRON, "ROPELIB_BACKEND"

ENABLED = True
MAX_RECIPES = 1024
KNOWN_PER_KIND = 4
T = TypeVar("T")


class Recipe(NamedTuple):
    """A call's launch in terms of the call's tensors (slots: the call's tensors, then its
    new outputs): ``go(pointers)`` launches; ``sources`` gives each pointer as (slot, byte
    offset); ``new`` the outputs to allocate (shape, strides, dtype, device); ``aligned`` (slot,
    byte offset, whether it was 16-byte aligned) for each pointer into a call's tensor, None
    where every one was (then a replay checks all its pointers at once); ``same`` whether
    each (x, destination) pair of the call shared its address; ``extents`` each tensor's
    bytes from its first to past its last element; ``apart`` for each destination, the
    other tensors' slots whose bytes did not meet it (each pair once); ``gaps`` (destination,
    other tensor, destination's address minus the other's) for those whose bytes met, such
    as q and k rotated in place in one fused projection (what elements they share then
    follows from their strides and that distance, as it did in the recorded call);
    ``returns`` the slots of the result (``single``: one tensor, not a tuple)."""

    go: Callable[[Sequence[int]], None]
    sources: tuple[tuple[int, int], ...]
    new: tuple[tuple[torch.Size, tuple[int, ...], torch.dtype, torch.device], ...]
    aligned: tuple[tuple[int, int, bool], ...] | None
    same: tuple[bool, ...]
    extents: tuple[int, ...]
    apart: tuple[tuple[int, tuple[int, ...]], ...]
    gaps: tuple[tuple[int, int, int], ...]
    returns: tuple[int, ...]
    single: bool


class Known(NamedTuple):
    """A recipe, the guard the tensors of the call that recorded it pass (a
    ``TensorGuards``; None: made where guards do not see what the key holds, see
    ``_guards_see``) and its ``_context``."""

    guard: object | None
    context: tuple
    recipe: Recipe


_recipes: dict[tuple, Known | None] = {}  # None: such calls are not replayable
_known: dict[tuple, tuple[Known, ...]] = {}  # kind of call: its last guarded recipes
_local = threading.local()


def run(options: tuple | None, tensors: tuple[torch.Tensor | None, ...],
        pairs: tuple[tuple[int, int], ...], destinations: tuple[int, ...],
        slow: Callable[[], T], bump: bool = True) -> T:
    """``slow()``, or its replay where a call with this key was seen before (found by a
    guard of the kind's last recipes, or by the key). A call made while another is being
    recorded (on this thread) is neither replayed nor recorded: its launch belongs to the
    outer call's recipe.

    Args:
        options: the call's other arguments (hashable: str, int, bool, None or tuples of
            them) and what it is; None: a call never replayed.
        tensors: the call's tensors (None where absent), in a fixed order per kind of call.
        pairs: (x, destination) slots of ``tensors`` that may be one tensor (in place).
        destinations: the slots of ``tensors`` the call writes.
        slow: the whole path; it returns a tensor or a sequence of tensors.
        bump: whether a replay bumps the destinations' version counters (False where the
            caller bumps them after either path).
    """
    if not ENABLED or options is None or getattr(_local, "launches", None) is not None:
        return slow()
    first = tensors[0]
    if (type(first) is not torch.Tensor or not _on_gpu(first)
            or (first.requires_grad and torch.is_grad_enabled())  # a training step's x
            or _watched()):
        return slow()
    in_place = tuple([tensors[a] is tensors[b] for a, b in pairs])
    kind = (options, tuple([t is None for t in tensors]), in_place)
    context = _context(first)
    present = (_guarded(tensors, pairs, in_place) if _guards_see(context, tensors, destinations)
               else None)
    recipe = None if present is None else _found(kind, context, present)
    if recipe is None:
        key = _key(kind, tensors, context)
        known = None if key is None else _recipes.get(key, False)
        if known is False:
            return _record(key, kind, context, present, tensors, pairs, destinations, slow)
        if known is None:
            return slow()
        if present is not None:
            known = _found_by_key(key, kind, known, present, context)
        recipe = known.recipe
    result = _replay(recipe, tensors, pairs, destinations if bump else ())
    return slow() if result is None else result


def _record(key: tuple, kind: tuple, context: tuple, present: list[torch.Tensor] | None,
            tensors: tuple[torch.Tensor | None, ...], pairs: tuple[tuple[int, int], ...],
            destinations: tuple[int, ...], slow: Callable[[], T]) -> T:
    """``slow()``, its launches noted and made the key's recipe (None: not replayable),
    guarded by the ``present`` tensors (None: no guard)."""
    _local.launches = []
    try:
        result = slow()
    finally:
        launches, _local.launches = _local.launches, None
    if len(_recipes) >= MAX_RECIPES:
        clear()
    recipe = _recipe(launches, tensors, pairs, destinations, result)
    if recipe is None:
        _recipes[key] = None
        return result
    known = _recipes[key] = Known(None if present is None else _guard(present), context, recipe)
    if known.guard is not None:
        _keep(kind, known)
    return result


def _guarded(tensors: tuple[torch.Tensor | None, ...], pairs: tuple[tuple[int, int], ...],
             in_place: tuple[bool, ...]) -> list[torch.Tensor]:
    """The tensors a guard checks: those present, a destination that is its x (in place)
    once (``TensorGuards`` fails a tensor passed twice)."""
    if True not in in_place:
        return [t for t in tensors if t is not None]
    dropped = {b for (_, b), same in zip(pairs, in_place, strict=True) if same}
    return [t for slot, t in enumerate(tensors) if t is not None and slot not in dropped]


def _plain_exclusions() -> tuple:
    """The dispatch keys a thread excludes by default (autocast's, as it is off), outside
    and inside inference mode (where the autograd keys are excluded, as inside an operator's
    implementation): read on a new thread, whatever the importing one has on."""
    found = []

    def read() -> None:
        found.append(torch._C._dispatch_tls_local_exclude_set())
        with torch.inference_mode():
            found.append(torch._C._dispatch_tls_local_exclude_set())

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    return tuple(found)


_PLAIN_EXCLUSIONS = _plain_exclusions()


def _exclusions(inference: bool) -> int | None:
    """Which dispatch keys the thread excludes: 0 what a plain thread does in its inference
    mode, 1 the autograd keys besides outside inference mode (an operator's implementation
    called through the dispatcher), None anything else (autocast on, or the fallback of a
    lazily negated tensor, ``Negative`` excluded)."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    if excluded == _PLAIN_EXCLUSIONS[inference]:
        return 0
    return 1 if excluded == _PLAIN_EXCLUSIONS[True] else None


def _guards_see(context: tuple, tensors: tuple[torch.Tensor | None, ...],
                destinations: tuple[int, ...]) -> bool:
    """Whether a guard sees what the key holds for this call (``context[4]``: the thread's
    ``_exclusions``). A guard compares dispatch keys as the thread's exclusions leave them:
    where the autograd keys are excluded outside inference mode, an inference tensor passes
    for a plain one, which a call that writes none of its tensors cannot tell (they are only
    read, its outputs are made in the context's mode), while a destination made in inference
    mode is refused outside it (``kernels.check_out_memory``); where ``Negative`` is
    excluded, a negated view passes for a plain tensor. So guards are made and checked under
    a plain thread's exclusions, and under an operator implementation's for calls without
    destinations; everywhere else (autocast on included) calls make their keys."""
    if TensorGuards is None or context[4] is None:
        return False
    return context[4] == 0 or all(tensors[d] is None for d in destinations)


def _found(kind: tuple, context: tuple, present: list[torch.Tensor]) -> Recipe | None:
    """The recipe of the first of the kind's last ones made in this context whose guard
    these tensors pass; None where none does."""
    try:
        for known in _known.get(kind, ()):
            if known.context == context and known.guard.check(*present):
                return known.recipe
    except Exception:  # another torch's private guard: keys from now on
        _no_guards()
    return None


def _guard(present: list[torch.Tensor]) -> object | None:
    """A ``TensorGuards`` of these tensors; None where this torch's cannot be made (then
    guards are turned off)."""
    try:
        return TensorGuards(*present, dynamic_dims_sizes=[list(t.size()) for t in present],
                            dynamic_dims_strides=[list(t.stride()) for t in present])
    except Exception:  # another torch's private signature: keys from now on
        _no_guards()
        return None


def _found_by_key(key: tuple, kind: tuple, known: Known, present: list[torch.Tensor],
                  context: tuple) -> Known:
    """A recipe its key found where guards see: guarded by these tensors, in this context,
    where it was recorded where guards see nothing (such as under autocast) or under other
    exclusions, and put back among its kind's last (newer ones may have pushed it out)."""
    if known.guard is None or known.context != context:
        known = _recipes[key] = Known(_guard(present), context, known.recipe)
    if known.guard is not None:
        _keep(kind, known)
    return known


def _keep(kind: tuple, known: Known) -> None:
    """Puts a guarded recipe first among the kind's last ``KNOWN_PER_KIND`` (a kind called
    with several shapes in turn, such as a query and a key with other head counts, keeps
    one for each), unless it is among them."""
    kept = _known.get(kind, ())
    if all(other is not known for other in kept):
        _known[kind] = (known, *kept[:KNOWN_PER_KIND - 1])


def _no_guards() -> None:
    """Turns guards off (one could not be made or checked): every call makes its key."""
    global TensorGuards
    TensorGuards = None
    _known.clear()


def noted(kernel_tensors: tuple[torch.Tensor, ...],
          go: Callable[[Sequence[int]], None] | None) -> None:
    """Told by the Triton backend after each launch: its pointer arguments and ``go``, the
    prepared launch of those pointers (None: a launch that cannot be replayed, such as the
    interpreter's). Kept only while ``run`` records a call, on this thread."""
    launches = getattr(_local, "launches", None)
    if launches is not None:
        launches.append((kernel_tensors, go))


def clear() -> None:
    """Forget every recipe (after the kernel or its launchers were swapped)."""
    _recipes.clear()
    _known.clear()


def _key(kind: tuple, tensors: tuple[torch.Tensor | None, ...], context: tuple
         ) -> tuple | None:
    """The call's key (its kind, its tensors' metadata, its device and context: a call in
    place and one into another tensor have their own recipes), or None where it must take
    the whole path: a tensor on another device than the first (a 0-d offset or a cache
    slot on the host is read there, and its value moves the launch), a tensor that is not
    a plain ``torch.Tensor`` (a subclass, or a ``torch.func`` wrapper kept from a finished
    transform) or that records autograd. (A first tensor off the GPU and anybody watching:
    ``run`` turned those away.)"""
    grad = context[0]
    device = tensors[0].device
    metas = []
    for t in tensors:
        if t is None:
            metas.append(None)
        elif (type(t) is not torch.Tensor or t.device != device
              or (grad and t.requires_grad)
              or torch._C._functorch.is_functorch_wrapped_tensor(t)):
            return None
        else:
            metas.append((t.size(), t.stride(), t.dtype, t.is_neg(), t.is_inference()))
    return (*kind, *metas, device, *context[:4])  # the exclusions hide nothing from a key


def _watched() -> bool:
    """Whether anybody watches the call: compiler, tracer, ``torch.func`` transform,
    forward-mode AD, dispatch or function mode."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._are_functorch_transforms_active()
            or forward_ad._current_level >= 0 or bool(torch._C._len_torch_dispatch_stack())
            or torch._C._is_torch_function_mode_enabled())


def _context(first: torch.Tensor) -> tuple:
    """What a replay depends on besides the call: grad mode, ``ROPELIB_BACKEND`` (as
    ``os.environ`` holds it), inference mode, the current CUDA device and the thread's
    ``_exclusions``."""
    inference = torch.is_inference_mode_enabled()
    backend = (_ENVIRON_DATA.get(_BACKEND_KEY) if os.environ is _ENVIRON  # not replaced
               else os.environ.get("ROPELIB_BACKEND"))
    return (torch.is_grad_enabled(), backend, inference, _current_device(first),
            _exclusions(inference))


def _on_gpu(x: torch.Tensor) -> bool:
    """Whether x's calls are replayed: CUDA tensors (the tests stub the launch and let CPU
    tensors through here)."""
    return x.is_cuda


def _current_device(x: torch.Tensor) -> int:
    """The current CUDA device (what Triton launches on), -1 for tensors off CUDA."""
    return torch.cuda.current_device() if x.is_cuda else -1


def _replay(recipe: Recipe, tensors: tuple[torch.Tensor | None, ...],
            pairs: tuple[tuple[int, int], ...], bumped: tuple[int, ...]) -> T | None:
    """The recorded launch with these tensors' addresses, the version counters of the
    ``bumped`` slots bumped; None (nothing done) where an address differs from the
    recorded call in alignment, in-place pairs, overlaps or the distance of overlapping
    tensors."""
    addresses = _addresses(tensors)
    for (a, b), same in zip(pairs, recipe.same, strict=True):
        if (addresses[a] == addresses[b]) != same:
            return None
    for slot, offset, aligned in recipe.aligned or ():
        if ((addresses[slot] + offset) % 16 == 0) != aligned:
            return None
    extents = recipe.extents
    for d, others in recipe.apart:
        start = addresses[d]
        end = start + extents[d]
        for other in others:
            if addresses[other] < end and start < addresses[other] + extents[other]:
                return None
    for d, other, gap in recipe.gaps:
        if addresses[d] - addresses[other] != gap:
            return None
    made = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
            for shape, strides, dtype, device in recipe.new]
    for t in made:
        addresses.append(t.data_ptr())
    pointers = [addresses[slot] + offset for slot, offset in recipe.sources]
    if recipe.aligned is None and math.gcd(*pointers) % 16:  # a pointer is not aligned
        return None  # (never a new output's: an allocation is)
    recipe.go(pointers)
    written = [tensors[d] for d in bumped if tensors[d] is not None]
    if written:
        torch.autograd.graph.increment_version(written)
    everything = (*tensors, *made)
    if recipe.single:
        return everything[recipe.returns[0]]
    return tuple([everything[slot] for slot in recipe.returns])


def _addresses(tensors: tuple[torch.Tensor | None, ...]) -> list[int]:
    """Each tensor's address, 0 for an absent one."""
    return [0 if t is None else t.data_ptr() for t in tensors]


def _recipe(launches: list, tensors: tuple[torch.Tensor | None, ...],
            pairs: tuple[tuple[int, int], ...], destinations: tuple[int, ...],
            result: object) -> Recipe | None:
    """The recipe of a call that made exactly one replayable launch whose every pointer is
    one of the call's tensors, a view of exactly one of them, or one of its new outputs;
    None otherwise (such calls keep taking the whole path)."""
    if len(launches) != 1 or launches[0][1] is None:
        return None
    kernel_tensors, go = launches[0]
    single = isinstance(result, torch.Tensor)
    results = (result,) if single else tuple(result)
    made = [r for r in results if not any(r is t for t in tensors)]
    every = (*tensors, *made)
    sources = []
    for t in kernel_tensors:
        slot = _slot(t, tensors, made, pairs)
        if slot is None:
            return None
        sources.append((slot, t.data_ptr() - every[slot].data_ptr()))
    written = (*destinations, *range(len(tensors), len(every)))  # a result is one of these
    returns = tuple(next(i for i in (*written, *range(len(every))) if every[i] is r)
                    for r in results)
    addresses = _addresses(tensors)
    same = tuple(addresses[a] == addresses[b] for a, b in pairs)
    extents = tuple(0 if t is None else extent(t) for t in tensors)
    in_place = {pair for pair, equal in zip(pairs, same, strict=True) if equal}
    checked = [(d, other) for d in destinations if tensors[d] is not None
               for other, t in enumerate(tensors)
               if t is not None and other != d and (other, d) not in in_place
               and extents[d] and extents[other]]
    met = {(d, other) for d, other in checked
           if addresses[other] < addresses[d] + extents[d]
           and addresses[d] < addresses[other] + extents[other]}
    unmet = [(d, other) for d, other in checked if (d, other) not in met
             and not (other < d and (other, d) in checked)]  # two destinations: once
    apart = tuple((d, others) for d in destinations
                  if (others := tuple(other for d_, other in unmet if d_ == d)))
    gaps = tuple((d, other, addresses[d] - addresses[other]) for d, other in checked
                 if (d, other) in met)
    aligned = {(slot, offset, (addresses[slot] + offset) % 16 == 0)
               for slot, offset in sources if slot < len(tensors)}
    return Recipe(go, tuple(sources),
                  tuple((t.shape, t.stride(), t.dtype, t.device) for t in made),
                  None if all(a for *_, a in aligned) else tuple(sorted(aligned)), same,
                  extents, apart, gaps, returns, single)


def _slot(t: torch.Tensor, tensors: tuple[torch.Tensor | None, ...],
          made: list[torch.Tensor], pairs: tuple[tuple[int, int], ...]) -> int | None:
    """Where a kernel's pointer comes from: the call's tensor it is (where it is several,
    only an (x, destination) pair that is one tensor), the one tensor it is a view of, or
    the new output it is; None where it is none of these or ambiguous."""
    same = [slot for slot, u in enumerate(tensors) if u is t]
    if len(same) == 1 or (len(same) == 2 and tuple(same) in pairs):
        return same[0]
    if same:
        return None
    for j, u in enumerate(made):
        if u is t:
            return len(tensors) + j
    storage = t.untyped_storage().data_ptr()
    views = [slot for slot, u in enumerate(tensors)
             if u is not None and u.untyped_storage().data_ptr() == storage]
    return views[0] if len(views) == 1 else None


def extent(t: torch.Tensor) -> int:
    """The bytes from t's first element to past its last (0 for an empty tensor)."""
    if not t.numel():
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * (
        t.element_size())
