"""Rotation frequencies, plain and rescaled for context extension.

RoFormer's frequencies are theta_i = base^(-2i/d) for i = 0 .. d/2 - 1. Context-extension
methods change them (and sometimes the attention temperature). Each method is configured by
the same dictionary Hugging Face configs use under ``rope_scaling``, for example
``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}``.

Supported ``rope_type`` values:

- ``"default"``: theta_i unchanged.
- ``"linear"``: position interpolation (Chen et al. 2023), theta_i / s, so that position m
  rotates like position m / s did.
- ``"ntk"``: NTK-aware base change, base' = base * s^(d / (d - 2)), which stretches the lowest
  frequency by exactly s and leaves the highest one unchanged.
- ``"dynamic"``: NTK with the factor recomputed from the current length L when L exceeds the
  trained length L0: base' = base * (s L / L0 - (s - 1))^(d / (d - 2)); original
  frequencies for L <= L0. L0 is ``original_max_position_embeddings``, or, when the config
  has none (as transformers 5 stores it), the model's ``max_position_embeddings``, as
  transformers takes it.
- ``"yarn"``: YaRN (Peng et al. 2023): interpolate the frequencies that turn fewer than
  beta_slow times over L0, keep those that turn more than beta_fast times, ramp linearly in
  between, and scale the attention logits by (0.1 ln s + 1)^2 (the factor multiplies cos and
  sin, hence q and k).
- ``"llama3"``: Llama 3.1's rule: wavelengths longer than L0 / low_freq_factor are divided by
  s, shorter than L0 / high_freq_factor are kept, smooth interpolation in between.
- ``"longrope"``: LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond
  2 Million Tokens"; Phi-3/4): one stretch factor per pair, found by search,
  theta_i / ext_i with ext = ``long_factor`` when the current length exceeds L0 =
  ``original_max_position_embeddings`` and ``short_factor`` otherwise; cos and sin are
  multiplied by ``attention_factor``, by default sqrt(1 + ln s / ln L0) (1 for s <= 1).
- ``"proportional"``: p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary
  Positional Encodings useful?"; Gemma 4's global layers): the fastest floor(p d / 2) pairs
  keep theta_i = base^(-2i/d), with d the whole head, the slower ones get frequency 0 (never
  rotated); all divided by ``factor`` (default 1). The tables still cover the whole head.

Transformers 5 configs carry the base inside the same dict (``rope_parameters``): the keys
``rope_theta`` (the base) and ``partial_rotary_factor`` p are accepted by every type and mean
what they mean in transformers. For ``"proportional"``, p picks the rotated pairs as above; for
every other type, only the first int(p d) channels are rotated, with the spectrum of an
int(p d)-channel head (GPT-NeoX's ``rotary_dim``: base^(-2i/(p d)) over those channels). Models
with different RoPE per layer type (Gemma 3/4, gpt-oss) hold one such dict per layer type,
``{"sliding_attention": {...}, "full_attention": {...}}``: ``layer_parameters`` picks one.
Vision-language models (Qwen2-VL, Qwen3-VL) add ``mrope_section`` (pairs per axis t, h, w)
and ``mrope_interleaved`` to any of these types: the pairs of the (scaled) spectrum are dealt
out to the axes (``axis_sections``), and ``RotaryEmbedding`` builds the frequency matrix of
``ropelib.multiaxis`` from them.

All arithmetic is float64 on the CPU; callers cast and move the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ._checks import as_int, check_base, check_count, check_even_positive

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "proportional")
DEFAULT_BASE = 10000.0
_EVERY_TYPE = ("rope_theta", "partial_rotary_factor")
_MULTI_AXIS = ("mrope_section", "mrope_interleaved")  # Qwen2-VL / Qwen3-VL M-RoPE

_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    "proportional": (),
}
_OPTIONAL = {
    "default": ("factor", "original_max_position_embeddings"),
    "linear": ("original_max_position_embeddings",),
    "ntk": ("original_max_position_embeddings",),
    "dynamic": ("original_max_position_embeddings",),
    "yarn": ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "longrope": ("factor", "attention_factor"),
    "proportional": ("factor",),
}


def default_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i = 0 .. dim/2 - 1, shape ``(dim // 2,)``, float64, CPU."""
    dim = check_even_positive("dim", dim)
    check_base(base)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return torch.pow(torch.tensor(float(base), dtype=torch.float64), -exponents)


