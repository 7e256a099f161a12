"""Chapter 13's models: one decoder, a position scheme per layer, and what to measure in it.

``PatternDecoder`` is chapter 10's look-back decoder (``ropelib.book.toy``) with one change:
each layer has its own position scheme, a rope config for ``StandardAttentionWithRoPE``
(``ropelib.scaling``: ``{"rope_type": "default"}``, a ``partial_rotary_factor``, p-RoPE's
``"proportional"``) or ``None`` for a layer without positions (NoPE). That is how today's
models mix them: Llama 4 and SmolLM3 drop RoPE from every fourth layer, Gemma 4 uses p-RoPE
in its global layers; Llama 4 and Command A keep RoPE only in local layers (chunked or
sliding-window attention) and drop it from their global ones. A layer can be local: it attends
only to the last ``window`` keys. ``VARIANTS`` names the six patterns the chapter compares.

``train`` is the chapter's training loop (AdamW, fixed batches from a seeded generator),
``train_variant`` one run of the comparison (a variant from a seed; the chapter and
``scripts/train_layer_patterns.py`` both train with it), ``accuracy_by_length`` its
evaluation, ``counting_batch`` a task that only a model which knows where each token sits
can solve (the NoPE section), and ``pair_contributions`` splits a layer's query-key scores
into the contributions of the rotation pairs (the band analysis).

Needs only torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import StandardAttentionWithRoPE
from ..rotation import apply_rope
from .toy import IGNORE, lookback_batch

__all__ = ["VARIANTS", "PatternConfig", "PatternDecoder", "accuracy_by_length",
           "attention_stack", "counting_batch", "layer_inputs", "local_mask",
           "pair_contributions", "train", "train_variant", "variant_layers", "variant_windows"]

VARIANTS = ("full RoPE", "partial 25%", "p-RoPE 25%", "NoPE", "3:1 RoPE/NoPE",
            "local RoPE + global NoPE")
"""The six position schemes of chapter 13's comparison (see ``variant_layers`` and
``variant_windows``)."""


def variant_layers(name: str, num_layers: int, *, base: float = 10000.0
                   ) -> tuple[Mapping | None, ...]:
    """The per-layer rope configs of one of ``VARIANTS`` (``None``: a NoPE layer).

    - ``"full RoPE"``: every pair of every layer rotates, theta_i = base^(-2i/d).
    - ``"partial 25%"``: GPT-NeoX's partial rotation, the first quarter of each head's channels
      with a spectrum squeezed into them, base^(-2i/(d/4)).
    - ``"p-RoPE 25%"``: the fastest quarter of the pairs keep base^(-2i/d), the others do not
      rotate (Barbero et al. 2024; Gemma 4's global layers).
    - ``"NoPE"``: no layer has positions; only the causal mask breaks the symmetry.
    - ``"3:1 RoPE/NoPE"``: full RoPE in three layers of four, NoPE in every fourth, every
      layer global (SmolLM3).
    - ``"local RoPE + global NoPE"``: the same 3:1 pattern, but the RoPE layers are local
      (``variant_windows``): Command A's sliding-window RoPE layers and Llama 4's chunked
      ones (iRoPE), with global NoPE layers.
    """
    rope = {"rope_type": "default", "rope_theta": base}
    per_layer = {
        "full RoPE": lambda i: rope,
        "partial 25%": lambda i: {**rope, "partial_rotary_factor": 0.25},
        "p-RoPE 25%": lambda i: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                 "rope_theta": base},
        "NoPE": lambda i: None,
        "3:1 RoPE/NoPE": lambda i: None if i % 4 == 3 else rope,
        "local RoPE + global NoPE": lambda i: None if i % 4 == 3 else rope,
    }
    if name not in per_layer:
        raise ValueError(f"name must be one of {VARIANTS}, got {name!r}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    return tuple(per_layer[name](i) for i in range(num_layers))


def variant_windows(name: str, num_layers: int, *, window: int
                    ) -> tuple[int | None, ...]:
    """The attention window of each layer of one of ``VARIANTS``: ``window`` for the local
    RoPE layers of ``"local RoPE + global NoPE"``, ``None`` (global) for every other layer."""
    layers = variant_layers(name, num_layers)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    local = name == "local RoPE + global NoPE"
    return tuple(window if local and layer is not None else None for layer in layers)


def local_mask(seq: int, window: int, *, causal: bool = True) -> torch.Tensor:
    """Boolean mask ``(seq, seq)`` (True = may attend) of a local layer: query m sees key n
    when ``0 <= m - n < window`` (``causal``), or ``|m - n| < window`` (both directions)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    pos = torch.arange(seq)
    distance = pos[:, None] - pos[None, :]
    if causal:
        return (distance >= 0) & (distance < window)
    return distance.abs() < window


def attention_stack(embed_dim: int, num_heads: int, layers: Sequence[Mapping | None], *,
                    layout: str = "interleaved", num_kv_heads: int | None = None
                    ) -> nn.ModuleList:
    """One ``StandardAttentionWithRoPE`` per entry of ``layers``: with RoPE configured by the
    entry (a rope config of ``ropelib.scaling``), or without positions for ``None`` (NoPE).
    The layer pattern of a model (which layers rotate, and how) as ropelib modules."""
    return nn.ModuleList(
        StandardAttentionWithRoPE(embed_dim, num_heads, num_kv_heads=num_kv_heads, layout=layout,
                                  scaling=layer, rope=layer is not None)
        for layer in layers)


@dataclass(frozen=True)
class PatternConfig:
    """Sizes of a ``PatternDecoder``; ``layers`` holds one rope config (or None) per layer.

    ``max_distance`` > 0 adds chapter 10's distance embedding (the look-back task's second
    input); 0 leaves it out (a task of tokens alone). ``windows`` gives each layer an attention
    window (``local_mask``) or ``None`` (global); ``None`` for the whole field: all global.
    """

    layers: tuple[Mapping | None, ...]
    windows: tuple[int | None, ...] | None = None
    vocab_size: int = 16
    max_distance: int = 16
    embed_dim: int = 64
    num_heads: int = 2


class PatternDecoder(nn.Module):
    """A small pre-norm decoder whose attention layers each have their own position scheme.

    ``forward(tokens, distances=None, *, causal=True)`` maps ``(batch, seq)`` int64 tokens (and
    distances when ``config.max_distance`` > 0) to logits ``(batch, seq, vocab_size)``.
    ``causal=False`` attends in both directions (used to show what NoPE loses without the mask).
    Layer i is ``attns[i]``, a ``StandardAttentionWithRoPE`` built with ``scaling=layers[i]``
    (``rope=False`` for ``None``), interleaved layout.
    """

    def __init__(self, config: PatternConfig) -> None:
        super().__init__()
        if not config.layers:
            raise ValueError("config.layers must name at least one layer")
        if config.windows is not None and len(config.windows) != len(config.layers):
            raise ValueError(f"config.windows must give one window (or None) per layer: "
                             f"{len(config.layers)} layers, got {len(config.windows)} windows")
        for name in ("vocab_size", "embed_dim", "num_heads"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config.{name} must be a positive int, got {value!r}")
        self.config = config
        d = config.embed_dim
        self.token_embedding = nn.Embedding(config.vocab_size, d)
        self.distance_embedding = (nn.Embedding(config.max_distance + 1, d)
                                   if config.max_distance > 0 else None)
        self.attn_norms = nn.ModuleList(nn.LayerNorm(d) for _ in config.layers)
        self.attns = attention_stack(d, config.num_heads, config.layers)
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(d) for _ in config.layers)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in config.layers)
        self.out_norm = nn.LayerNorm(d)
        self.readout = nn.Linear(d, config.vocab_size)

    def embed(self, tokens: torch.Tensor, distances: torch.Tensor | None = None) -> torch.Tensor:
        """The input of the first block, ``(batch, seq, embed_dim)``."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (batch, seq), got {tuple(tokens.shape)}")
        h = self.token_embedding(tokens)
        if self.distance_embedding is not None:
            if distances is None or distances.shape != tokens.shape:
                seen = None if distances is None else tuple(distances.shape)
                raise ValueError(f"distances must be (batch, seq) = {tuple(tokens.shape)} for a "
                                 f"model with max_distance > 0, got {seen}")
            h = h + self.distance_embedding(distances)
        return h

    def block(self, i: int, h: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
        """Block i (attention, then MLP, each added to the residual stream) applied to h."""
        x = self.attn_norms[i](h)
        window = None if self.config.windows is None else self.config.windows[i]
        if window is None:
            h = h + self.attns[i](x, x, x, is_causal=causal)
        else:
            mask = local_mask(h.shape[1], window, causal=causal).to(h.device)
            h = h + self.attns[i](x, x, x, attn_mask=mask)
        return h + self.mlps[i](self.mlp_norms[i](h))

    def forward(self, tokens: torch.Tensor, distances: torch.Tensor | None = None, *,
                causal: bool = True) -> torch.Tensor:
        h = self.embed(tokens, distances)
        for i in range(len(self.attns)):
            h = self.block(i, h, causal=causal)
        return self.readout(self.out_norm(h))


def train(model: PatternDecoder, batches: Callable[[torch.Generator], tuple], steps: int, *,
          seed: int, lr: float = 3e-3, one_cycle: bool = False, causal: bool = True,
          progress: Callable[[Iterable[int]], Iterable[int]] | None = None) -> list[float]:
    """AdamW on the cross-entropy of ``model`` over ``steps`` batches; the loss of every step.

    ``batches(generator)`` returns ``(*inputs, targets)`` (targets ``IGNORE`` where there is
    none); the generator is seeded with ``seed``, so every model trained with one seed sees
    the same batches. The learning rate is ``lr`` throughout, or with ``one_cycle`` PyTorch's
    ``OneCycleLR`` up to ``lr`` and down to nearly 0 at the last step (a run that ends on a
    small step ends where it converged, not wherever the last large step threw it).
    ``progress`` wraps the step range (e.g. ``tqdm``).
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = (torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
                if one_cycle else None)
    model.train()
    losses = []
    steps_range: Iterable[int] = range(steps)
    for _ in (progress(steps_range) if progress is not None else steps_range):
        *inputs, targets = batches(generator=generator)
        logits = model(*inputs, causal=causal)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
    return losses


