"""cos/sin tables: the angles m * theta_i for every position m and pair i.

Angles are computed in float64 with autocast off, whatever dtype the model runs in, and the
tables are returned in float32 (or float64 on request); ``apply_rope`` casts them to the
input's dtype only when it applies them. Low-precision angle arithmetic is a real bug:
bfloat16 holds integers exactly only up to 256, so a position stored in bfloat16 is wrong
from 257 on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from ._checks import (
    check_count,
    check_even_positive,
    check_int_tensor,
    traced_nonnegative,
    tracing,
)
from .multiaxis import (
    axis_of_pairs,
    axis_rows,
    axis_tables,
    check_axis_positions,
    check_frequencies,
)
from .scaling import (
    FrequencySchedule,
    axis_sections,
    depends_on_length,
    layer_parameters,
    rope_base,
    rope_type,
    scaled_frequencies,
)

_TABLE_DTYPES = (torch.float32, torch.float64)
# Held only to compare and swap a module's published cache (never while tables are computed).
_PUBLISH = threading.Lock()


def rope_frequencies(
    dim: int, base: float | None = None, *, scaling: Mapping | None = None,
    seq_len: int | None = None, device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32, max_position_embeddings: int | None = None,
) -> torch.Tensor:
    """inv_freq theta_i = base^(-2i/dim), shape ``(dim // 2,)``, rescaled by ``scaling``.

    ``base`` defaults to the config's ``rope_theta``, else 10000. With a
    ``partial_rotary_factor`` in ``scaling`` the shape is ``(rotated_dim(dim, scaling) // 2,)``
    (see ``ropelib.scaling``). ``seq_len`` is the current length, used by ``"dynamic"`` and
    ``"longrope"``; ``max_position_embeddings`` only by a ``"longrope"`` config without
    ``factor`` and a ``"dynamic"`` one without ``original_max_position_embeddings``.
    """
    inv_freq, _ = scaled_frequencies(dim, base, scaling, seq_len=seq_len,
                                     max_position_embeddings=max_position_embeddings)
    return inv_freq.to(device=device, dtype=dtype)


def _angles_to_tables(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float,
                      device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles m * theta_i, computed in float64 where the positions are
    (on a GPU too: a few float64 operations per row, so the rows of any position equal the
    CPU's float64 tables rounded to ``dtype``), in ``dtype`` on ``device``."""
    with torch.autocast("cpu", enabled=False):
        angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq
        cos, sin = torch.cos(angles), torch.sin(angles)
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def generate_rope_embeddings(
    seq_len: int, head_dim: int, base: float | None = None,
    device: torch.device | str | None = None, *, positions: torch.Tensor | None = None,
    scaling: Mapping | None = None, dtype: torch.dtype = torch.float32,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for positions 0 .. seq_len - 1 (or the given ``positions``).

    ``cos[m, i] = cos(m * theta_i)`` and ``sin[m, i] = sin(m * theta_i)`` with
    theta_i = base^(-2i/head_dim). Pass the rotary dimension as ``head_dim`` for a partial
    rotation, or the head dimension and a ``partial_rotary_factor`` in ``scaling``.

    Args:
        seq_len: number of positions.
        head_dim: per-head dimension d (even).
        base: RoPE base; default the config's ``rope_theta``, else 10000.
        device: where the tables go (computed in float64 on the CPU first).
        positions: optional ``(seq_len,)`` positions (integer or float) instead of
            ``0 .. seq_len - 1``.
        scaling: optional rope config of one layer type (see ``ropelib.scaling``); the
            attention factor of YaRN and LongRoPE multiplies both tables. The current length
            (``seq_len``, or the largest position + 1) picks dynamic NTK's frequencies and
            LongRoPE's short or long factors.
        dtype: float32 (default) or float64.
        max_position_embeddings: only for a ``"longrope"`` config without ``factor`` and a
            ``"dynamic"`` one without ``original_max_position_embeddings`` (as transformers).

    Returns:
        ``(cos, sin)``, each ``(seq_len, rotated_dim // 2)``: ``head_dim // 2`` columns
        unless ``scaling`` has a ``partial_rotary_factor`` (``ropelib.scaling.rotated_dim``).
    """
    seq_len = check_count("seq_len", seq_len, zero=True)
    head_dim = check_even_positive("head_dim", head_dim)
    if dtype not in _TABLE_DTYPES:
        raise ValueError(f"dtype must be one of {_TABLE_DTYPES} (angles need the precision), "
                         f"got {dtype}")
    if positions is None:
        positions = torch.arange(seq_len, dtype=torch.float64)
        current_len = seq_len
    else:
        if not isinstance(positions, torch.Tensor) or positions.shape != (seq_len,):
            seen = tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions
            raise ValueError(f"positions must be a tensor of shape (seq_len,) = ({seq_len},), "
                             f"got {seen}")
        positions = positions.detach().cpu()
        if not positions.is_floating_point():  # int64: min/max exist for every integer dtype
            positions = check_int_tensor("positions", positions)
        # the length dynamic scaling sees: positions up to the largest one (none if all < 0)
        current_len = max(int(positions.max().item()) + 1, 0) if seq_len else 0
    inv_freq, factor = scaled_frequencies(head_dim, base, scaling, seq_len=current_len,
                                          max_position_embeddings=max_position_embeddings)
    return _angles_to_tables(positions, inv_freq, factor, device, dtype)


class _Cache(NamedTuple):
    """A module's cos/sin cache, published as one unit: a reader takes all of it at once."""

    cos: torch.Tensor
    sin: torch.Tensor
    scaled_for: int | None  # the length the frequencies are for (None: the unscaled ones)


class RotaryEmbedding(nn.Module):
    """Holds theta_i and a cos/sin cache that grows on demand.

    The cache covers positions ``0 .. cached_len - 1``. A request beyond it regrows the cache
    (to at least twice its length), a shorter request reuses it; it is never recomputed per
    call. When the frequencies depend on the length (``ropelib.scaling.depends_on_length``)
    the cache follows Hugging Face: with ``{"rope_type": "dynamic"}`` it is rebuilt for every
    new maximum length above the trained one and reset to the original frequencies when a
    sequence no longer than the trained length comes (dynamic NTK); with
    ``{"rope_type": "longrope"}`` it is rebuilt with the long factors when a request exceeds
    the trained length ``original_max_position_embeddings`` and with the short ones when a
    request no longer than it comes (the switch of Phi-3).

    Under ``torch.compile``, ``torch.export`` and ``torch.jit.trace`` the cache is neither
    read nor grown: ``tables`` and ``forward`` compute the rows they return in the recorded
    graph, from the same float64 frequencies, so the graph holds for any length. There a
    length-dependent rope type needs a concrete length: ``torch.compile`` specializes on it
    (one graph per length), and ``torch.jit.trace``, which would freeze the frequencies of
    the traced length, refuses it.

    Multi-axis RoPE (``ropelib.multiaxis``): built with ``frequencies`` W ``(dim // 2, k)``,
    the module takes positions ``(..., seq, k)`` (``forward(positions=...)``) and turns pair i
    by ``sum_a p_a W[i, a]``. Its cache is the diagonal p = (m, .., m), angles
    m * sum_a W[i, a] (for M-RoPE, whose pairs each follow one axis, that is 1D RoPE: text
    tokens), which is also what ``tables`` and ``forward(seq_len)`` return. When every pair
    follows one axis, the rows of multi-axis positions are gathered from that cache, pair by
    pair (the same float64 angles, no new trigonometry); otherwise they are computed
    (``axis_tables``).

    Args:
        dim: rotary dimension (head_dim, or rotary_dim for a partial rotation); the head
            dimension when ``scaling`` has a ``partial_rotary_factor``.
        base: RoPE base; default the config's ``rope_theta``, else 10000.
        scaling: optional rope config (``rope_scaling`` or transformers-5 ``rope_parameters``),
            or one per layer type with ``layer_type``. A config with ``mrope_section``
            (Qwen2-VL; Qwen3-VL with ``mrope_interleaved``) makes the module multi-axis: W
            deals the config's (scaled) spectrum out to the axes, as transformers does, and
            YaRN's attention factor multiplies the rows (``attention_factor``). With dynamic
            NTK or LongRoPE the spectrum is that of the length max(positions) + 1, as in
            transformers: the rows come from the tables of that length, ``frequencies`` is W
            of the trained length, and traced or compiled positions are refused (the length
            is in the data).
        max_position_embeddings: initial cache length (default 2048); a ``"longrope"`` config
            without ``factor`` takes factor = max_position_embeddings / L0, and a ``"dynamic"``
            one without ``original_max_position_embeddings`` takes L0 =
            max_position_embeddings, as transformers does.
        device: device of the buffers.
        layer_type: the key of ``scaling`` to use when it holds one config per layer type
            (e.g. ``"full_attention"``).
        frequencies: optional multi-axis frequency matrix ``(dim // 2, k)``, e.g.
            ``axis_frequencies(128, [16, 24, 24])`` (M-RoPE); it replaces base and scaling
            (passing either with it is a ValueError, and ``base`` is then None).

    ``dynamic`` says whether the frequencies depend on the length
    (``ropelib.scaling.depends_on_length(scaling)``). ``pair_axes``: with multi-axis
    frequencies in which every pair follows one axis (M-RoPE), that axis per pair, int64
    ``(dim // 2,)`` (``apply_rope(..., axes=)``: rows read from ``tables()``); else None.

    Buffer (not saved in state dicts): ``inv_freq`` ``(pairs,)`` float32. The cache,
    ``cos_cached`` and ``sin_cached`` ``(cached_len, pairs)`` float32 (float64 after
    ``double()``), is the dtype and layout the kernel reads; pairs =
    ``rotated_dim(dim, scaling) // 2``. It belongs to the module: it is rebuilt when it
    grows, after ``to()`` / ``to_empty()`` and by ``reset_parameters()``. Threads may share a
    module: both tables are published as one unit (a reader never sees the cos of one build
    with the sin of another), and a cache whose frequencies do not depend on the length never
    shrinks (a slower, smaller build started before a bigger one is not published).
    """

    def __init__(self, dim: int, base: float | None = None, *, scaling: Mapping | None = None,
                 max_position_embeddings: int | None = None,
                 device: torch.device | str | None = None,
                 layer_type: str | None = None,
                 frequencies: torch.Tensor | None = None) -> None:
        super().__init__()
        dim = check_even_positive("dim", dim)
        self.frequencies = None if frequencies is None else check_frequencies(frequencies, dim)
        if self.frequencies is not None and scaling is not None:
            raise ValueError(f"pass either frequencies (multi-axis) or scaling, not both; got "
                             f"scaling={dict(scaling)!r}")
        if self.frequencies is not None and base is not None:
            raise ValueError(f"pass either frequencies (multi-axis) or base, not both; got "
                             f"base={base!r}. The frequencies already hold the base: build them "
                             "with it, e.g. axis_frequencies(dim, sections, base=...)")
        if max_position_embeddings is not None:
            max_position_embeddings = check_count("max_position_embeddings",
                                                  max_position_embeddings, extra=" or None")
        scaling = layer_parameters(scaling, layer_type)
        self.dim, self.scaling = dim, scaling
        self.base = None if self.frequencies is not None else rope_base(base, scaling)
        self.max_position_embeddings = max_position_embeddings
        self.dynamic = depends_on_length(scaling)
        # every check on the config's numbers runs here, never in a compiled graph
        self._schedule = None if self.frequencies is not None else FrequencySchedule(
            dim, self.base, scaling, max_position_embeddings=max_position_embeddings)
        self.attention_factor = 1.0  # multiplies cos and sin of multi-axis rows
        sections = axis_sections(scaling)
        if sections is not None:  # a Qwen2-VL / Qwen3-VL config: M-RoPE of its spectrum
            self.frequencies, self.attention_factor = self._axis_matrix(*sections)
            if not self.dynamic:  # else the schedule gives the spectrum of each length
                self._schedule = None
        self.pair_axes = None if self.frequencies is None or (
            (self.frequencies != 0).sum(1) > 1).any() else self.frequencies.abs().argmax(1)
        self.register_buffer("inv_freq", self._frequencies()[0].to(device=device,
                                                                   dtype=torch.float32),
                             persistent=False)
        self._cache: _Cache | None = None
        # the fixed float64 frequencies (theta_i, or W) per device: the tables' device is
        # kept at each build, another at its first eager call
        self._kept: dict[torch.device, torch.Tensor] = {}
        self._table_dtype = torch.float32  # of the cached tables, read without them
        # the tables' device: ``device``, else the default one (meta under torch.device("meta"))
        self._build(max_position_embeddings or 2048, device=torch.empty(0, device=device).device)

    @property
    def cos_cached(self) -> torch.Tensor:
        """The cached cos table ``(cached_len, pairs)``."""
        return self._cache.cos

    @property
    def sin_cached(self) -> torch.Tensor:
        """The cached sin table ``(cached_len, pairs)``."""
        return self._cache.sin

    def _axis_matrix(self, sections: tuple[int, ...], order: str
                     ) -> tuple[torch.Tensor, float]:
        """The frequency matrix W ``(pairs, k)`` of a config with ``mrope_section``: pair i
        of the config's (scaled) spectrum follows axis ``axis_of_pairs(...)[i]``, as
        transformers' Qwen2-VL / Qwen3-VL rotary embeddings deal them out; and the config's
        attention factor (YaRN's, LongRoPE's), which multiplies cos and sin. For a rope type
        whose spectrum depends on the length (dynamic NTK, LongRoPE) this is W of the
        trained length; the tables of a longer one deal out that length's spectrum."""
        inv_freq, attention = self._schedule()
        pairs = inv_freq.shape[0]
        if sum(sections) != pairs:
            raise ValueError(f"scaling['mrope_section']={list(sections)} must sum to the "
                             f"{pairs} rotated pairs (rotated dim {2 * pairs} / 2), got sum "
                             f"{sum(sections)}")
        with torch.device("cpu"):
            W = torch.zeros(pairs, len(sections), dtype=torch.float64)
            W[torch.arange(pairs), axis_of_pairs(2 * pairs, sections, order)] = inv_freq
        return W, attention

    @property
    def cached_len(self) -> int:
        return self._cache.cos.shape[0]

    @property
    def num_axes(self) -> int:
        """k, the coordinates of a position (1 without ``frequencies``)."""
        return 1 if self.frequencies is None else self.frequencies.shape[1]

    def _frequencies(self, freq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """The cache's per-pair frequencies (float64) and attention factor: the scaled
        theta_i (for the length ``freq_len`` where they depend on it), or the diagonal's
        sum_a W[i, a] for multi-axis frequencies."""
        if self._schedule is None:
            return self.frequencies.sum(1), self.attention_factor
        return self._schedule(freq_len)

    def _build(self, length: int, freq_len: int | None = None,
               device: torch.device | None = None) -> _Cache:
        """New tables for positions ``0 .. length - 1`` (frequencies for ``freq_len``, the
        length dynamic NTK and LongRoPE see) on ``device`` (default: where the tables are), in
        float64 if they are float64 (``double()``) and float32 otherwise; returned, and
        published as the module's cache unless that would shrink a cache whose frequencies do
        not depend on the length (another thread grew it meanwhile).
        They are ordinary tensors even inside ``torch.inference_mode()`` (decoding there grows
        the cache), so the module trains afterwards."""
        current = self._cache
        device = current.cos.device if device is None else device
        dtype = torch.float64 if current is not None and current.cos.dtype == torch.float64 \
            else torch.float32
        with torch.inference_mode(False), torch.device("cpu"):  # computed there, then moved
            inv_freq, factor = self._frequencies(freq_len)
            positions = torch.arange(length, dtype=torch.float64)
            built = _Cache(*_angles_to_tables(positions, inv_freq, factor, device, dtype),
                           freq_len)
            inv_freq = inv_freq.to(device=device, dtype=torch.float32)
            if device not in self._kept:
                self._kept = {**self._kept, device: self._fixed().to(device)}
        with _PUBLISH:
            current = self._cache
            if (current is None or self.dynamic or length >= current.cos.shape[0]
                    or current.cos.device != built.cos.device or current.cos.dtype != dtype):
                self._cache, self._table_dtype, self.inv_freq = built, dtype, inv_freq
        return built

    def reset_parameters(self) -> None:
        """Recompute theta_i and the tables (same length and device), e.g. after construction
        on the meta device and ``to_empty()``; ``to()``, ``to_empty()``, ``cuda()`` and the
        like call it. The tables are float64 after ``double()`` and float32 otherwise (angles
        need the precision: ``half()`` does not make them half), and nothing is computed on
        the meta device."""
        if not self._cache.cos.is_meta:
            self._build(self.cached_len, self._cache.scaled_for)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        cache = self._cache
        self._cache = _Cache(fn(cache.cos), fn(cache.sin), cache.scaled_for)
        self.reset_parameters()
        return self

    def _ensure(self, length: int) -> _Cache:
        """A cache that covers ``length`` positions with the frequencies of that length: the
        published one, or one built for it (and published)."""
        cache = self._cache
        cached_len, scaled_for = cache.cos.shape[0], cache.scaled_for
        if not self.dynamic:
            return self._build(max(length, 2 * cached_len)) if length > cached_len else cache
        original = self._schedule.trained_length
        if rope_type(self.scaling) == "longrope":  # the long factors above the trained length
            long = length > original
            if long != (scaled_for is not None):
                return self._build(max(length, cached_len), freq_len=length if long else None)
            if length > cached_len:
                return self._build(max(length, 2 * cached_len), scaled_for)
            return cache
        if length > original and length > (scaled_for or original):
            return self._build(length, freq_len=length)
        if length <= original and scaled_for is not None:
            return self._build(max(cached_len, original))
        if length > cached_len:
            return self._build(length)
        return cache

    def tables(self, length: int, device: torch.device | str | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached ``(cos, sin)``, grown to cover at least ``length`` positions.

        The result may have more than ``length`` rows; ``apply_rope`` selects the rows it needs.
        ``device``: where the caller's tensors are; tables still on the meta device (e.g. after
        ``load_state_dict(..., assign=True)``, which does not load these buffers) are built
        there.
        """
        if tracing():
            device = self.inv_freq.device if device is None else device
            return self.traced_rows(torch.arange(length, device=device), length)
        length = check_count("length", length, zero=True)
        cache = self._cache
        if device is not None and cache.cos.is_meta and torch.device(device).type != "meta":
            self._build(cache.cos.shape[0], cache.scaled_for, torch.device(device))
        cache = self._ensure(length)
        return cache.cos, cache.sin

    def forward(self, seq_len: int | None = None, *, positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions ``0 .. seq_len - 1`` or for integer ``positions``.

        Returns ``(seq_len, dim // 2)`` tables, or ``positions.shape + (dim // 2,)`` rows; with
        multi-axis ``frequencies``, positions are ``(..., seq, k)`` and the rows
        ``(..., seq, dim // 2)``. Off the CPU (and under a compiler) the rows of given
        positions are computed on the device from the float64 frequencies, so no value is
        read back to the host (but for rope types whose frequencies depend on the length);
        on the CPU they are gathered from the tables.
        """
        if (seq_len is None) == (positions is None):
            raise ValueError("pass exactly one of seq_len or positions")
        if positions is None:
            cos, sin = self.tables(seq_len)
            return cos[:seq_len], sin[:seq_len]
        if self.frequencies is not None:
            return self._axis_rows(positions)
        positions = check_int_tensor("positions", positions)
        if self.dynamic and tracing():
            raise ValueError(f"rope type {rope_type(self.scaling)!r} has frequencies "
                             "that depend on the length max(positions) + 1, which a traced "
                             "graph cannot read from the data; call forward(seq_len) or "
                             "traced_rows(positions, length)")
        device = self._rows_device(positions)
        if tracing() or (device.type != "cpu" and not self.dynamic):
            # computed in the graph, or on a GPU (no largest position read back)
            return self.traced_rows(traced_nonnegative(positions.to(device)), None)
        if positions.numel() and int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
        cos, sin = self.tables(int(positions.max()) + 1 if positions.numel() else 0,
                               positions.device)
        index = positions.to(cos.device)
        return cos[index], sin[index]

    def traced_rows(self, positions: torch.Tensor, length: int | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows ``positions.shape + (dim // 2,)`` computed from scratch (float64
        angles, like the cache), without reading or growing the cache: what a compiled,
        exported or traced graph records. ``length``: the sequence length the frequencies
        are for, used only when they depend on it (then it is made concrete: a compiled
        graph specializes on it, and ``torch.jit.trace`` refuses, since it would freeze the
        traced length's frequencies)."""
        freq_len = None
        if self.dynamic:
            if torch.jit.is_tracing():
                raise ValueError(f"rope type {rope_type(self.scaling)!r} has frequencies "
                                 "that depend on the sequence length; torch.jit.trace would "
                                 "freeze those of the traced length. Use torch.export or "
                                 "torch.compile, which check the length")
            freq_len = int(length)
        if freq_len is None:  # the fixed frequencies, kept where the positions are
            fixed = self._on_device(positions.device)
            inv_freq = fixed if self.frequencies is None else fixed.sum(1)
            factor = self.attention_factor if self._schedule is None else (
                self._schedule.attention_factor)
        else:
            inv_freq, factor = self._frequencies(freq_len)
        return _angles_to_tables(positions, inv_freq.to(positions.device), factor,
                                 positions.device, self._table_dtype)

    def _fixed(self) -> torch.Tensor:
        """The frequencies that do not change with the length, float64 on the CPU: W
        ``(dim // 2, k)`` for multi-axis RoPE, else theta_i ``(pairs,)`` (of the trained
        length for dynamic NTK and LongRoPE)."""
        return self.frequencies if self.frequencies is not None else self._schedule()[0]

    def _on_device(self, device: torch.device) -> torch.Tensor:
        """``_fixed()`` on ``device``: the copy kept there (made with the tables, or by an
        earlier eager call), so no call copies them from the host, eager or compiled (a copy
        inside a CUDA graph's capture would fail; in a compiled graph it would wait for the
        GPU at every call)."""
        kept = self._kept.get(device)
        if kept is None:
            kept = self._fixed().to(device)
            if not tracing():
                self._kept = {**self._kept, device: kept}
        return kept

    def _rows_device(self, positions: torch.Tensor) -> torch.device:
        """Where the rows of ``positions`` go: where the tables are (``inv_freq``, published
        with them, is read: a compiled graph that read the tables would be recompiled when
        they grow); where the positions are while the tables are still on the meta device
        (after ``load_state_dict(..., assign=True)``, which does not load them)."""
        device = self.inv_freq.device
        return positions.device if device.type == "meta" else device

    def _axis_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``(..., seq, dim // 2)`` for multi-axis integer positions ``(..., seq, k)``."""
        check_axis_positions(positions, self.num_axes, integer=True)
        device = self._rows_device(positions)
        if self.dynamic and tracing():
            raise ValueError(f"M-RoPE of rope type {rope_type(self.scaling)!r} has "
                             "frequencies that depend on the length max(positions) + 1, "
                             "which a traced or compiled graph cannot read from the data; "
                             "run it eagerly")
        if tracing() or (device.type != "cpu" and not self.dynamic):
            # computed in the graph, or on a GPU (no largest position read back): float64
            # angles from W, as traced_rows does for 1D positions
            return self._scaled(*axis_tables(traced_nonnegative(positions.to(device)),
                                             self._on_device(device), dtype=self._table_dtype))
        low, high = (int(v) for v in torch.aminmax(positions)) if positions.numel() else (0, -1)
        if low < 0:
            raise ValueError(f"positions must be >= 0, got min {low}")
        if self.pair_axes is None:  # pairs turning with several axes: computed
            return self._scaled(*axis_tables(positions.to(device), self._on_device(device),
                                             dtype=self._table_dtype))
        cos, sin = self.tables(high + 1, device)
        return axis_rows(cos, sin, positions.to(device=cos.device, dtype=torch.int64),
                         self.pair_axes.to(cos.device))

    def _scaled(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin times the attention factor of the config (1 but for YaRN's)."""
        if self.attention_factor == 1.0:
            return cos, sin
        return cos * self.attention_factor, sin * self.attention_factor
