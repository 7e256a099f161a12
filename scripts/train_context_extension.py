"""Train the models of chapter 10 ("Beyond the training length") and save their weights.

The one command that reruns the experiment (seed 0, one CPU thread, a few minutes)::

    .venv/bin/python scripts/train_context_extension.py

It rewrites ``scripts/context_extension_weights.pt``, the file the chapter loads. The
committed file was made by exactly that command (the defaults below: ``--seed 0 --steps 400
--finetune-steps 100 --threads 1``). Training is deterministic on the CPU with one thread:
the same command gives the same weights.

What it trains, all ``ropelib.book.toy.ToyDecoder`` models on the look-back task
(``ropelib.book.toy.lookback_batch``) at length ``TRAIN_LENGTH``:

- one model per position scheme: ``"none"``, ``"sinusoidal"``, ``"rope"``, ``"alibi"``
  (``--steps`` steps each, the same batches for all, initial weights from ``seed + index``);
- for each factor s in ``FACTORS``, two short fine-tunes of the RoPE model at length
  s * ``TRAIN_LENGTH`` (``--finetune-steps`` steps, the same number of tokens per step):
  ``"rope+pi-ft-xS"`` with position interpolation of factor s (Chen et al. 2023), and
  ``"rope-ft-xS"`` without any scaling, the control that says what the fine-tune alone buys.

The file maps each name to ``ropelib.book.toy.checkpoint_entry`` (config, float16 weights, losses,
scaling), plus ``"meta"`` with the settings.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ropelib.book.toy import POSITIONS, ToyConfig, ToyDecoder, checkpoint_entry, lookback_batch, lookback_loss

TRAIN_LENGTH = 64
FACTORS = (2, 4, 8)
BATCH = 32
LEARNING_RATE = 3e-3
FINETUNE_LEARNING_RATE = 1e-3
WEIGHTS = Path(__file__).resolve().parent / "context_extension_weights.pt"


def train(model: ToyDecoder, steps: int, length: int, *, generator: torch.Generator,
          lr: float, scaling: Mapping | None = None, progress: bool = True,
          desc: str = "") -> list[float]:
    """AdamW on the look-back loss at ``length``; returns the loss of every step.

    The batch holds ``BATCH * TRAIN_LENGTH`` tokens whatever the length (fewer, longer
    sequences for a fine-tune), so every step costs about the same.
    """
    batch = max(1, BATCH * TRAIN_LENGTH // length)
    config = model.config
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc=desc, disable=not progress, leave=False):
        data = lookback_batch(batch, length, config.vocab_size, config.max_distance,
                              generator=generator)
        loss = lookback_loss(model, *data, scaling=scaling)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run(*, seed: int = 0, steps: int = 400, finetune_steps: int = 100,
        factors: Sequence[int] = FACTORS, progress: bool = True) -> dict:
    """Train every model; returns the dict that ``main`` saves."""
    result: dict = {"meta": {"seed": seed, "steps": steps, "finetune_steps": finetune_steps,
                             "train_length": TRAIN_LENGTH, "factors": list(factors),
                             "batch": BATCH, "lr": LEARNING_RATE,
                             "finetune_lr": FINETUNE_LEARNING_RATE}}
    trained = {}
    for index, position in enumerate(POSITIONS):
        torch.manual_seed(seed + index)
        model = ToyDecoder(ToyConfig(position=position))
        data = torch.Generator().manual_seed(seed)
        losses = train(model, steps, TRAIN_LENGTH, generator=data, lr=LEARNING_RATE,
                       progress=progress, desc=position)
        trained[position] = model
        result[position] = checkpoint_entry(model, losses)
    for factor in factors:
        for name, scaling in ((f"rope+pi-ft-x{factor}", {"rope_type": "linear",
                                                          "factor": float(factor)}),
                              (f"rope-ft-x{factor}", None)):
            model = copy.deepcopy(trained["rope"])
            data = torch.Generator().manual_seed(seed + 1000 + factor)
            losses = train(model, finetune_steps, factor * TRAIN_LENGTH, generator=data,
                           lr=FINETUNE_LEARNING_RATE, scaling=scaling, progress=progress,
                           desc=name)
            result[name] = checkpoint_entry(model, losses, scaling=scaling)
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=400, help="training steps per scheme")
    parser.add_argument("--finetune-steps", type=int, default=100,
                        help="steps of each fine-tune at a longer length")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 keeps the run deterministic and the machine free)")
    parser.add_argument("--out", type=Path, default=WEIGHTS, help="where the weights go")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(seed=args.seed, steps=args.steps, finetune_steps=args.finetune_steps,
                 progress=not args.no_progress)
    torch.save(result, args.out)
    for name, entry in result.items():
        if name != "meta":
            losses = entry["losses"]
            print(f"{name:>16}: loss {losses[0]:.3f} -> {losses[-1]:.4f}")
    print(f"saved {args.out}")
    return result


if __name__ == "__main__":
    main()
