"""`disco demo`: DISCO on the embedded pair, end to end, in a coffee break on a 2-core CPU.

Default: the classifier shipped in models/ against every other policy on a few held-out test
prompts per task. --full: collect traces on the shipped train prompts, train, then compare.
"""

from __future__ import annotations

from pathlib import Path

from disco.base import shipped
from disco.base.defaults import DEFAULT_ENGINE, DEMO_MAX_NEW_TOKENS, DEMO_PER_TASK, FULL_TRAIN_PER_TASK
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.formats.prompts import DATA_DIR, load_prompts
from disco.jobs.compare import default_entries, format_table, run_compare, tuned_from_artifact
from disco.jobs.server_tuning import tuned_server
from disco.loop.decode import DecodeConfig
from disco.loop.pair import load_pair

# The classifiers shipped for the embedded pair, one per engine (each trained on that engine's traces:
# bench/llamacpp_pipeline.sh, bench/embedded_pipeline.sh): the checkout's models/, or the wheel's copy.
SHIPPED_CLASSIFIERS = {
    "llama.cpp": shipped.path("models/embedded-qwen2.5-coder-llamacpp"),
    "torch": shipped.path("models/embedded-qwen2.5-coder"),
}
TASKS = ("code", "explain", "write")


def run_demo(
    out: Path,
    full: bool = False,
    per_task: int = DEMO_PER_TASK,
    max_new_tokens: int = DEMO_MAX_NEW_TOKENS,
    train_per_task: int = FULL_TRAIN_PER_TASK,
    engine: str = DEFAULT_ENGINE,
    cpu_backend: str | None = None,
) -> dict:
    pair = load_pair(PairOptions(engine=engine, **({"cpu_backend": cpu_backend} if cpu_backend else {})))
    config = DecodeConfig(max_new_tokens=max_new_tokens)
    if full:
        classifier = _collect_and_train(pair, out, train_per_task, config)
    else:
        classifier = SHIPPED_CLASSIFIERS[pair.engine_name]
        if not (classifier / "manifest.json").exists():
            raise DiscoError(f"no shipped classifier at {classifier}: run `disco demo --full` to train one")
    tuned = tuned_from_artifact(classifier)
    prompts = [p for task in TASKS for p in load_prompts(DATA_DIR / f"{task}-test.jsonl", per_task)]
    entries = default_entries(
        str(classifier),
        tuned.get("k"),
        tuned.get("threshold"),
        pair=pair,
        anchor_settings={"server_tuned": tuned_server(classifier)},
        tuned=tuned,
    )
    result = run_compare(pair, prompts, entries, config, out / "compare")
    print(format_table(result["summary"]))
    exact = [label for label, s in result["summary"].items() if s["lossless"]]
    print(
        f"\nGreedy output identical to target-only decoding: {len(exact)} of {len(result['summary'])} rows"
        + (
            ""
            if len(exact) == len(result["summary"])
            else " (the others verify in batches that round differently on llama.cpp: the = target column says how often)"
        )
    )
    print(f"Table, per-prompt JSON and plots: {out / 'compare'}")
    return result


def _profile(pair, out: Path) -> Path:
    """The pair's cost model on this machine, which the classifier's threshold is tuned for. On
    llama.cpp: that of fast verification, as for the shipped classifier (with exact verification no
    window pays on a 2-core CPU: bench/results/llamacpp.md, "llama.cpp engine"): the engine's variant, where it
    has one."""
    import contextlib

    from disco.base.files import atomic_write_json
    from disco.jobs.profile import profile_pair

    variants = pair.target_engine.variants()
    with variants[0].applied(pair) if variants else contextlib.nullcontext():
        profile = profile_pair(pair, repeats=5, warmup=1)
    path = out / "profile.json"
    atomic_write_json(path, profile)
    return path


def _collect_and_train(pair, out: Path, per_task: int, config: DecodeConfig) -> Path:
    from disco.jobs.collect import collect
    from disco.training.train import TrainConfig, train

    prompts = [p for task in TASKS for p in load_prompts(DATA_DIR / f"{task}-train.jsonl", per_task)]
    traces = out / "traces"
    collect(pair, prompts, traces, config)  # resumable: rerunning the demo continues here
    report = train(TrainConfig(traces=[traces], out=out / "classifier", profile=_profile(pair, out)))
    print(report.markdown())
    return out / "classifier"
