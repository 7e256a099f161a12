"""Train every run of chapter 13's comparison ("Which frequencies matter") and store its results.

The one command that reruns the experiment (one CPU thread, under a minute)::

    .venv/bin/python scripts/train_layer_patterns.py

It rewrites ``scripts/layer_patterns_runs.json``, the file the chapter reads. The committed
file was made by exactly that command. Training is deterministic on the CPU with one thread:
the same command gives the same losses and accuracies.

What it trains: each model of ``ropelib.book.layer_patterns.VARIANTS`` from each seed of
``SEEDS`` (the NoPE model from the first seed only: it does not learn the task), with
``train_variant`` on chapter 10's look-back task at length ``TRAIN_LENGTH``, and measures each
run's accuracy at ``LENGTHS`` with ``accuracy_by_length``. The chapter trains the runs of the
first seed itself, with the same settings, and checks them against this file.

The file holds ``"settings"`` (every constant below) and ``"runs"``: one entry per run with
its ``variant``, ``seed``, the loss of every step and the accuracy at each length.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ropelib.book.layer_patterns import VARIANTS, accuracy_by_length, train_variant
from ropelib.book.toy import lookback_batch

SETTINGS = {
    "train_length": 64, "max_distance": 16, "vocab_size": 16,  # the task
    "layers": 4, "width": 64, "heads": 2, "window": 32,        # the models
    "steps": 80, "batch": 16, "seeds": [0, 1, 2],              # the training
    "lengths": [64, 128, 256], "tokens_per_length": 2048,      # the evaluation
    "eval_seed": 2026,
}
RUNS = Path(__file__).resolve().parent / "layer_patterns_runs.json"


def run(settings: dict, *, progress: bool = True) -> dict:
    """Train and evaluate every run with ``settings`` (the keys of ``SETTINGS``); returns the
    dict that ``main`` saves."""
    s = settings
    batches = partial(lookback_batch, s["batch"], s["train_length"], s["vocab_size"],
                      s["max_distance"])
    runs = []
    for seed in s["seeds"]:
        for name in VARIANTS:
            if name == "NoPE" and seed != s["seeds"][0]:
                continue
            bar = partial(tqdm, desc=f"{name}, seed {seed}", leave=False, disable=not progress)
            model, losses = train_variant(
                name, seed, batches, steps=s["steps"], num_layers=s["layers"],
                window=s["window"], vocab_size=s["vocab_size"],
                max_distance=s["max_distance"], embed_dim=s["width"], num_heads=s["heads"],
                progress=bar)
            accuracy = accuracy_by_length(model, s["lengths"],
                                          tokens_per_length=s["tokens_per_length"],
                                          seed=s["eval_seed"], from_position=s["max_distance"])
            runs.append({"variant": name, "seed": seed, "losses": losses,
                         "accuracy": accuracy})
    return {"settings": dict(settings), "runs": runs}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 keeps the run deterministic and the machine free)")
    parser.add_argument("--out", type=Path, default=RUNS, help="where the results go")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(SETTINGS, progress=not args.no_progress)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for entry in result["runs"]:
        accuracy = " ".join(f"{100 * a:5.1f}" for a in entry["accuracy"])
        print(f"{entry['variant']:>26}, seed {entry['seed']}: loss {entry['losses'][-1]:.3f}, "
              f"accuracy {accuracy}")
    print(f"saved {args.out}")
    return result


if __name__ == "__main__":
    main()