def is_per_layer_type(config: object) -> bool:
    """Whether ``config`` holds one rope config per layer type, as Gemma 3/4 and gpt-oss do:
    a dict without a ``rope_type`` of its own whose values are all dicts (or None, a layer type
    without RoPE), e.g. ``{"sliding_attention": {...}, "full_attention": {...}}``."""
    return (isinstance(config, Mapping) and len(config) > 0
            and "rope_type" not in config and "type" not in config
            and all(v is None or isinstance(v, Mapping) for v in config.values()))


def layer_parameters(config: Mapping | None, layer_type: str | None) -> Mapping | None:
    """The rope config of one layer type.

    A per-layer-type config (see ``is_per_layer_type``) needs ``layer_type``, one of its keys;
    a single config (or None) is returned as it is and takes no ``layer_type``.
    """
    if not is_per_layer_type(config):
        if layer_type is not None:
            raise ValueError(f"layer_type={layer_type!r} was given, but scaling is a single rope "
                             "config (it has a 'rope_type'), not one per layer type; leave "
                             "layer_type=None")
        return config
    kinds = sorted(config)
    if layer_type is None:
        raise ValueError(f"scaling holds one rope config per layer type {kinds}; pass "
                         f"layer_type= one of them, e.g. layer_type={kinds[0]!r}")
    if layer_type not in config:
        raise ValueError(f"layer_type must be one of the layer types in scaling, {kinds}, "
                         f"got {layer_type!r}")
    if config[layer_type] is None:
        raise ValueError(f"scaling[{layer_type!r}] is None: layers of that type use no RoPE "
                         "(NoPE); build them without it, e.g. StandardAttentionWithRoPE(..., "
                         "rope=False)")
    return config[layer_type]