def train_variant(name: str, seed: int, batches: Callable[[torch.Generator], tuple], *,
                  steps: int, num_layers: int, window: int,
                  progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
                  **sizes: int) -> tuple[PatternDecoder, list[float]]:
    """One run of chapter 13's comparison: the ``name`` model of ``VARIANTS`` from ``seed``.

    ``num_layers`` layers (``variant_layers``), local layers of ``window`` keys
    (``variant_windows``), the other fields of ``PatternConfig`` from ``sizes``. The initial
    weights come from ``torch.manual_seed(100 * seed + VARIANTS.index(name))``, the batches
    from ``train(..., seed=seed)``: every variant of one seed sees the same batches. Returns the
    trained model and the loss of every step.
    """
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {VARIANTS}, got {name!r}")
    torch.manual_seed(100 * seed + VARIANTS.index(name))
    config = PatternConfig(layers=variant_layers(name, num_layers),
                           windows=variant_windows(name, num_layers, window=window), **sizes)
    model = PatternDecoder(config)
    return model, train(model, batches, steps, seed=seed, progress=progress)


@torch.no_grad()
def accuracy_by_length(model: PatternDecoder, lengths: Sequence[int], *, tokens_per_length: int,
                       seed: int, from_position: int) -> list[float]:
    """Look-back accuracy at each length: fresh sequences (``tokens_per_length`` tokens in all,
    the same for every model with this seed), queries from ``from_position`` on."""
    config = model.config
    model.eval()
    result = []
    for length in lengths:
        generator = torch.Generator().manual_seed(seed)
        tokens, distances, targets = lookback_batch(
            max(1, tokens_per_length // length), length, config.vocab_size, config.max_distance,
            generator=generator)
        right = model(tokens, distances).argmax(-1) == targets
        keep = targets != IGNORE
        keep[:, :from_position] = False
        result.append(right[keep].float().mean().item())
    return result


def counting_batch(batch: int, length: int, vocab_size: int, *,
                   generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the counting task: a start token (0) and ``length - 1`` copies of one token
    drawn from 1 .. vocab_size - 1 per sequence; the target at position m is m itself.

    Every position after the first holds the same token, so nothing but the position tells
    them apart: a model must know where each token sits. Returns ``(tokens, targets)``, int64
    ``(batch, length)``; a model for it needs ``vocab_size >= length`` classes.
    """
    if length > vocab_size:
        raise ValueError(f"length ({length}) must be <= vocab_size ({vocab_size}): the targets "
                         "are the positions 0 .. length - 1")
    filler = torch.randint(1, vocab_size, (batch, 1), generator=generator)
    tokens = filler.expand(batch, length).clone()
    tokens[:, 0] = 0
    return tokens, torch.arange(length).expand(batch, length).clone()


@torch.no_grad()
def layer_inputs(model: PatternDecoder, tokens: torch.Tensor,
                 distances: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The normalized input of every attention layer, ``(batch, seq, embed_dim)`` each: what
    its q_proj and k_proj read in a causal forward pass."""
    h = model.embed(tokens, distances)
    inputs = []
    for i in range(len(model.attns)):
        inputs.append(model.attn_norms[i](h))
        h = model.block(i, h)
    return inputs


@torch.no_grad()
def pair_contributions(attn: StandardAttentionWithRoPE, x: torch.Tensor, distance: int,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rotation pair's share of the query-key scores at one distance, rotated and not.

    For a query at position m and the key at n = m - distance (every m >= distance of
    ``x``, every head), pair i contributes q'_{2i} k'_{2i} + q'_{2i+1} k'_{2i+1} to the score
    q'^T k' of the rotated vectors (interleaved layout); the same sum of the unrotated q and
    k is what the pair would contribute without the rotation. Summed over the pairs (and
    the unrotated channels of a partial rotation), the rotated contributions give the score.

    Args:
        attn: a layer with RoPE (interleaved layout, its own ``RotaryEmbedding``).
        x: the layer's input ``(batch, seq, embed_dim)`` (see ``layer_inputs``).
        distance: m - n, in 0 .. seq - 1.

    Returns:
        ``(rotated, unrotated)``, each ``(batch, heads, seq - distance, head_dim // 2)``.
    """
    if attn.rotary is None or attn.layout != "interleaved":
        raise ValueError("attn must rotate (rope=True) in the interleaved layout")
    seq = x.shape[1]
    if isinstance(distance, bool) or not isinstance(distance, int) or not 0 <= distance < seq:
        raise ValueError(f"distance must be an int in 0 .. {seq - 1}, got {distance!r}")
    q = attn._split_heads(attn.q_proj(x), attn.num_heads)
    k = attn._split_heads(attn.k_proj(x), attn.num_kv_heads)
    k = k.repeat_interleave(attn.num_heads // attn.num_kv_heads, dim=1)
    cos, sin = attn.rotary(seq)
    q_rot = apply_rope(q, cos, sin, rotary_dim=attn.rotary_dim)
    k_rot = apply_rope(k, cos, sin, rotary_dim=attn.rotary_dim)

    def by_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        prod = a[..., distance:, :] * b[..., :seq - distance, :]
        return prod.unflatten(-1, (-1, 2)).sum(-1)

    return by_pair(q_rot, k_rot), by_pair(q, k)
