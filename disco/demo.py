"""`disco demo`: DISCO on the embedded pair, end to end, in a coffee break on a 2-core CPU.

Default: the classifier shipped in models/ against every other policy on a few held-out test
prompts per task. --full: collect traces on the shipped train prompts, train, then compare.
"""

from __future__ import annotations

from pathlib import Path

from disco.compare import default_entries, format_table, run_compare, tuned_from_artifact
from disco.decode import DecodeConfig
from disco.errors import DiscoError
from disco.pair import load_pair
from disco.prompts import DATA_DIR, load_prompts

REPO_DIR = Path(__file__).resolve().parent.parent
SHIPPED_CLASSIFIER = REPO_DIR / "models" / "embedded-qwen2.5-coder"  # made by bench/embedded_pipeline.sh
TASKS = ("code", "explain", "write")
DEMO_PER_TASK = 1  # test prompts per task in the default demo
DEMO_MAX_NEW_TOKENS = 64
FULL_TRAIN_PER_TASK = 20  # train prompts per task that --full traces


def run_demo(out: Path, full: bool = False, per_task: int = DEMO_PER_TASK,
             max_new_tokens: int = DEMO_MAX_NEW_TOKENS, train_per_task: int = FULL_TRAIN_PER_TASK,
             cpu_backend: str | None = None) -> dict:
    pair = load_pair(**({"cpu_backend": cpu_backend} if cpu_backend else {}))
    config = DecodeConfig(max_new_tokens=max_new_tokens)
    if full:
        classifier = _collect_and_train(pair, out, train_per_task, config)
    else:
        classifier = SHIPPED_CLASSIFIER
        if not (classifier / "manifest.json").exists():
            raise DiscoError(f"no shipped classifier at {classifier}: run `disco demo --full` to train one")
    tuned_k, tuned_threshold = tuned_from_artifact(classifier)
    prompts = [p for task in TASKS for p in load_prompts(DATA_DIR / f"{task}-test.jsonl", per_task)]
    entries = default_entries(str(classifier), tuned_k, tuned_threshold)
    result = run_compare(pair, prompts, entries, config, out / "compare")
    print(format_table(result["summary"]))
    lossless = all(s["lossless"] for s in result["summary"].values())
    print(f"\nEvery policy's greedy output equals target-only decoding: {'yes' if lossless else 'NO'}")
    print(f"Table, per-prompt JSON and plots: {out / 'compare'}")
    return result


def _collect_and_train(pair, out: Path, per_task: int, config: DecodeConfig) -> Path:
    from disco.collect import collect
    from disco.train import TrainConfig, train

    prompts = [p for task in TASKS for p in load_prompts(DATA_DIR / f"{task}-train.jsonl", per_task)]
    traces = out / "traces"
    collect(pair, prompts, traces, config)  # resumable: rerunning the demo continues here
    report = train(TrainConfig(traces=[traces], out=out / "classifier"))
    print(report.markdown())
    return out / "classifier"
