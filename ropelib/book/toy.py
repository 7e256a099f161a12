"""The toy experiment of chapter 10: a look-back task and a small decoder built from ropelib.

Task (``lookback_batch``): a sequence of random content tokens x_0 .. x_{N-1}; position m
also carries a distance k_m drawn uniformly from 1 .. max_distance, and the target at m is
x_{m - k_m} (a position with m < k_m has no target, label ``IGNORE``). Solving it needs the
exact relative position -k_m, and the task is the same at every length: a model that has
learned the relative skill should keep it on longer sequences.

Model (``ToyDecoder``): a token embedding plus a distance embedding, pre-norm blocks of causal
``StandardAttentionWithRoPE`` and a two-layer MLP, and a linear read-out. ``position`` picks
how positions enter:

- ``"none"``: no positional encoding (NoPE); only the causal mask breaks the symmetry.
- ``"sinusoidal"``: Vaswani et al.'s absolute embeddings added to the input.
- ``"rope"``: RoPE on q and k in every layer; ``forward(..., scaling=...)`` takes a
  context-extension config (``ropelib.scaling``), applied at inference with no retraining.
- ``"alibi"``: ALiBi's linear distance penalty added to the scores of every layer.

Needs only torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import StandardAttentionWithRoPE
from ..tables import generate_rope_embeddings
from .baselines import alibi_bias, sinusoidal_embeddings

__all__ = ["IGNORE", "POSITIONS", "ToyConfig", "ToyDecoder", "checkpoint_entry", "lookback_accuracy",
           "lookback_batch", "lookback_loss", "model_from_entry"]

IGNORE = -100
POSITIONS = ("none", "sinusoidal", "rope", "alibi")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def lookback_batch(batch: int, length: int, vocab_size: int, max_distance: int, *,
                   generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of the look-back task.

    Args:
        batch: number of sequences.
        length: sequence length N.
        vocab_size: number of content tokens.
        max_distance: largest look-back distance K (distances are 1 .. K).
        generator: the random generator (for reproducible batches).

    Returns:
        ``(tokens, distances, targets)``, each int64 ``(batch, length)``: ``targets[b, m] =
        tokens[b, m - distances[b, m]]``, or ``IGNORE`` where ``m < distances[b, m]``.
    """
    for name, value in (("batch", batch), ("length", length), ("vocab_size", vocab_size),
                        ("max_distance", max_distance)):
        _positive_int(name, value)
    tokens = torch.randint(vocab_size, (batch, length), generator=generator)
    distances = torch.randint(1, max_distance + 1, (batch, length), generator=generator)
    source = torch.arange(length) - distances
    targets = torch.gather(tokens, 1, source.clamp(min=0))
    return tokens, distances, targets.masked_fill(source < 0, IGNORE)


@dataclass(frozen=True)
class ToyConfig:
    """Sizes of a ``ToyDecoder`` (stored beside the weights, see ``checkpoint_entry``)."""

    position: str = "rope"
    vocab_size: int = 16
    max_distance: int = 16
    embed_dim: int = 64
    num_heads: int = 2
    num_layers: int = 2
    base: float = 10000.0