def rope_type(config: Mapping | None) -> str:
    """The ``rope_type`` of a scaling config (``None`` means ``"default"``)."""
    if config is None:
        return "default"
    if not isinstance(config, Mapping):
        raise TypeError(f"scaling must be a dict like {{'rope_type': 'linear', 'factor': 2.0}} "
                        f"or None, got {type(config).__name__}")
    if is_per_layer_type(config):
        raise ValueError(f"scaling holds one rope config per layer type {sorted(config)}; pick "
                         "one, scaling[layer_type], or pass layer_type= to RotaryEmbedding / "
                         "StandardAttentionWithRoPE")
    kind = config.get("rope_type", config.get("type"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"scaling['rope_type'] must be one of {ROPE_TYPES}, got {kind!r}")
    return kind


def depends_on_length(config: Mapping | None) -> bool:
    """Whether the frequencies of this scaling config change with the sequence length: dynamic
    NTK (recomputed past the trained length) and LongRoPE (short factors up to the trained
    length, long ones beyond). The one place that says which rope types do. Keys rotated while
    the sequence was shorter then no longer match the frequencies of a longer one, so
    ``StandardAttentionWithRoPE`` caches such keys unrotated, and ``RotaryEmbedding``
    rebuilds its tables when the length moves them."""
    return rope_type(config) in ("dynamic", "longrope")


def _validated(config: Mapping | None) -> tuple[str, dict]:
    kind = rope_type(config)
    # a key set to None is absent, as transformers reads it (truncate=None stays an error)
    params = {k: v for k, v in (config or {}).items()
              if k not in ("rope_type", "type") and (v is not None or k == "truncate")}
    missing = [k for k in _REQUIRED[kind] if k not in params]
    if missing:
        raise ValueError(f"scaling of rope_type {kind!r} needs the key(s) {missing}; got {dict(config)}")
    allowed = set(_REQUIRED[kind]) | set(_OPTIONAL[kind]) | set(_EVERY_TYPE) | set(_MULTI_AXIS)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"scaling of rope_type {kind!r} does not accept the key(s) {unknown}; "
                         f"accepted keys: {sorted(allowed)}")
    if kind != "default" or "factor" in params:
        _check_number("factor", params.get("factor", 1.0), at_least=1.0)
    if "rope_theta" in params:
        _check_number("rope_theta", params["rope_theta"], above=1.0)
    fraction = params.get("partial_rotary_factor")
    if fraction is not None and not (_is_finite_number(fraction) and 0.0 < fraction <= 1.0):
        raise ValueError("scaling['partial_rotary_factor'] must be a number p with 0 < p <= 1 "
                         f"(the fraction of the head that rotates), got {fraction!r}")
    sections = params.get("mrope_section")
    if sections is not None and (
            isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence)
            or not sections or any(as_int(n) is None or as_int(n) < 1 for n in sections)):
        raise ValueError("scaling['mrope_section'] must be a list of positive ints, the pairs of "
                         f"each axis (t, h, w), e.g. [16, 24, 24], got {sections!r}")
    if not isinstance(params.get("mrope_interleaved", False), bool):
        raise ValueError("scaling['mrope_interleaved'] must be a bool (True: Qwen3-VL's "
                         f"interleaved M-RoPE), got {params['mrope_interleaved']!r}")
    original = params.get("original_max_position_embeddings")
    if original is not None:
        check_count("scaling['original_max_position_embeddings']", original)
    if params.get("attention_factor") is not None:
        _check_number("attention_factor", params["attention_factor"], above=0.0)
    if kind == "yarn":
        beta_fast, beta_slow = params.get("beta_fast", 32.0), params.get("beta_slow", 1.0)
        _check_number("beta_fast", beta_fast, above=0.0)
        _check_number("beta_slow", beta_slow, above=0.0)
        if beta_fast < beta_slow:
            raise ValueError(f"scaling['beta_fast'] ({beta_fast}) must be >= "
                             f"scaling['beta_slow'] ({beta_slow}): pairs turning more than "
                             "beta_fast times are kept, fewer than beta_slow times interpolated")
        for key in ("mscale", "mscale_all_dim"):
            if params.get(key) is not None:
                _check_number(key, params[key], at_least=0.0)
        if not isinstance(params.get("truncate", True), bool):
            raise ValueError(f"scaling['truncate'] must be a bool, got {params['truncate']!r}")
    if kind == "llama3":
        for key, default in (("low_freq_factor", 1.0), ("high_freq_factor", 4.0)):
            _check_number(key, params.get(key, default), above=0.0)
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            values = params[key]
            if isinstance(values, (torch.Tensor, np.ndarray)):  # as transformers accepts
                values = values.tolist()
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ValueError(f"scaling['{key}'] must be a list of numbers, one stretch factor "
                                 f"per rotated pair, got {values!r}")
            for i, value in enumerate(values):
                if not (_is_finite_number(value) and value > 0):
                    raise ValueError(f"scaling['{key}'][{i}] must be a finite number > 0 (the "
                                     f"stretch factor of pair {i}), got {value!r}")
    return kind, params


def axis_sections(config: Mapping | None) -> tuple[tuple[int, ...], str] | None:
    """The M-RoPE of a config that carries ``mrope_section`` (Qwen2-VL, Qwen3-VL): its pairs
    per axis and their order, ``"interleaved"`` with ``mrope_interleaved: True`` (Qwen3-VL)
    and ``"chunked"`` otherwise (Qwen2-VL, Qwen2.5-VL); None for a 1D config.
    transformers decides the order by the model class and ignores ``mrope_interleaved``; the
    Qwen3-VL configs carry it, and a config without it is read as Qwen2-VL's."""
    _, params = _validated(config)
    if params.get("mrope_section") is None:
        return None
    order = "interleaved" if params.get("mrope_interleaved", False) else "chunked"
    return tuple(as_int(n) for n in params["mrope_section"]), order


