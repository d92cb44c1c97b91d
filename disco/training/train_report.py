"""`disco train`'s report: what it measured (`TrainReport`), as the artifact's metrics.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from disco.core.cost import CostModel
from disco.training.tuning import ALL_BUT, ALL_TASKS


@dataclass
class TrainReport:
    out: Path
    setting: float  # the chosen rule's setting (manifest "setting")
    metrics: dict  # validation metrics of the saved model (calibrated)
    table: list[dict]  # policy speedup table (validation prompts, simulated)
    importance: dict[str, float]
    cost: CostModel
    ablation: list[dict] = field(default_factory=list)
    split: dict = field(default_factory=dict)
    per_task: list[dict] = field(default_factory=list)
    cross_task: list[dict] = field(default_factory=list)
    choice: dict = field(default_factory=dict)  # what `--policy classifier` runs (train.choose)
    model_metrics: dict = field(default_factory=dict)  # validation metrics of every fitted model
    decoding: str = "greedy decoding"  # what the traces decoded with, and the labels fitted
    calibration: dict = field(default_factory=dict)  # fitting.calibration_report, with "online" coefficients

    def markdown(self) -> str:
        m = self.metrics
        f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        c = self.choice
        chosen = (
            f"the classifier ({c['model']}, {c['rule']} rule, parameter {c['setting']:g})"
            if c.get("policy") == "classifier"
            else f"the tuned threshold (tau = {c.get('setting', 0):g}): no learned policy beat it on validation"
        )
        lines = [
            f"# disco classifier: {self.out}",
            "",
            f"**`--policy classifier` runs {chosen}**: simulated validation speedup {c.get('speedup', 0):.3f} vs "
            f"{c.get('tuned_threshold_speedup', 0):.3f} for the tuned threshold ({c.get('margin_vs_threshold', 1):.3f}x; "
            f"best learned policy {c.get('best_learned_speedup', 0):.3f}).",
            "",
            f"Trained and tuned for {self.decoding}.",
            "",
            *_serving_lines(c),
            f"Split by prompt: {self.split.get('train_prompts')} train / {self.split.get('val_prompts')} validation "
            f"prompts ({self.split.get('train_rows')} / {m['rows']} drafted rows); validation accept rate "
            f"{m['accept_rate']:.3f}.",
            "",
            "| model | ROC-AUC | PR-AUC (accept) | PR-AUC (reject) | log-loss (calibrated) | accuracy@0.5 |",
            "|---|---|---|---|---|---|",
        ]
        for name, mm in (self.model_metrics or {"model": m}).items():
            lines.append(
                f"| {name} | {f(mm['roc_auc'])} | {f(mm['pr_auc'])} | {f(mm['pr_auc_reject'])} | "
                f"{f(mm['log_loss'])} | {f(mm['accuracy'])} |"
            )
        lines += [
            "",
            f"Simulated speedup over target-only decoding on the validation prompts; cost model: {self.cost.source} "
            f"(c_d/c_t(1) = {self.cost.c_d / self.cost.c_t[0]:.3f}, c_t({len(self.cost.c_t)})/c_t(1) = "
            f"{self.cost.c_t[-1] / self.cost.c_t[0]:.3f}). Tuned settings are tuned on these same prompts.",
            "",
            "| policy | setting | speedup | target fwd/token | draft fwd/token | accepted/window | approx. drafts |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.table:
            lines.append(
                f"| {r['policy']} | {r['setting']} | {r['speedup']:.3f} | {r['target_forwards_per_token']:.3f}"
                f" | {r['draft_forwards_per_token']:.3f} | {r['mean_accepted']:.2f} | "
                f"{100 * r['approx_drafts']:.1f}% |"
            )
        if self.per_task:
            lines += [
                "",
                "Per task (validation prompts; every policy at the setting tuned on all of them; classifier: "
                "the best learned policy):",
                "",
                "| task | prompts | oracle | classifier | tuned threshold | tau = 0.4 | tuned constant | heuristic "
                "| classifier / tuned threshold |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['task']} | {r['prompts']} | {r['oracle']:.3f} | {r['classifier']:.3f} | {r['threshold']:.3f}"
                f" | {r['tau']:.3f} | {r['constant']:.3f} | {r['heuristic']:.3f} | "
                f"{r['classifier'] / r['threshold']:.3f} |"
                for r in self.per_task
            ]
        if self.cross_task:
            lines += [
                "",
                "Train on one task, test on another (fit on the training task's train prompts, threshold "
                "and tau tuned on its validation prompts, tested on the test task's validation prompts):",
                "",
                "| trained on | tested on | classifier t | classifier | tau | tuned threshold | ratio |",
                "|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['train_task']} | {r['test_task']} | {r['threshold']:g} | {r['classifier']:.3f} | "
                f"{r['tau']:g} | {r['tuned_threshold']:.3f} | {r['ratio']:.3f} |"
                for r in self.cross_task
            ]
            lines += adding_table(self.cross_task)
        lines += calibration_lines(self.calibration)
        if self.importance:
            lines += [
                "",
                "Permutation importance (drop in validation ROC-AUC when shuffled):",
                "",
                "| feature | importance |",
                "|---|---|",
            ]
            lines += [f"| {k} | {v:.4f} |" for k, v in self.importance.items()]
        if self.ablation:
            lines += [
                "",
                "Ablation (each variant retrained, token-rule threshold tuned by simulated speedup):",
                "",
                "| variant | inputs | ROC-AUC | threshold | speedup | vs all |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['variant']} | {r['features']} | {f(r['roc_auc'])} | {r['threshold']:g} | "
                f"{r['speedup']:.3f} | {r['delta_vs_all']:+.3f} |"
                for r in self.ablation
            ]
        return "\n".join(lines) + "\n"


def adding_table(cross: Sequence[dict]) -> list[str]:
    """Markdown lines: for each "all but FOLDER" arm of cross_task, each task's validation speedup without
    the folder and with it (the "all tasks" arm), for the classifier and the tuned threshold."""
    full = {r["test_task"]: r for r in cross if r["train_task"] == ALL_TASKS}
    lines: list[str] = []
    for arm in dict.fromkeys(r["train_task"] for r in cross if r["train_task"].startswith(ALL_BUT)):
        lines += [
            "",
            f"What adding {arm[len(ALL_BUT) :]} changes (each task's validation prompts; without it: fitted and "
            "tuned on the other folders):",
            "",
            "| task | classifier without | with | change | tuned threshold without | with | classifier / threshold with |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in cross:
            w = full.get(r["test_task"])
            if r["train_task"] == arm and w is not None:
                lines.append(
                    f"| {r['test_task']} | {r['classifier']:.3f} | {w['classifier']:.3f} | "
                    f"{w['classifier'] / r['classifier'] - 1:+.1%} | {r['tuned_threshold']:.3f} | "
                    f"{w['tuned_threshold']:.3f} | {w['ratio']:.3f} |"
                )
    return lines


def _serving_lines(choice: dict) -> list[str]:
    """On vLLM's batched draft: each learned policy's simulated throughput under load (tuning.choose_for_load)."""
    serving = choice.get("serving")
    if not serving:
        return []
    levels = serving["levels"]
    lines = [
        "Chosen for vLLM's batched draft: the learned policy whose worst ratio to vLLM's best fixed draft length "
        "over these concurrencies is the highest (lockstep simulation on the validation prompts):",
        "",
        "| policy | " + " | ".join(f"{b} request{'s' if b > 1 else ''}" for b in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for label, ratios in serving["x_best_fixed_length"].items():
        lines.append(f"| {label} | " + " | ".join(f"{ratios[b]:.3f}x" for b in levels) + " |")
    return [*lines, ""]


RELIABILITY_PNG = "reliability.png"  # the reliability diagram beside metrics.md (plots.reliability_diagram)


def calibration_lines(cal: dict) -> list[str]:
    """Markdown lines: per-position AUROC, Brier score and ECE before and after calibration of each model
    (fitting.calibration_report), disco's and vLLM's online estimator fitted on the same training prompts."""
    if not cal:
        return []
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    online = cal.get("online")
    how = (
        "cross-fitted by prompt: each half of the validation prompts scaled by the Platt fit on the other half "
        "(the shipped calibration is fitted on all of them)"
        if cal["cross_fitted"]
        else "fitted on these same rows (one validation prompt: no held-out half)"
    )
    lines = [
        "",
        f"Calibration per draft position on the validation prompts (their drafted rows at window positions 1-"
        f"{cal['positions'][-2]}): P(accept) of the token at position j given the j - 1 before it accepted. "
        f"AUROC; Brier score (mean squared error); ECE: expected calibration error over {cal['bins']} equal-width "
        "bins of the predicted probability on [0, 1] (sum of each bin's share of rows x |accept rate - mean "
        "prediction|). Before: the model as fitted on the training prompts; after: Platt scaling, " + how + ". "
        f"Reliability diagram (all positions): {RELIABILITY_PNG}.",
    ]
    if online:
        lines += [
            "",
            "vLLM online estimator: vLLM 0.32's acceptance_estimator.py (PR #52228), sigmoid(w logit(p_top1) + b_j), "
            "fitted on the training prompts' drafted rows by its own damped Newton refit repeated to its fixed "
            f"point ({online['rounds']} refits from its cold start w = 0.5, b = -0.2"
            + (
                ""
                if online["converged"]
                else "; not converged: a position with few rows moves slowly, one whose rows are all of one class has no finite fit"
            )
            + f"): w = {online['slope']:.3f}, "
            "b_j = " + ", ".join(f"{b:.2f}" for b in online["intercepts"]) + ".",
        ]
    lines += [
        "",
        "| model | position | rows | accept rate | AUROC before | AUROC after | Brier before | Brier after "
        "| ECE before | ECE after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, figs in cal["models"].items():
        for key in cal["positions"]:
            b, a = figs["before"][key], figs["after"][key]
            if not b["rows"]:  # a position no validation window reached
                continue
            lines.append(
                f"| {name} | {key} | {b['rows']} | {f(b['accept_rate'])} | {f(b['auroc'])} | {f(a['auroc'])} | "
                f"{f(b['brier'])} | {f(a['brier'])} | {f(b['ece'])} | {f(a['ece'])} |"
            )
    return lines
