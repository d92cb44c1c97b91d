"""`disco compare` on tiny models: one row per policy, outputs written, every policy lossless."""

import dataclasses
import json

import pytest
import torch
from tiny import char_tokenizer, tiny_pair

from disco.engines.torch.torch_engine import HF_LABEL
from disco.formats.prompts import Prompt
from disco.jobs.compare import TARGET_LABEL, cost_model_speedups, default_entries, run_compare
from disco.loop.decode import DecodeConfig, target_generate
from disco.loop.pair import pair_from_models


def test_compare_tiny(tmp_path):
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer())
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(3)]
    entries = default_entries(tuned_k=3, tuned_threshold=0.2, pair=pair)
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=16), tmp_path, progress=False)
    labels = [TARGET_LABEL] + [e.label for e in entries]
    assert list(result["summary"]) == labels
    assert HF_LABEL in labels and "oracle" in labels and "constant k=3 (tuned)" in labels
    assert all(s["lossless"] for s in result["summary"].values()), result["summary"]
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert len(saved["prompts"]) == 3 and all(set(p["runs"]) == set(labels) for p in saved["prompts"])
    # target-only ran again after each prompt's rows, with the same output: the run's drift, under the table
    assert all(p["target_again"]["same_output"] for p in saved["prompts"]) and saved["drift"]["drift"] >= 0
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(labels) + 2 and table[-2] == "" and table[-1].startswith("≈: within ±")
    for name in ("windows_vs_oracle.png", "window_histograms.png", "speedup.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # the oracle never drafts more than it gets accepted plus the one mismatching token
    oracle = result["summary"]["oracle"]
    assert oracle["target_forwards_per_token"] <= result["summary"]["constant k=5"]["target_forwards_per_token"]


def test_compare_shows_the_padding_of_captured_steps(tmp_path):
    """With captured steps (here eager, padded to buckets 1, 2, 4, 8), compare reports the filler tokens
    per output token, stays lossless, and records the warm-up (compile) time."""
    from disco.engines.torch.torch_engine import CapturedSteps, TorchEngine

    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    for m in (target, draft):
        TorchEngine.of(m).set_cache("static").steps = CapturedSteps(m, (1, 2, 4, 8), compiled=False)
    pair = pair_from_models(target, draft, char_tokenizer())
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(2)]
    entries = [e for e in default_entries(tuned_k=3) if e.label in ("constant k=3 (tuned)", "constant k=5")]
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=16), tmp_path, progress=False, plots=False)
    summary = result["summary"]
    assert all(s["lossless"] for s in summary.values()) and result["compile_s"] >= 0
    assert summary[TARGET_LABEL]["padded_per_token"] == 0  # one-token steps fill bucket 1 exactly
    # k = 3 verifies 4 tokens (bucket 4) but for the budget's last, shorter windows; k = 5 verifies 6: padded to 8
    assert 0 < summary["constant k=3 (tuned)"]["padded_per_token"] < summary["constant k=5"]["padded_per_token"]
    table = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("|")]
    assert "padding/tok" in table[0] and all(line.count("|") == table[0].count("|") for line in table)


def test_compare_of_anchors_only_plots_what_it_has(tmp_path):
    """--policies naming only an engine's own decoding (no windows known): no window plots, no crash."""
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer())
    entries = [e for e in default_entries(pair=pair) if e.label == HF_LABEL]
    run_compare(
        pair, [Prompt("p0", "t", "def f(x): return")], entries, DecodeConfig(max_new_tokens=8), tmp_path, progress=False
    )
    assert (tmp_path / "speedup.png").exists() and not (tmp_path / "window_histograms.png").exists()


def test_cost_model_speedups_from_counts():
    from disco.core.cost import CostModel

    cost = CostModel(c_d=0.5, c_t=(1.0, 1.5, 2.0, 2.5))
    run = lambda n, t, d, w: {"new_tokens": n, "target_forwards": t, "draft_forwards": d, "windows": w}  # noqa: E731
    result = {
        "summary": {TARGET_LABEL: {}, "p": {}, HF_LABEL: {}},
        "anchors": [HF_LABEL],
        "prompts": [
            # 6 tokens: windows 3 (c_t(4) = 2.5) and 1 (c_t(2) = 1.5), one target-only round, 4 drafts
            {"runs": {TARGET_LABEL: run(6, 6, 0, []), "p": run(6, 3, 4, [3, 1]), HF_LABEL: run(6, 2, 5, [])}},
            # 2 tokens: one window of 1 -> c_t(2) + c_d = 2.0
            {"runs": {TARGET_LABEL: run(2, 2, 0, []), "p": run(2, 1, 1, [1]), HF_LABEL: run(2, 1, 1, [])}},
        ],
    }
    out = cost_model_speedups(result, cost)
    assert out[TARGET_LABEL] == {"pooled": 1.0, "median": 1.0, "by_seed": {"None": 1.0}}
    times = [2.5 + 1.5 + 1.0 + 4 * 0.5, 1.5 + 0.5]  # 7.0 and 2.0
    assert out["p"]["pooled"] == pytest.approx(8 / sum(times))
    assert out["p"]["median"] == pytest.approx((6 / 7.0 + 2 / 2.0) / 2)
    assert out[HF_LABEL] is None
    # sampling: the same prompts under two seeds, pooled per seed
    for p, seed in zip(result["prompts"], (0, 1)):
        p["seed"] = seed
    by_seed = cost_model_speedups(result, cost)["p"]["by_seed"]
    assert by_seed == {"0": pytest.approx(6 / 7.0), "1": pytest.approx(2 / 2.0)}


