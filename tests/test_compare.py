"""`disco compare` on tiny models: one row per policy, outputs written, every policy lossless."""

import json

import torch

from disco.compare import HF_LABEL, TARGET_LABEL, default_entries, run_compare
from disco.decode import DecodeConfig
from disco.pair import pair_from_models
from disco.prompts import Prompt
from tiny import char_tokenizer, tiny_pair


def test_compare_tiny(tmp_path):
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer())
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(3)]
    entries = default_entries(tuned_k=3, tuned_threshold=0.2)
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=16), tmp_path, progress=False)
    labels = [TARGET_LABEL] + [e.label for e in entries]
    assert list(result["summary"]) == labels
    assert HF_LABEL in labels and "oracle" in labels and "constant k=3 (tuned)" in labels
    assert all(s["lossless"] for s in result["summary"].values()), result["summary"]
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert len(saved["prompts"]) == 3 and all(set(p["runs"]) == set(labels) for p in saved["prompts"])
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(labels)
    for name in ("windows_vs_oracle.png", "window_histograms.png", "speedup.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # the oracle never drafts more than it gets accepted plus the one mismatching token
    oracle = result["summary"]["oracle"]
    assert oracle["target_forwards_per_token"] <= result["summary"]["constant k=5"]["target_forwards_per_token"]