def rope_base(base: float | None, config: Mapping | None = None) -> float:
    """The RoPE base: ``base``, else the config's ``rope_theta``, else 10000.

    A ``base`` that differs from the config's ``rope_theta`` is a ValueError naming both.
    ``config`` is one layer type's config (see ``layer_parameters``).
    """
    _, params = _validated(config)
    theta = params.get("rope_theta")
    if base is None:
        return DEFAULT_BASE if theta is None else float(theta)
    check_base(base)
    if theta is not None and float(theta) != float(base):
        raise ValueError(f"base={base!r} and scaling['rope_theta']={theta!r} differ: rope_theta "
                         "is the base; pass base=None to use rope_theta (or the same value)")
    return float(base)


def rotated_dim(dim: int, config: Mapping | None = None) -> int:
    """Channels of a ``dim``-channel head that the tables of ``config`` cover: 2 * len(inv_freq).

    ``int(p * dim)`` for a ``partial_rotary_factor`` p (it must be even), except for
    ``"proportional"``, whose tables always cover the whole head; ``dim`` otherwise.
    """
    kind, params = _validated(config)
    check_even_positive("dim", dim)
    return _rotated(dim, kind, params)


def _rotated(dim: int, kind: str, params: dict) -> int:
    fraction = params.get("partial_rotary_factor")
    if kind == "proportional" or fraction is None:
        return dim
    rotated = int(dim * fraction)
    if rotated < 2 or rotated % 2:
        raise ValueError(f"scaling['partial_rotary_factor']={fraction!r} rotates "
                         f"int({fraction!r} * dim) = {rotated} of dim={dim} channels; that must be "
                         "a positive even number (RoPE rotates channel pairs)")
    return rotated


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base: base * factor^(dim / (dim - 2))."""
    return base * factor ** (dim / (dim - 2))


def _is_finite_number(value: object) -> bool:
    """A finite real number: a Python or NumPy int or float, not a bool."""
    return (not isinstance(value, (bool, np.bool_))
            and isinstance(value, (int, float, np.integer, np.floating))
            and math.isfinite(value))


def _check_number(key: str, value: object, *, at_least: float | None = None,
                  above: float | None = None) -> None:
    """A finite real number (not a bool) >= at_least or > above, else a ValueError naming
    ``scaling[key]``."""
    ok = (_is_finite_number(value) and (at_least is None or value >= at_least)
          and (above is None or value > above))
    if not ok:
        bound = f">= {at_least:g}" if at_least is not None else f"> {above:g}"
        raise ValueError(f"scaling['{key}'] must be a finite number {bound}, got {value!r}")


def yarn_correction_range(
    dim: int, base: float, original_max_position_embeddings: int,
    beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True,
) -> tuple[float, float]:
    """Pair indices (low, high) between which YaRN ramps from extrapolation to interpolation.

    Pair i turns L0 * theta_i / (2 pi) times over the trained length L0; the pair that turns r
    times is i(r) = d ln(L0 / (2 pi r)) / (2 ln base). low = i(beta_fast), high = i(beta_slow),
    rounded outwards and clipped to [0, dim - 1].
    """
    def pair_for(rotations: float) -> float:
        return dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(base))

    low, high = pair_for(beta_fast), pair_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature factor 0.1 * mscale * ln(s) + 1 (1 for s <= 1)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn(dim: int, base: float, p: dict) -> tuple[torch.Tensor, float]:
    factor = float(p["factor"])
    theta = default_frequencies(dim, base)
    low, high = yarn_correction_range(dim, base, p["original_max_position_embeddings"],
                                      p.get("beta_fast", 32.0), p.get("beta_slow", 1.0),
                                      p.get("truncate", True))
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1: keep theta_i (high frequency), 0: interpolate theta_i / s
    inv_freq = theta / factor * (1 - keep) + theta * keep
    if p.get("attention_factor") is not None:
        attention = float(p["attention_factor"])
    elif p.get("mscale") and p.get("mscale_all_dim"):
        attention = (yarn_attention_factor(factor, p["mscale"])
                     / yarn_attention_factor(factor, p["mscale_all_dim"]))
    else:
        attention = yarn_attention_factor(factor)
    return inv_freq, attention


def _llama3(dim: int, base: float, p: dict) -> torch.Tensor:
    factor = float(p["factor"])
    low_ff, high_ff = float(p.get("low_freq_factor", 1.0)), float(p.get("high_freq_factor", 4.0))
    if not high_ff > low_ff:
        raise ValueError(f"scaling['high_freq_factor'] ({high_ff}) must exceed "
                         f"scaling['low_freq_factor'] ({low_ff})")
    original = p["original_max_position_embeddings"]
    theta = default_frequencies(dim, base)
    wavelen = 2 * math.pi / theta
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * theta / factor + smooth * theta
    inv_freq = torch.where(wavelen > original / low_ff, theta / factor, theta)
    medium = (wavelen >= original / high_ff) & (wavelen <= original / low_ff)
    return torch.where(medium, blended, inv_freq)


def _longrope(dim: int, base: float, p: dict, seq_len: int | None,
              max_position_embeddings: int | None) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("scaling of rope_type 'longrope' has no 'factor': it is then "
                             "max_position_embeddings / original_max_position_embeddings (as in "
                             "transformers); pass max_position_embeddings=, or set "
                             "scaling['factor']")
        factor = max_position_embeddings / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = (1.0 if factor <= 1.0
                     else math.sqrt(1.0 + math.log(factor) / math.log(original)))
    key = "long_factor" if seq_len is not None and seq_len > original else "short_factor"
    for name in ("short_factor", "long_factor"):
        if len(p[name]) != dim // 2:
            raise ValueError(f"scaling['{name}'] must hold one factor per rotated pair, "
                             f"{dim // 2} (rotated dim {dim} / 2), got {len(p[name])} values")
    ext = torch.tensor([float(v) for v in p[key]], dtype=torch.float64)
    return default_frequencies(dim, base) / ext, float(attention)


def _proportional(dim: int, base: float, p: dict) -> torch.Tensor:
    rotated_pairs = int(p.get("partial_rotary_factor", 1.0) * dim // 2)
    theta = default_frequencies(dim, base)
    kept = torch.arange(dim // 2) < rotated_pairs
    return torch.where(kept, theta, torch.zeros_like(theta)) / float(p.get("factor", 1.0))


def scaled_frequencies(
    dim: int, base: float | None = None, config: Mapping | None = None,
    seq_len: int | None = None, *, max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Frequencies and attention factor for a scaling config.

    Args:
        dim: head dimension d (even); with a ``partial_rotary_factor`` p in the config, the
            head whose first int(p d) channels rotate (except for ``"proportional"``, see the
            module docstring). Without p, d is the rotary dimension.
        base: RoPE base (10000 in RoFormer and Llama 2). Default: the config's ``rope_theta``,
            else 10000; a base that differs from ``rope_theta`` is an error.
        config: ``None`` or a Hugging Face style ``rope_scaling`` / ``rope_parameters`` dict of
            one layer type (see the module docstring).
        seq_len: current sequence length; ``"dynamic"`` and ``"longrope"`` use it.
        max_position_embeddings: the model's context length; a ``"longrope"`` config without
            ``factor`` (factor = max_position_embeddings / L0) and a ``"dynamic"`` one without
            ``original_max_position_embeddings`` (L0 = max_position_embeddings) use it, as
            transformers does.

    Returns:
        ``(inv_freq, attention_factor)``: inv_freq of shape ``(rotated_dim(dim, config) // 2,)``,
        float64 on the CPU; attention_factor multiplies cos and sin (1.0 except for YaRN and
        LongRoPE).
    """
    if seq_len is not None:
        seq_len = check_count("seq_len", seq_len, zero=True, extra=" or None")
    schedule = FrequencySchedule(dim, base, config,
                                 max_position_embeddings=max_position_embeddings)
    return schedule(seq_len)