def test_a_run_that_differs_is_counted_not_hidden():
    """Fast verification on llama.cpp may change a greedy token: the table says how many prompts
    differ and the JSON where each first differs, instead of "yes"."""
    from disco.jobs.compare import _first_mismatch, format_table

    assert _first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert _first_mismatch([1, 9, 3], [1, 2, 3]) == 1
    assert _first_mismatch([1, 2], [1, 2, 3]) == 2  # stopped early (an EOS the reference did not emit)
    row = {
        "speedup": 1.1,
        "speedup_median": 1.1,
        "speedup_min": 1.0,
        "speedup_max": 1.2,
        "tokens_per_s": 9.0,
        "target_forwards_per_token": None,
        "draft_forwards_per_token": None,
        "mean_accepted_window": None,
        "acceptance_rate": 0.5,
        "lossless": False,
        "mismatched_prompts": 2,
        "prompts": 9,
    }
    line = format_table({"llama-server -md": row}).splitlines()[-1]
    assert "NO (2/9 prompts differ)" in line and "| – | – |" in line


def test_compare_sampled_runs_seeds_and_reports_log_probs(tmp_path):
    """Under sampling: every prompt under each seed, no oracle, no token-by-token check; each row's
    target log-prob is that of its own output, and the table shows the spread over seeds."""
    from disco.base.errors import DiscoError
    from disco.jobs.compare import format_table, target_logprob

    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer())
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(2)]
    config = DecodeConfig(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=5)
    entries = default_entries(tuned_threshold=0.2, pair=pair, sampling=True)
    assert "oracle" not in [e.label for e in entries] and HF_LABEL in [e.label for e in entries]
    result = run_compare(pair, prompts, entries, config, tmp_path, progress=False, seeds=3)
    assert [(p["id"], p["seed"]) for p in result["prompts"]] == [(f"p{i}", s) for i in range(2) for s in (5, 6, 7)]
    base_rate = result["summary"][TARGET_LABEL]["tokens_per_s"]
    for label, s in result["summary"].items():
        assert set(s["speedup_by_seed"]) == {"5", "6", "7"} and "lossless" not in s
        assert s["target_logprob"] < 0, label
        # outputs (and their lengths) differ between runs: speedups compare time per token
        assert s["speedup"] == pytest.approx(s["tokens_per_s"] / base_rate), label
    from disco.jobs.compare import _per_token_speedup

    assert _per_token_speedup(10.0, 50, 10.0, 100) == 2.0  # same time, twice the tokens: twice as fast
    # the log-prob is the output's: target-only's second seed, decoded again
    ids = pair.encode(prompts[0].prompt)
    again = target_generate(pair.target, ids, dataclasses.replace(config, seed=6), pair.eos_token_ids).tokens
    assert result["prompts"][1]["runs"][TARGET_LABEL]["target_logprob"] == pytest.approx(
        target_logprob(pair, ids, again, config)
    )
    # different seeds give different outputs (the rows are not one run repeated)
    base = [p["runs"][TARGET_LABEL]["target_logprob"] for p in result["prompts"][:3]]
    assert len(set(base)) > 1
    table = format_table(result["summary"])
    assert "target log-prob/token" in table and "over 3 seeds" in table and "= target" not in table
    with pytest.raises(DiscoError, match="oracle policy is defined for greedy"):
        run_compare(pair, prompts, default_entries(), config, tmp_path, progress=False)
    with pytest.raises(DiscoError, match="--seeds 2: give 1, or more with --temperature > 0"):
        run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=12), tmp_path, progress=False, seeds=2)
    assert target_logprob(pair, ids, [], config) == 0.0


