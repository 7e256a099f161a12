"""scripts/train_layer_patterns.py: every run of chapter 13's comparison, each the run of its
own seed, stored as the chapter reads it."""

from __future__ import annotations

import importlib.util
import json
from functools import partial
from pathlib import Path

import torch

from ropelib.book.layer_patterns import VARIANTS, accuracy_by_length, train_variant
from ropelib.book.toy import lookback_batch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_layer_patterns.py"
TINY = {"train_length": 8, "max_distance": 2, "vocab_size": 4, "layers": 4, "width": 8,
        "heads": 1, "window": 4, "steps": 2, "batch": 2, "seeds": [3, 5],
        "lengths": [8, 16], "tokens_per_length": 32, "eval_seed": 7}


def load_script():
    spec = importlib.util.spec_from_file_location("train_layer_patterns", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_run_is_the_run_of_its_variant_and_seed():
    result = load_script().run(TINY, progress=False)
    assert result["settings"] == TINY
    keys = [(run["variant"], run["seed"]) for run in result["runs"]]
    assert sorted(keys) == sorted((name, seed) for name in VARIANTS for seed in (3, 5)
                                  if name != "NoPE" or seed == 3)
    batches = partial(lookback_batch, 2, 8, 4, 2)
    for run in result["runs"]:
        if run["variant"] not in ("p-RoPE 25%", "local RoPE + global NoPE"):
            continue  # two runs written out are enough; each takes a fresh model
        model, losses = train_variant(run["variant"], run["seed"], batches, steps=2,
                                      num_layers=4, window=4, vocab_size=4, max_distance=2,
                                      embed_dim=8, num_heads=1)
        assert run["losses"] == losses
        assert run["accuracy"] == accuracy_by_length(model, [8, 16], tokens_per_length=32,
                                                     seed=7, from_position=2)


def test_main_writes_the_file_the_chapter_reads(tmp_path, monkeypatch, capsys):
    script = load_script()
    monkeypatch.setattr(script, "SETTINGS", TINY)
    out = tmp_path / "runs.json"
    threads = torch.get_num_threads()
    try:
        result = script.main(["--out", str(out), "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    assert f"saved {out}" in capsys.readouterr().out
    assert json.loads(out.read_text()) == result
    assert result["settings"] == TINY and len(result["runs"]) == 2 * len(VARIANTS) - 1


def test_the_committed_file_was_made_with_the_scripts_settings():
    script = load_script()
    committed = json.loads(script.RUNS.read_text())
    assert committed["settings"] == script.SETTINGS
    assert len(committed["runs"]) == 3 * len(VARIANTS) - 2