class ToyDecoder(nn.Module):
    """A small causal decoder for the look-back task.

    ``forward(tokens, distances, scaling=None)`` maps two ``(batch, seq)`` int64 tensors to
    logits ``(batch, seq, vocab_size)``. ``scaling`` (RoPE only) is a ``rope_scaling`` dict
    used for the cos/sin tables of every layer, e.g. ``{"rope_type": "linear", "factor": 4.0}``.
    """

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        if config.position not in POSITIONS:
            raise ValueError(f"config.position must be one of {POSITIONS}, "
                             f"got {config.position!r}")
        for name in ("vocab_size", "max_distance", "embed_dim", "num_heads", "num_layers"):
            _positive_int(f"config.{name}", getattr(config, name))
        self.config = config
        d = config.embed_dim
        self.token_embedding = nn.Embedding(config.vocab_size, d)
        self.distance_embedding = nn.Embedding(config.max_distance + 1, d)
        self.attn_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(config.num_layers))
        self.attns = nn.ModuleList(
            StandardAttentionWithRoPE(d, config.num_heads, base=config.base,
                                      rope=config.position == "rope")
            for _ in range(config.num_layers))
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(config.num_layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(config.num_layers))
        self.out_norm = nn.LayerNorm(d)
        self.readout = nn.Linear(d, config.vocab_size)

    @property
    def head_dim(self) -> int:
        return self.config.embed_dim // self.config.num_heads

    def forward(self, tokens: torch.Tensor, distances: torch.Tensor, *,
                scaling: Mapping | None = None) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.shape != distances.shape:
            raise ValueError(f"tokens and distances must both be (batch, seq), got "
                             f"{tuple(tokens.shape)} and {tuple(distances.shape)}")
        if scaling is not None and self.config.position != "rope":
            raise ValueError(f"scaling applies to position='rope' only, this model has "
                             f"position={self.config.position!r}")
        length = tokens.shape[1]
        h = self.token_embedding(tokens) + self.distance_embedding(distances)
        attend = {"is_causal": True}
        if self.config.position == "sinusoidal":
            h = h + sinusoidal_embeddings(length, self.config.embed_dim).to(h)
        elif self.config.position == "alibi":
            bias = alibi_bias(length, length, self.config.num_heads, dtype=h.dtype)
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            attend = {"attn_mask": bias.masked_fill(~causal, float("-inf"))}
        elif self.config.position == "rope":
            attend["rope_embeddings"] = generate_rope_embeddings(
                length, self.head_dim, self.config.base, scaling=scaling)
        for attn_norm, attn, mlp_norm, mlp in zip(self.attn_norms, self.attns, self.mlp_norms,
                                                  self.mlps, strict=True):
            x = attn_norm(h)
            h = h + attn(x, x, x, **attend)
            h = h + mlp(mlp_norm(h))
        return self.readout(self.out_norm(h))


def lookback_loss(model: ToyDecoder, tokens: torch.Tensor, distances: torch.Tensor,
                  targets: torch.Tensor, *, scaling: Mapping | None = None) -> torch.Tensor:
    """Mean cross-entropy over the positions that have a target."""
    logits = model(tokens, distances, scaling=scaling)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def lookback_accuracy(model: ToyDecoder, tokens: torch.Tensor, distances: torch.Tensor,
                      targets: torch.Tensor, *, scaling: Mapping | None = None,
                      from_position: int = 0) -> float:
    """Fraction of positions m >= from_position with a target whose argmax is right."""
    logits = model(tokens, distances, scaling=scaling)
    keep = targets != IGNORE
    keep[:, :from_position] = False
    if not keep.any():
        raise ValueError(f"no position >= from_position={from_position} has a target")
    return (logits.argmax(-1) == targets)[keep].float().mean().item()


def checkpoint_entry(model: ToyDecoder, losses: list[float], *,
                     scaling: Mapping | None = None) -> dict:
    """What ``scripts/train_context_extension.py`` stores per model: the config, the weights
    in float16 (half the bytes; the stored model is the one evaluated), the training losses
    and the RoPE scaling config it was trained with (``None`` if any)."""
    return {"config": asdict(model.config), "scaling": None if scaling is None else dict(scaling),
            "state_dict": {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()},
            "losses": [float(x) for x in losses]}


def model_from_entry(entry: Mapping) -> ToyDecoder:
    """The ``ToyDecoder`` of a ``checkpoint_entry``, in float32 and in eval mode."""
    model = ToyDecoder(ToyConfig(**entry["config"]))
    model.load_state_dict({k: v.float() for k, v in entry["state_dict"].items()})
    return model.eval()
