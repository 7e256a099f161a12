"""The experiment of chapter 12: a tiny ViT that must read a relative 2D position.

Task (``direction_batch``): a G x G grid of patch tokens, random background content, and two
marked patches, A and B, on the same row or the same column, 1 to ``max_distance`` patches
apart. The label says where A lies relative to B: above, below, left or right of it. The
answer depends on the offset between the two only, so a model that has learned the relative
skill on 8 x 8 grids should keep it on larger ones.

Model (``TinyViT``): token embeddings, pre-norm blocks of ropelib's
``StandardAttentionWithRoPE`` (no causal mask) and a two-layer MLP, and a linear read-out of
the four directions at A's token. ``position`` picks how positions enter:

- ``"absolute"``: a learned embedding per patch of the training grid, added to the input and
  resampled (bicubic, as ViTs do) to a larger grid.
- ``"rope-1d"``: 1D RoPE over the raster order (row * G + column).
- ``"rope-axial"``: axial 2D RoPE, ``axis_frequencies(d, [d/4, d/4], spectrum="per_axis")``,
  positions (row, column).
- ``"rope-mixed"``: RoPE-Mixed (Heo et al. 2024), learnable frequencies per head and per
  layer, as in the paper's code (naver-ai/rope-vit): each block has its own ``RoPEMixed``.

The RoPE bases follow Heo et al. unless ``base`` is given: 100 for the fixed frequencies, 10
for RoPE-Mixed's initialization. Needs only torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import StandardAttentionWithRoPE
from ..multiaxis import RoPEMixed, axis_frequencies, axis_tables

__all__ = ["DIRECTIONS", "POSITIONS", "TinyViT", "direction_accuracy", "direction_batch",
           "grid_positions", "run_experiment", "train_vit"]

POSITIONS = ("absolute", "rope-1d", "rope-axial", "rope-mixed")
DIRECTIONS = ("above", "below", "left", "right")
# (d_row, d_col) of A relative to B for each label
_STEPS = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])
MARK_A, MARK_B, FIRST_BACKGROUND = 1, 2, 3


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def grid_positions(grid: int) -> torch.Tensor:
    """(row, column) of every patch of a ``grid x grid`` image in raster order, int64
    ``(grid * grid, 2)``."""
    _positive_int("grid", grid)
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], -1)


def direction_batch(batch: int, grid: int, *, max_distance: int = 3, vocab_size: int = 8,
                    generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of the direction task.

    Returns ``(tokens, marked, labels)``: int64 ``(batch, grid * grid)`` tokens in raster order
    (``MARK_A``, ``MARK_B`` or a background token >= ``FIRST_BACKGROUND``), the index of A
    ``(batch,)``, and the label ``(batch,)``, an index into ``DIRECTIONS``: A is
    ``DIRECTIONS[label]`` of B, ``distance`` patches away (1 .. max_distance, uniform).
    """
    for name, value in (("batch", batch), ("grid", grid), ("max_distance", max_distance),
                        ("vocab_size", vocab_size)):
        _positive_int(name, value)
    if max_distance >= grid:
        raise ValueError(f"max_distance must be < grid={grid}, got {max_distance}")
    if vocab_size <= FIRST_BACKGROUND:
        raise ValueError(f"vocab_size must be > {FIRST_BACKGROUND} (two marks and background), "
                         f"got {vocab_size}")
    labels = torch.randint(4, (batch,), generator=generator)
    distance = torch.randint(1, max_distance + 1, (batch,), generator=generator)
    offset = _STEPS[labels] * distance[:, None]  # A - B
    # B anywhere that keeps A on the grid: each coordinate in [max(0, -o), grid - max(0, o))
    low, high = (-offset).clamp(min=0), grid - offset.clamp(min=0)
    b = low + (torch.rand(batch, 2, generator=generator) * (high - low)).long()
    a = b + offset
    tokens = torch.randint(FIRST_BACKGROUND, vocab_size, (batch, grid * grid),
                           generator=generator)
    rows = torch.arange(batch)
    marked = a[:, 0] * grid + a[:, 1]
    tokens[rows, marked] = MARK_A
    tokens[rows, b[:, 0] * grid + b[:, 1]] = MARK_B
    return tokens, marked, labels


