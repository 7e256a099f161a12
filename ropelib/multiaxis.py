"""Multi-axis RoPE: positions with k coordinates (time, row, column), one frequency matrix.

A token at coordinates p = (p_1 .. p_k) turns pair i by the angle

    angle_i(p) = sum_a p_a * W[i, a],      W of shape (d/2, k).

The angle is linear in p, so R(p)^T R(p') = R(p' - p) and the score
<R(p) q, R(p') k> = q^T R(p' - p) k depends on the offset vector p' - p only, as in 1D, which
is the case k = 1, W[:, 0] = theta. The designs in use differ only in W:

- M-RoPE (Qwen2-VL, Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's
  Perception of the World at Any Resolution"): one spectrum theta_i = base^(-2i/d) over the
  whole head, its pairs split into consecutive chunks per axis (t, h, w), ``mrope_section``
  [16, 24, 24]: ``axis_frequencies(128, [16, 24, 24])``.
- Interleaved M-RoPE (Qwen3-VL): the same spectrum dealt out to the axes in turn, so that
  every axis has fast and slow pairs: ``order="interleaved"``, sections [24, 20, 20].
- Axial 2D RoPE (ViT towers: Qwen2-VL's vision encoder, Pixtral; Hugging Face's
  ``rope_type: "axial"``): each axis a 1D RoPE of its own over its section,
  ``spectrum="per_axis"``.
- RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer"): every
  entry of W learned, so that a pair may turn along any direction of the plane (``RoPEMixed``).

Text tokens of a vision-language model sit on the diagonal p = (m, m, m), where the angle is
m * sum_a W[i, a]: with one axis per pair (M-RoPE) that is m * theta_i, 1D RoPE exactly.
``mrope_positions`` builds the (t, h, w) positions of a sequence mixing text, images and
videos as Qwen2-VL does.

The tables are ``(cos, sin)`` rows per token, ``(..., seq, d/2)``, for ``apply_rope`` (its
gathered-table form, e.g. ``cos[:, None]`` over heads; the Qwen models use
``layout="half"``). Angles are computed in float64, as everywhere in ropelib.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from . import eager
from ._checks import (
    as_int,
    check_base,
    check_count,
    check_even_positive,
    check_index_tensor,
    check_table_pair,
    watcher,
)
from .scaling import default_frequencies

SPECTRA = ("shared", "per_axis")
ORDERS = ("chunked", "interleaved")
_TABLE_DTYPES = (torch.float32, torch.float64)

__all__ = ["ORDERS", "SPECTRA", "RoPEMixed", "axis_frequencies", "axis_of_pairs", "axis_tables",
           "mrope_positions"]


def _check_sections(head_dim: int, sections: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """head_dim and sections as ints (NumPy and 0-d tensor integers accepted), checked."""
    head_dim = check_even_positive("head_dim", head_dim)
    if isinstance(sections, (torch.Tensor, np.ndarray)) and sections.ndim == 1:
        sections = sections.tolist()
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence):
        raise TypeError(f"sections must be a sequence of ints (pairs per axis), e.g. [16, 24, 24], "
                        f"got {type(sections).__name__}")
    values = tuple(as_int(s) for s in sections)
    if not values or any(s is None or s < 1 for s in values):
        raise ValueError(f"sections must be a non-empty list of positive ints (pairs per axis), "
                         f"got {list(sections)}")
    if sum(values) != head_dim // 2:
        raise ValueError(f"sections must sum to head_dim // 2 = {head_dim // 2} (every pair "
                         f"belongs to one axis), got {list(values)} (sum {sum(values)})")
    return head_dim, values


def axis_of_pairs(head_dim: int, sections: Sequence[int], order: str = "chunked") -> torch.Tensor:
    """The axis each pair belongs to, int64 ``(head_dim // 2,)`` on the CPU (whatever the
    default device: also under ``torch.device("meta")``).

    ``"chunked"`` (Qwen2-VL): the first ``sections[0]`` pairs go to axis 0, the next
    ``sections[1]`` to axis 1, and so on. ``"interleaved"`` (Qwen3-VL): with k axes, axis
    a >= 1 takes pairs a, a + k, a + 2k, ... below k * sections[a], and axis 0 the rest.
    """
    head_dim, sections = _check_sections(head_dim, sections)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    half, k = head_dim // 2, len(sections)
    if order == "chunked":
        return torch.cat([torch.full((s,), a, dtype=torch.int64, device="cpu")
                          for a, s in enumerate(sections)])
    axes = torch.zeros(half, dtype=torch.int64, device="cpu")
    for a in range(1, k):
        last = a + k * (sections[a] - 1)
        if last >= half:
            raise ValueError(f"sections {list(sections)} do not interleave over {half} pairs: "
                             f"axis {a} needs pairs {a}, {a + k}, ..., {last}; expected "
                             f"sections[{a}] <= {(half - 1 - a) // k + 1}")
        axes[a:last + 1:k] = a
    return axes


def axis_frequencies(head_dim: int, sections: Sequence[int], *, base: float = 10000.0,
                     spectrum: str = "shared", order: str = "chunked") -> torch.Tensor:
    """The frequency matrix W, float64 ``(head_dim // 2, len(sections))``, one axis per pair.

    Args:
        head_dim: rotary dimension d (even).
        sections: pairs per axis, summing to d / 2, e.g. Qwen2-VL's ``mrope_section``
            [16, 24, 24] (t, h, w) for d = 128.
        base: RoPE base.
        spectrum: ``"shared"``: pair i has theta_i = base^(-2i/d), the 1D spectrum of the whole
            head, and turns with its axis only (M-RoPE). ``"per_axis"``: each axis is a 1D RoPE
            over its own s = sections[a] pairs, frequencies base^(-j/s), j < s, in pair order
            (axial RoPE of ViT towers; Hugging Face's ``"axial"``).
        order: which pairs each axis gets, ``"chunked"`` or ``"interleaved"``
            (see ``axis_of_pairs``).

    Returns:
        W with ``W[i, axis_of_pairs(...)[i]]`` the frequency of pair i and zeros elsewhere, on
        the CPU whatever the default device: a configuration's numbers, which a module built
        under ``torch.device("meta")`` keeps (as ``RotaryEmbedding`` keeps its base).
    """
    check_base(base)
    if spectrum not in SPECTRA:
        raise ValueError(f"spectrum must be one of {SPECTRA}, got {spectrum!r}")
    axes = axis_of_pairs(head_dim, sections, order)
    head_dim, sections = _check_sections(head_dim, sections)
    half = head_dim // 2
    with torch.device("cpu"):
        if spectrum == "shared":
            inv_freq = default_frequencies(head_dim, base)
        else:
            inv_freq = torch.empty(half, dtype=torch.float64)
            for a, s in enumerate(sections):
                inv_freq[axes == a] = default_frequencies(2 * s, base)
        W = torch.zeros(half, len(sections), dtype=torch.float64)
        W[torch.arange(half), axes] = inv_freq
    return W


def check_frequencies(frequencies: object, head_dim: int | None = None) -> torch.Tensor:
    """``frequencies`` as a float64 CPU copy, after checking it is a finite ``(d/2, k)`` matrix
    (``d = head_dim`` when given)."""
    if not isinstance(frequencies, torch.Tensor):
        raise TypeError(f"frequencies must be a torch.Tensor of shape (head_dim // 2, k), got "
                        f"{type(frequencies).__name__}")
    if not frequencies.is_floating_point():
        raise TypeError(f"frequencies must be floating point, got dtype {frequencies.dtype}")
    expected = "(head_dim // 2, k)" if head_dim is None else f"({head_dim // 2}, k)"
    if frequencies.ndim != 2 or frequencies.shape[1] < 1 or (
            head_dim is not None and frequencies.shape[0] != head_dim // 2):
        raise ValueError(f"frequencies must have shape {expected} (pairs, axes), got "
                         f"{tuple(frequencies.shape)}")
    W = frequencies.detach().to(device="cpu", dtype=torch.float64, copy=True)
    if not torch.isfinite(W).all():
        raise ValueError("frequencies must be finite, got a NaN or infinite entry")
    return W


def check_axis_positions(positions: object, num_axes: int, *, integer: bool = False
                         ) -> torch.Tensor:
    """Checks ``positions`` is a real ``(..., seq, num_axes)`` tensor (integer if asked)."""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be a torch.Tensor of shape (..., seq, {num_axes}), got "
                        f"{type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex() or (
            integer and positions.is_floating_point()):
        kind = "integer" if integer else "integer or floating-point"
        raise TypeError(f"positions must hold {kind} coordinates, got dtype {positions.dtype}")
    if positions.ndim < 2 or positions.shape[-1] != num_axes:
        seen = f" (k = {positions.shape[-1]})" if positions.ndim >= 2 else ""
        raise ValueError(f"positions must have shape (..., seq, k) with k = {num_axes} axes (the "
                         f"columns of frequencies), got {tuple(positions.shape)}{seen}"
                         f"{hf_positions_hint(num_axes)}")
    return positions


def hf_positions_hint(num_axes: int) -> str:
    """How to pass transformers' M-RoPE position ids, for an error message (k = 3 only)."""
    if num_axes != 3:
        return ""
    return ("; transformers' Qwen2-VL / Qwen3-VL position_ids are (3, batch, seq) rows (t, h, "
            "w), or (4, batch, seq) with the text positions (used for the mask, not rotated) "
            "in row 0: pass position_ids[-3:].permute(1, 2, 0), the last three rows as "
            "(batch, seq, 3)")


def axis_tables(positions: torch.Tensor, frequencies: torch.Tensor, *,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles ``positions @ frequencies.T``, computed in float64.

    Args:
        positions: ``(..., seq, k)`` coordinates per token, integer or float (e.g. the
            ``(seq, 3)`` (t, h, w) of ``mrope_positions``, or (row, column) of image patches).
        frequencies: W ``(d/2, k)``, e.g. from ``axis_frequencies``. Gradients reach W when it
            requires grad (the tables are then differentiable functions of it).
        dtype: float32 (default) or float64.

    Returns:
        ``(cos, sin)``, each ``(..., seq, d/2)``, on the device of ``positions``: rows ready for
        ``apply_rope`` (``cos[:, None]`` to broadcast over heads of a ``(B, H, seq, d)`` x).
    """
    if not isinstance(frequencies, torch.Tensor) or frequencies.ndim != 2:
        seen = tuple(frequencies.shape) if isinstance(frequencies, torch.Tensor) else frequencies
        raise ValueError(f"frequencies must be a (head_dim // 2, k) tensor, got {seen}")
    check_axis_positions(positions, frequencies.shape[1])
    if dtype not in _TABLE_DTYPES:
        raise ValueError(f"dtype must be one of {_TABLE_DTYPES} (angles need the precision), "
                         f"got {dtype}")
    kind = positions.device.type  # the meta device has no autocast to turn off (a test of
    # the type, not torch.amp.is_autocast_available, which torch 2.11's compiler cannot trace)
    with torch.autocast(kind, enabled=False) if kind != "meta" else contextlib.nullcontext():
        W = frequencies.to(device=positions.device, dtype=torch.float64)
        angles = positions.to(torch.float64) @ W.T
        return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def axis_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              pair_axes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of M-RoPE-like frequencies (every pair follows one axis) read from 1D tables:
    pair i of a token at coordinates p takes column i of the table row ``p[pair_axes[i]]``,
    since its angle is that coordinate times theta_i.

    Args:
        cos, sin: ``(table_len, pairs)`` tables of the diagonal (row m: angles m * theta_i),
            of one shape, dtype and device (a ValueError otherwise).
        positions: ``(..., seq, k)`` integer coordinates in ``[0, table_len)``, on the
            tables' device.
        pair_axes: ``(pairs,)`` integer, the axis of each pair (``axis_of_pairs``), in
            ``[0, k)``.

    Returns:
        ``(cos, sin)`` rows, each ``(..., seq, pairs)``, gathered by PyTorch operations (which
        compilers and tracers record as they are). A coordinate or axis out of range is a
        ValueError naming both ranges in an eager CPU call; elsewhere torch's index error (a
        coordinate) or a failed assertion (an axis).
    """
    check_table_pair(cos, sin)
    if cos.ndim != 2:
        raise ValueError(f"cos/sin must be 2-D tables (table_len, pairs), got "
                         f"{tuple(cos.shape)}")
    check_index_tensor("positions", positions, cos.device)
    check_index_tensor("pair_axes", pair_axes, cos.device)
    if positions.ndim < 2 or positions.shape[-1] < 1:
        raise ValueError(f"positions must have shape (..., seq, k), got "
                         f"{tuple(positions.shape)}")
    if tuple(pair_axes.shape) != (cos.shape[1],):
        raise ValueError(f"pair_axes must have shape ({cos.shape[1]},) (one axis per column "
                         f"of the tables), got {tuple(pair_axes.shape)}")
    positions, pair_axes = positions.long(), pair_axes.long()
    (table_len, pairs), k = cos.shape, positions.shape[-1]
    if cos.is_cpu and pairs and watcher(cos, sin, positions) is None:
        axis_low, axis_high = (int(v) for v in torch.aminmax(pair_axes))
        low, high = (int(v) for v in torch.aminmax(positions)) if positions.numel() else (0, -1)
        if low < 0 or high >= table_len or axis_low < 0 or axis_high >= k:
            raise ValueError(f"positions must be in [0, {table_len}) (the table's rows) and "
                             f"pair_axes in [0, {k}) (the axes), got positions in [{low}, "
                             f"{high}] and pair_axes in [{axis_low}, {axis_high}]")
    else:  # a position out of range: torch's index error in index_select
        torch._assert_async(((pair_axes >= 0) & (pair_axes < k)).all(),
                            f"pair_axes must be in [0, {k}) (the axes of positions)")
    return (eager.table_rows(cos, positions, pair_axes),
            eager.table_rows(sin, positions, pair_axes))


class RoPEMixed(nn.Module):
    """RoPE-Mixed (Heo et al. 2024): 2D RoPE with learnable frequencies, one W per head.

    Pair i of head h turns by ``y * W[h, i, 0] + x * W[h, i, 1]`` at patch (row y, column x):
    along a direction of the plane it learns, where axial RoPE fixes the directions to the
    two axes. The score stays a function of the offset (dy, dx) for every W: the rotations
    of the two axes are all 2 x 2 blocks of the same pairs, so they commute.

    Initialization as in the paper: the magnitudes of a per-axis spectrum over d/4 pairs,
    base^(-j / (d/4)) (base 10 for RoPE-Mixed there), the first half of the pairs along a
    random direction phi per head and the second half along phi + pi/2. With
    ``rotate=False`` (phi = 0) it starts as axial 2D RoPE,
    ``axis_frequencies(d, [d/4, d/4], base=base, spectrum="per_axis")``.

    Args:
        head_dim: d, a multiple of 4.
        num_heads: heads, each with its own W.
        base: magnitude base of the initialization.
        rotate: random direction per head (True) or axis-aligned (False).
        generator: random generator for the directions (reproducible init).

    Parameter ``frequencies`` ``(num_heads, head_dim // 2, 2)`` (axes (y, x)).
    ``forward(positions)`` maps ``(seq, 2)`` or ``(batch, seq, 2)`` coordinates to
    ``(cos, sin)``, each ``(batch or 1, num_heads, seq, head_dim // 2)`` in the parameter's
    dtype (angles in float64), differentiable in W and ready for ``apply_rope`` on
    ``(batch, num_heads, seq, head_dim)``.
    """

    def __init__(self, head_dim: int, num_heads: int = 1, *, base: float = 10.0,
                 rotate: bool = True, generator: torch.Generator | None = None) -> None:
        super().__init__()
        head_dim = check_even_positive("head_dim", head_dim)
        if head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4 (two axes of d/4 pairs), got "
                             f"{head_dim}")
        num_heads = check_count("num_heads", num_heads)
        check_base(base)
        self.head_dim, self.num_heads, self.base, self.rotate = head_dim, num_heads, base, rotate
        self.frequencies = nn.Parameter(torch.empty(num_heads, head_dim // 2, 2))
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The paper's initialization of W (a new random direction per head with ``rotate``),
        computed on the CPU and copied into the parameter (nothing is computed on the meta
        device: build there, then ``to_empty()`` and this, or ``load_state_dict``)."""
        quarter = self.head_dim // 4
        with torch.device("cpu"):
            axial = axis_frequencies(self.head_dim, [quarter, quarter], base=self.base,
                                     spectrum="per_axis")
            phi = (torch.rand(self.num_heads, 1, generator=generator, dtype=torch.float64)
                   * 2 * math.pi if self.rotate
                   else torch.zeros(self.num_heads, 1, dtype=torch.float64))
            # each head's axial directions turned by its phi (measured from axis 0, y; the
            # paper measures from x, which only relabels uniformly random directions)
            c, s = torch.cos(phi), torch.sin(phi)
            W = torch.stack([axial[:, 0] * c - axial[:, 1] * s,
                             axial[:, 0] * s + axial[:, 1] * c], -1)
        with torch.no_grad():
            self.frequencies.copy_(W)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_axis_positions(positions, 2)
        if positions.ndim not in (2, 3):
            raise ValueError(f"positions must have shape (seq, 2) or (batch, seq, 2), got "
                             f"{tuple(positions.shape)}")
        batched = positions if positions.ndim == 3 else positions[None]
        W = self.frequencies
        with torch.autocast(batched.device.type, enabled=False):
            angles = batched[:, None].to(torch.float64) @ W.to(torch.float64).transpose(-1, -2)
            return torch.cos(angles).to(W.dtype), torch.sin(angles).to(W.dtype)


def _grid(grid: object, merge: int) -> tuple[int, int, int]:
    """A (t, h, w) grid as ints: a tuple or list of ints, or a row of ``image_grid_thw``."""
    values = (grid.tolist() if isinstance(grid, (torch.Tensor, np.ndarray)) and grid.ndim == 1
              else grid)
    sizes = [as_int(n) for n in values] if isinstance(values, (tuple, list)) else []
    if len(sizes) != 3 or any(n is None or n < 1 for n in sizes):
        raise ValueError(f"a vision segment must be a (t, h, w) tuple of positive ints, got "
                         f"{grid!r}")
    t, h, w = sizes
    if h % merge or w % merge:
        raise ValueError(f"grid (t, h, w) = {(t, h, w)}: h and w must be multiples of "
                         f"spatial_merge_size={merge}")
    return t, h // merge, w // merge


def mrope_positions(segments: Sequence[int | tuple[int, int, int]], *,
                    spatial_merge_size: int = 1) -> torch.Tensor:
    """The (t, h, w) positions of a sequence mixing text, images and videos, as Qwen2-VL.

    Text advances t, h and w together (the diagonal: 1D RoPE). A vision grid of T x H x W
    tokens (after the spatial merge) starting where the text stopped, at s, takes positions
    (s + t, s + h, s + w) in (t, h, w) raster order, the order of its tokens. The text after
    it continues from the grid's largest position + 1.

    Args:
        segments: in sequence order, an int n (n text tokens; a NumPy or 0-d tensor integer
            too) or a ``(t, h, w)`` patch grid of an image (t = 1) or a video, as in Hugging
            Face's ``image_grid_thw`` / ``video_grid_thw`` (before the merge; a tuple, a list
            or one row of those tensors).
        spatial_merge_size: the vision tower merges ``m x m`` patches into one token
            (Qwen2-VL: 2), so a grid brings t * (h / m) * (w / m) tokens.

    Returns:
        int64 ``(seq, 3)``.

    This is the rule of Qwen2-VL's reference code (and transformers 4.x), "largest position +
    1". transformers 5.x advances by max(H, W) after a grid instead; the two agree unless a
    video has more frames T than H and W.
    """
    spatial_merge_size = check_count("spatial_merge_size", spatial_merge_size)
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence):
        raise TypeError(f"segments must be a sequence of text lengths and (t, h, w) grids, got "
                        f"{type(segments).__name__}")
    parts, start = [torch.zeros(0, 3, dtype=torch.int64)], 0
    for segment in segments:
        length = as_int(segment)
        if length is not None:
            segment = length
            if segment < 0:
                raise ValueError(f"a text segment must be a length >= 0, got {segment}")
            parts.append((start + torch.arange(segment))[:, None].expand(-1, 3))
            start += segment
            continue
        t, h, w = _grid(segment, spatial_merge_size)
        coords = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w),
                                            indexing="ij"), -1).reshape(-1, 3)
        parts.append(start + coords)
        start += max(t, h, w)
    return torch.cat(parts)