def _run(wall: float, target_forwards: int, draft_forwards: int, tokens: int = 10, **more) -> dict:
    """One run's record as compare writes it (greedy, lossless)."""
    return {
        "new_tokens": tokens,
        "wall_s": wall,
        "target_forwards": target_forwards,
        "draft_forwards": draft_forwards,
        "windows": [],
        "accepted_per_window": [],
        "drafted": draft_forwards,
        "accepted": 0,
        "speedup": 0.0,
        "forwards_known": True,
        "lossless": True,
        **more,
    }


def test_wall_clock_within_the_runs_drift_is_marked():
    """The run's drift is the widest gap between runs of target-only's own computation (target-only again after
    each prompt's rows; a row that never drafts: no draft forward, target-only's target forwards); a speedup
    within it is marked ≈ and one far outside is not; the line under the table says what the drift was and how
    it was measured. Anchors (another engine's loop) and rows whose forwards are not counted never measure it."""
    from disco.jobs.compare import AGAIN, format_table, summarise

    per_prompt = [
        {
            "id": f"p{i}",
            "task": "t",
            "runs": {
                TARGET_LABEL: _run(1.0, 10, 0),
                "never drafts": _run(1.04, 10, 0),  # target-only's computation, 4% slower: the drift
                "close": _run(0.98, 6, 8),  # drafts; 2% faster: within the drift
                "fast": _run(0.5, 4, 12),  # 2x: far outside
                "server": _run(0.8, 10, 0),  # an anchor: other code, whatever its counts
                "vllm row": _run(0.7, 10, 0, forwards_known=False),  # counts not known: not the same computation
            },
            AGAIN: {"wall_s": 0.99, "new_tokens": 10, "speedup": 1 / 0.99, "same_output": True},
        }
        for i in range(2)
    ]
    summary, _ = summarise(list(per_prompt[0]["runs"]), per_prompt, anchors=["server"])
    drift = summary[TARGET_LABEL]["drift"]
    assert set(drift["samples"]) == {"target again", "never drafts"}
    assert drift["drift"] == pytest.approx(1 - 1 / 1.04)
    assert drift["samples"]["target again"] == pytest.approx(1 / 0.99)
    marked = {label for label, s in summary.items() if s.get("within_drift")}
    assert marked == {"never drafts", "close"}
    lines = format_table(summary).splitlines()
    row = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and "policy" not in line}
    assert "| ≈0.96× |" in row["never drafts"] and "| ≈1.02× |" in row["close"]
    assert "| 2.00× |" in row["fast"] and "≈" not in row["fast"] + row["server"] + row[TARGET_LABEL]
    assert lines[-2] == "" and lines[-1] == (
        "≈: within ±3.8% of 1.00× (0.96×–1.04×), this run's drift (the widest gap between runs of target-only's "
        "own computation: target-only again, after each prompt's other rows, 1.01×; never drafts, a row that never "
        "drafts, 0.96×): not faster or slower than target-only beyond this run's noise; rows closer than that to "
        "each other are not told apart either."
    )
    # a record without target-only's second run (an older compare.json) and no such row: no drift, no marks
    old = [{**p, "runs": {k: p["runs"][k] for k in (TARGET_LABEL, "fast")}} for p in per_prompt]
    for p in old:
        del p[AGAIN]
    summary, _ = summarise([TARGET_LABEL, "fast"], old)
    assert "drift" not in summary[TARGET_LABEL] and "within_drift" not in summary["fast"]
    assert "≈" not in format_table(summary)


def test_compare_measures_its_drift_from_rows_that_never_draft(tmp_path):
    """A live run: a policy that never drafts (here the target policy through disco's loop) runs target-only's
    forwards and measures the drift beside target-only's second run; compare.json records it, each row's mark
    follows it, and table.md says it under the table."""
    from disco.jobs.compare import Entry
    from disco.policies.policy_registry import PolicySpec

    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer())
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(2)]
    entries = [Entry("never", PolicySpec("target")), Entry("constant k=5", PolicySpec("constant", k=5))]
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=12), tmp_path, progress=False, plots=False)
    saved = json.loads((tmp_path / "compare.json").read_text())
    drift = saved["drift"]
    assert set(drift["samples"]) == {"target again", "never"} and drift == result["drift"]
    assert drift["drift"] == pytest.approx(max(abs(v - 1) for v in drift["samples"].values()))
    for label, s in saved["summary"].items():
        if label != TARGET_LABEL:
            assert s["within_drift"] == (abs(s["speedup"] - 1) <= drift["drift"]), label
    assert saved["summary"]["never"]["within_drift"]  # the drift's own sample
    assert (tmp_path / "table.md").read_text().splitlines()[-1].startswith("≈: within ±")