class TinyViT(nn.Module):
    """A tiny ViT for the direction task; ``forward(tokens, marked, grid)`` maps
    ``(batch, grid * grid)`` tokens and A's index ``(batch,)`` to logits ``(batch, 4)``.

    Args:
        position: one of ``POSITIONS``.
        grid: the training grid (the absolute embedding's size).
        embed_dim, num_heads, num_layers, vocab_size: sizes (head_dim a multiple of 4).
        generator: random generator for RoPE-Mixed's initial directions.
        base: the RoPE base (None: 100, or 10 for ``"rope-mixed"``'s initialization).
    """

    def __init__(self, position: str, *, grid: int = 8, embed_dim: int = 16, num_heads: int = 2,
                 num_layers: int = 2, vocab_size: int = 8,
                 generator: torch.Generator | None = None, base: float | None = None
                 ) -> None:
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        for name, value in (("grid", grid), ("embed_dim", embed_dim), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("vocab_size", vocab_size)):
            _positive_int(name, value)
        head_dim = embed_dim // num_heads
        if embed_dim % num_heads or head_dim % 4:
            raise ValueError(f"embed_dim / num_heads must be a multiple of 4, got {embed_dim} / "
                             f"{num_heads}")
        if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float))
                                 or not base > 1):
            raise ValueError(f"base must be a number > 1 or None, got {base!r}")
        self.position, self.grid, self.head_dim = position, grid, head_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        if position == "absolute":
            # the scale of the token embeddings (nn.Embedding draws N(0, 1))
            self.absolute = nn.Parameter(torch.randn(1, embed_dim, grid, grid))
        elif position == "rope-mixed":
            self.mixed = nn.ModuleList(
                RoPEMixed(head_dim, num_heads, base=10.0 if base is None else float(base),
                          generator=generator) for _ in range(num_layers))
        else:
            sections = [head_dim // 2] if position == "rope-1d" else [head_dim // 4] * 2
            self.register_buffer("frequencies", axis_frequencies(
                head_dim, sections, base=100.0 if base is None else float(base),
                spectrum="per_axis"), persistent=False)
        self.attn_norms = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_layers))
        self.attns = nn.ModuleList(
            StandardAttentionWithRoPE(embed_dim, num_heads, rope=position != "absolute")
            for _ in range(num_layers))
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(embed_dim, 2 * embed_dim), nn.GELU(),
                          nn.Linear(2 * embed_dim, embed_dim)) for _ in range(num_layers))
        self.out_norm = nn.LayerNorm(embed_dim)
        self.readout = nn.Linear(embed_dim, len(DIRECTIONS))

    def absolute_table(self, grid: int) -> torch.Tensor:
        """The absolute embeddings of a ``grid x grid`` image in raster order,
        ``(1, grid * grid, embed_dim)``: the learned ones on the training grid, resampled
        (bicubic) elsewhere."""
        table = self.absolute if grid == self.grid else F.interpolate(
            self.absolute, size=(grid, grid), mode="bicubic", align_corners=False)
        return table.flatten(2).transpose(1, 2)

    def rope_tables(self, grid: int, layer: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The ``(cos, sin)`` rows of a ``grid x grid`` image in block ``layer``,
        ``(1, 1 or heads, N, d/2)`` (None for ``"absolute"``); only RoPE-Mixed's differ
        from block to block."""
        patches = grid_positions(grid)
        if self.position == "absolute":
            return None
        if self.position == "rope-mixed":
            return self.mixed[layer](patches)
        if self.position == "rope-1d":
            patches = (patches[:, 0] * grid + patches[:, 1])[:, None]  # raster order
        cos, sin = axis_tables(patches, self.frequencies)
        return cos[None, None], sin[None, None]

    def forward(self, tokens: torch.Tensor, marked: torch.Tensor, grid: int) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.shape[1] != grid * grid or marked.shape != tokens.shape[:1]:
            raise ValueError(f"tokens must be (batch, grid * grid) = (batch, {grid * grid}) and "
                             f"marked (batch,), got {tuple(tokens.shape)} and "
                             f"{tuple(marked.shape)}")
        h = self.embedding(tokens)
        if self.position == "absolute":
            h = h + self.absolute_table(grid)
        shared = None if self.position == "rope-mixed" else self.rope_tables(grid)
        for i, (attn_norm, attn, mlp_norm, mlp) in enumerate(zip(
                self.attn_norms, self.attns, self.mlp_norms, self.mlps, strict=True)):
            tables = self.rope_tables(grid, i) if self.position == "rope-mixed" else shared
            x = attn_norm(h)
            h = h + attn(x, x, x, rope_embeddings=tables)
            h = h + mlp(mlp_norm(h))
        return self.readout(self.out_norm(h[torch.arange(h.shape[0]), marked]))


def train_vit(position: str, *, steps: int = 600, batch: int = 64, lr: float = 3e-3,
              seed: int = 0, grid: int = 8, on_step: Callable[[], None] | None = None,
              **sizes) -> tuple[TinyViT, list[float]]:
    """Train a ``TinyViT`` on fresh batches of ``grid x grid`` images; returns the model (in
    eval mode) and the loss of every step. ``on_step`` is called after each step (a progress
    bar's ``update``)."""
    _positive_int("steps", steps)
    torch.manual_seed(seed)
    init = torch.Generator().manual_seed(seed)
    model = TinyViT(position, grid=grid, generator=init, **sizes)
    data = torch.Generator().manual_seed(seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps,
                                                   pct_start=0.1)
    losses = []
    for _ in range(steps):
        tokens, marked, labels = direction_batch(batch, grid, generator=data)
        loss = F.cross_entropy(model(tokens, marked, grid), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step()
    return model.eval(), losses


@torch.no_grad()
def direction_accuracy(model: TinyViT, grid: int, *, samples: int = 512, seed: int = 1234,
                       chunk: int = 128) -> float:
    """Accuracy on ``samples`` fresh ``grid x grid`` images (the same images for every model
    given the same seed)."""
    data = torch.Generator().manual_seed(seed + grid)
    correct = 0
    for start in range(0, samples, chunk):
        tokens, marked, labels = direction_batch(min(chunk, samples - start), grid,
                                                 generator=data)
        correct += (model(tokens, marked, grid).argmax(-1) == labels).sum().item()
    return correct / samples


def run_experiment(positions: Sequence[str] = POSITIONS, *, test_grids: Sequence[int] = (8, 12, 16),
                   steps: int = 600, seed: int = 0, samples: int = 512, progress: bool = True,
                   bases: Mapping[str, float] | None = None, **train) -> dict[str, dict]:
    """Train one model per position method on 8 x 8 grids and test it on each grid size.

    ``bases`` adds runs of RoPE methods with another base: ``{label: base}`` where a label
    starts with the method's name, e.g. ``{"rope-mixed, base 100": 100.0}``.
    Returns ``{label: {"accuracy": {grid: accuracy}, "losses": [...], "parameters": n}}``.
    A tqdm bar counts the training steps of all models when ``progress``.
    """
    runs = [(position, position, None) for position in positions]
    for label, base in (bases or {}).items():
        method = next((p for p in POSITIONS[1:] if label.startswith(p)), None)
        if method is None:
            raise ValueError(f"a label of bases must start with one of {POSITIONS[1:]}, got "
                             f"{label!r}")
        runs.append((label, method, base))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps * len(runs), desc="training", unit="step")
    results = {}
    try:
        for label, position, base in runs:
            if bar is not None:
                bar.set_postfix_str(label)
            model, losses = train_vit(position, steps=steps, seed=seed, base=base,
                                      on_step=None if bar is None else bar.update, **train)
            results[label] = {
                "accuracy": {g: direction_accuracy(model, g, samples=samples) for g in test_grids},
                "losses": losses,
                "parameters": sum(p.numel() for p in model.parameters()),
            }
    finally:
        if bar is not None:
            bar.close()
    return results
