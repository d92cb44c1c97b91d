"""What a stopping rule can win on vLLM's batched draft, per concurrency (bench/results/vllm-serving.md, "What a stopping rule can win"): disco's
batched policies replayed in lockstep on vLLM traces (simulate.simulate_batched) under a load profile, against vLLM's
fixed lengths and an oracle that knows every draft token's fate. Rerun: python bench/batch_bound.py --tune-traces
TRAIN_TRACES --traces TEST_TRACES --profile bench/vllm/serve/profile-draft.json --out bench/vllm/serve/batch-bound

Rows at each concurrency (tokens per second of the profile's time, and × the best fixed length):
    target-only        no draft configured
    vllm k=K           vLLM's draft_model at a fixed length; the best of them is also what a tuned Dynamic SD
                       (one length per batch size) gets at that concurrency
    oracle, step cap   each request drafts exactly its accepted run, capped by the one cap per step that maximises
                       the step's tokens per second: no rule on this draft loop can do better
    disco …            the classifier's cost rule at each --settings (tuned on --tune-traces: the best there is
                       reported on --traces), its artifact's chosen rule, the threshold tuned alike
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from disco.core.cost import CostModel
from disco.formats.trace import read_trace_rows
from disco.policies.artifact import load_artifact
from disco.policies.batch_policy import Batch, BatchConstant, BatchThreshold, RequestState
from disco.policies.policy_registry import BatchContext, PolicySpec
from disco.training.simulate import prompt_traces, simulate_batched

ROOT = Path(__file__).resolve().parent.parent


class StepCapOracle:
    """Each request drafts its accepted run (from the trace), all capped by the step's best cap."""

    name, reads_features = "oracle", False

    def __init__(self, traces: list, load: CostModel, max_window: int) -> None:
        self.traces, self.load, self.max_window = traces, load, max_window
        self.runs: dict[int, list[int]] = {}

    def _run(self, i: int, out: int) -> int:
        labels = self.traces[i].labels
        n = 0
        while out + n < len(labels) - 1 and n < self.max_window and labels[out + n]:
            n += 1
        return n

    def drafts(self, batch: Batch) -> torch.Tensor:
        return torch.ones(len(batch.states), dtype=torch.bool)

    def start(self, batch: Batch, device: torch.device) -> None:
        runs = [self._run(int(s.request_id), int(s.stats.new_tokens)) for s in batch.states]
        n, c_d = len(runs), self.load.c_draft[min(len(runs), len(self.load.c_draft)) - 1]

        def rate(cap: int) -> float:
            ks = [min(r, cap) for r in runs]
            seconds = c_d * max(max(ks), 1) + self.load.c_step[min(sum(ks) + n, len(self.load.c_step)) - 1]
            return (sum(ks) + n) / seconds

        cap = max(range(self.max_window + 1), key=rate)
        self.window = torch.tensor([min(r, cap) for r in runs])

    def stops(self, pos: int, feats, p_chosen, live) -> torch.Tensor:
        return self.window <= pos

    def update(self, state: RequestState, drafted: int, accepted: int) -> None:
        pass


def load_traces(folder: Path, limit: int | None) -> list:
    frame = read_trace_rows(folder)
    traces = prompt_traces(frame, with_hidden=False)
    return traces[:limit] if limit else traces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, required=True, help="held-out vLLM traces (disco collect --engine vllm)")
    ap.add_argument("--tune-traces", type=Path, required=True, help="traces the settings are chosen on")
    ap.add_argument("--tune-limit", type=int, default=96, help="the first N prompts of --tune-traces")
    ap.add_argument("--profile", type=Path, default=ROOT / "bench/vllm/serve/profile-draft.json")
    ap.add_argument("--classifier", default=str(ROOT / "models/embedded-qwen2.5-coder-vllm"))
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--settings", default="0.8,1.0,1.3,1.6,2.0,2.5,3.0", help="the cost rule's settings tried")
    ap.add_argument("--thresholds", default="0.3,0.5,0.7,0.8,0.9")
    ap.add_argument("--max-window", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = ap.parse_args()

    load = CostModel.load(args.profile)
    artifact = load_artifact(args.classifier)
    test, tune = load_traces(args.traces, None), load_traces(args.tune_traces, args.tune_limit)
    K = args.max_window

    def classifier(rule: str, setting: float | None):
        spec = PolicySpec("classifier", classifier=args.classifier, classifier_rule=rule, classifier_setting=setting)
        return spec.kind.batched(spec, BatchContext(artifact.manifest["pair"]))

    def rate(traces, policy, b: int) -> float:
        return simulate_batched(traces, policy, load, b, K).tokens_per_s

    table: dict = {}
    for b in [int(c) for c in args.concurrency.split(",")]:
        rows: dict[str, dict] = {"target-only": {"tok_s": rate(test, None, b)}}
        for k in range(1, 5):
            rows[f"vllm k={k}"] = {"tok_s": rate(test, BatchConstant(k), b)}
        rows["oracle, step cap"] = {"tok_s": rate(test, StepCapOracle(test, load, K), b)}
        tuned = {s: rate(tune, classifier("cost", s), b) for s in map(float, args.settings.split(","))}
        best = max(tuned, key=tuned.get)
        rows["disco classifier, cost rule (tuned)"] = {
            "tok_s": rate(test, classifier("cost", best), b),
            "setting": best,
            "tuning": tuned,
        }
        rows["disco classifier, artifact's rule"] = {"tok_s": rate(test, classifier(None, None), b)}
        th = {t: rate(tune, BatchThreshold(t), b) for t in map(float, args.thresholds.split(","))}
        best_th = max(th, key=th.get)
        rows["disco threshold (tuned)"] = {"tok_s": rate(test, BatchThreshold(best_th), b), "setting": best_th}
        fixed = max(v["tok_s"] for name, v in rows.items() if name.startswith("vllm k="))
        for v in rows.values():
            v["x_best_fixed"] = v["tok_s"] / fixed
        table[b] = rows
        print(f"c={b}: " + " | ".join(f"{n} {v['tok_s']:.2f} ({v['x_best_fixed']:.3f})" for n, v in rows.items()))
        sys.stdout.flush()

    record = {
        "what": "lockstep simulation of vLLM's draft_model loop on traces (disco.training.simulate.simulate_batched)",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "profile": str(args.profile),
        "traces": str(args.traces),
        "tune_traces": f"{args.tune_traces} (first {args.tune_limit})",
        "table": table,
    }
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    lines = [
        f"Lockstep simulation under {args.profile.name} ({len(test)} held-out prompts' traces): tok/s of the profile's "
        "time (× the best fixed vLLM length at that concurrency; a tuned row's setting after the comma)",
        "",
        "| row | " + " | ".join(f"c={b}" for b in table) + " |",
        "|---|" + "---|" * len(table),
    ]
    for name in next(iter(table.values())):
        cells = []
        for rows in table.values():
            v = rows[name]
            cells.append(
                f"{v['tok_s']:.2f} ({v['x_best_fixed']:.2f}×)" + (f", {v['setting']:g}" if "setting" in v else "")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.json and .md")


if __name__ == "__main__":
    main()