def trained_length(config: Mapping | None, max_position_embeddings: int | None = None
                   ) -> int | None:
    """L0, the length a length-dependent config (``depends_on_length``) switches at: its
    ``original_max_position_embeddings``, else, for dynamic NTK (whose transformers-5 config
    has no such key), ``max_position_embeddings``; None for other rope types. A dynamic
    config with neither is a ValueError."""
    kind, p = _validated(config)
    if kind not in ("dynamic", "longrope"):
        return None
    if "original_max_position_embeddings" in p:
        return as_int(p["original_max_position_embeddings"])
    if max_position_embeddings is None:
        raise ValueError("scaling of rope_type 'dynamic' has no "
                         "'original_max_position_embeddings': the trained length is then "
                         "max_position_embeddings (as in transformers 5); pass "
                         "max_position_embeddings=, or set "
                         "scaling['original_max_position_embeddings']")
    return check_count("max_position_embeddings", max_position_embeddings, extra=" or None")


class FrequencySchedule:
    """The frequencies of one rope config as a function of the current length, checked and
    computed once.

    Every check on the config's numbers runs here, at construction; calling the schedule
    reads only tensors and ints it holds. A compiled graph that calls it (one layer of a
    model compiled on its own, whose base or factor differs from the previous layer's, so
    that ``torch.compile`` makes them symbolic) then never runs a check on a symbolic number.

    Args: as ``scaled_frequencies``.

    ``schedule(seq_len)`` returns ``(inv_freq, attention_factor)`` as ``scaled_frequencies``
    does: inv_freq float64 ``(rotated_dim(dim, config) // 2,)`` on the CPU.
    """

    def __init__(self, dim: int, base: float | None = None, config: Mapping | None = None, *,
                 max_position_embeddings: int | None = None) -> None:
        kind, p = _validated(config)
        base = rope_base(base, config)
        dim = check_even_positive("dim", dim)
        if max_position_embeddings is not None:
            max_position_embeddings = check_count("max_position_embeddings",
                                                  max_position_embeddings, extra=" or None")
        dim = _rotated(dim, kind, p)
        if kind in ("ntk", "dynamic") and dim == 2:
            raise ValueError(f"dim must be >= 4 for {kind!r} scaling (the base grows by "
                             "factor^(dim / (dim - 2))), got 2")
        self.kind = kind
        self.trained_length = trained_length(config, max_position_embeddings)
        self.attention_factor = 1.0
        self._long: torch.Tensor | None = None
        with torch.device("cpu"):
            theta = default_frequencies(dim, base)
            if kind == "default":
                self._inv_freq = theta
            elif kind == "proportional":
                self._inv_freq = _proportional(dim, base, p)
            elif kind == "longrope":
                self._inv_freq, self.attention_factor = _longrope(
                    dim, base, p, None, max_position_embeddings)
                self._long, _ = _longrope(dim, base, p, self.trained_length + 1,
                                          max_position_embeddings)
            elif kind == "linear":
                self._inv_freq = theta / float(p["factor"])
            elif kind == "ntk":
                self._inv_freq = default_frequencies(dim, ntk_base(base, float(p["factor"]), dim))
            elif kind == "dynamic":
                self._inv_freq = theta
                # base, factor and d / (d - 2) as tensors: no Python number a graph could
                # make symbolic
                self._dynamic = torch.tensor([base, float(p["factor"]), dim / (dim - 2)],
                                             dtype=torch.float64)
                self._exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
            elif kind == "yarn":
                self._inv_freq, self.attention_factor = _yarn(dim, base, p)
            else:
                self._inv_freq = _llama3(dim, base, p)

    def __call__(self, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` for the current length ``seq_len`` (None: at most
        the trained length)."""
        long = seq_len is not None and self.trained_length is not None and (
            seq_len > self.trained_length)
        if not long or self.kind not in ("dynamic", "longrope"):
            return self._inv_freq, self.attention_factor
        if self.kind == "longrope":
            return self._long, self.attention_factor
        base, factor, power = self._dynamic
        grown = factor * seq_len / self.trained_length - (factor - 1)
        return torch.pow(base * grown ** power, -self._exponents), 1.0
