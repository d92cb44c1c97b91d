"""PNG plots of a `disco compare` result (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: CI and servers have no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def write_plots(result: dict, out_dir: Path) -> list[Path]:
    """The plots of a compare result (compare.run_compare: its "reference" row is target-only decoding,
    its "anchors" the engines' own decoding, whose windows are not known)."""
    paths = [
        _windows_vs_oracle(result, out_dir / "windows_vs_oracle.png"),
        _window_histograms(result, out_dir / "window_histograms.png"),
        _speedup_bars(result, out_dir / "speedup.png"),
        _speedup_by_task(result, out_dir / "speedup_by_task.png"),
    ]
    return [p for p in paths if p is not None]


def _policies_with_windows(result: dict) -> list[str]:
    hidden = {result["reference"], *result["anchors"]}  # target-only and the engines' own decoding: no windows
    return [label for label in result["summary"] if label not in hidden]


def _windows_vs_oracle(result: dict, path: Path) -> Path | None:
    """Drafted tokens per iteration for one prompt, each policy against the oracle (as in the
    transformers blog figure): the prompt whose oracle varies most is the telling one."""
    labels = _policies_with_windows(result)
    if "oracle" not in labels:
        return None
    prompt = max(result["prompts"], key=lambda p: len(set(p["runs"]["oracle"]["windows"])))
    others = [label for label in labels if label != "oracle"]
    fig, axes = plt.subplots(len(others), 1, figsize=(9, 2.0 * len(others) + 0.6), sharex=True, squeeze=False)
    oracle = prompt["runs"]["oracle"]["accepted_per_window"]
    for ax, label in zip(axes[:, 0], others):
        ax.step(range(1, len(oracle) + 1), oracle, where="mid", color="0.6", label="oracle (accepted)")
        ax.step(
            range(1, len(prompt["runs"][label]["windows"]) + 1),
            prompt["runs"][label]["windows"],
            where="mid",
            label=f"{label} (drafted)",
        )
        ax.set_ylabel("tokens")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("iteration")
    fig.suptitle(f"window length per iteration, prompt {prompt['id']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _window_histograms(result: dict, path: Path) -> Path | None:
    labels = _policies_with_windows(result)
    if not labels:  # only the engines' own decoding (e.g. --policies llama-server): no windows to show
        return None
    fig, axes = plt.subplots(1, len(labels), figsize=(3.0 * len(labels), 2.8), sharey=True, squeeze=False)
    top = max([w for p in result["prompts"] for label in labels for w in p["runs"][label]["windows"]] + [1])
    for ax, label in zip(axes[0], labels):
        windows = [w for p in result["prompts"] for w in p["runs"][label]["windows"]]
        ax.hist(windows, bins=range(0, top + 2), color="tab:blue")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("drafted per window")
    axes[0, 0].set_ylabel("windows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


DISCO_COLOR, ANCHOR_COLOR = "tab:blue", "tab:orange"  # disco's loop; the engines' own speculative decoding


def _speedup_bars(result: dict, path: Path) -> Path:
    """Pooled speedup of every row as a horizontal bar, fastest on top (readable at 23 rows and more),
    the engines' own rows coloured apart, target-only as the line at 1, and the spread over prompts as
    whiskers: min–max thin, quartiles thick."""
    s, anchors = result["summary"], set(result["anchors"])
    labels = sorted((label for label in s if label != result["reference"]), key=lambda label: s[label]["speedup"])
    fig, ax = plt.subplots(figsize=(8.5, 0.3 * len(labels) + 1.5))
    ax.barh(
        range(len(labels)),
        [s[label]["speedup"] for label in labels],
        height=0.7,
        color=[ANCHOR_COLOR if label in anchors else DISCO_COLOR for label in labels],
    )
    right = 1.0
    for i, label in enumerate(labels):
        per_prompt = np.array([p["runs"][label]["speedup"] for p in result["prompts"]])
        q1, q3 = np.percentile(per_prompt, [25, 75])
        ax.hlines(i, per_prompt.min(), per_prompt.max(), color="k", lw=0.8, zorder=3)
        ax.hlines(i, q1, q3, color="k", lw=3.0, zorder=3)
        end = max(per_prompt.max(), s[label]["speedup"])
        ax.text(end, i, f" {s[label]['speedup']:.2f}×", va="center", fontsize=7)
        right = max(right, end)
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlim(0, right * 1.15)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlabel("speedup vs target-only (time per token)")
    ax.legend(
        handles=[
            Patch(color=DISCO_COLOR, label="disco's loop"),
            Patch(color=ANCHOR_COLOR, label="engine's own decoding"),
            Line2D([], [], color="k", lw=0.8, ls="--", label="target-only"),
            Line2D([], [], color="k", lw=0.8, label="min–max over prompts"),
            Line2D([], [], color="k", lw=3.0, label="quartiles over prompts"),
        ],
        loc="lower right",
        fontsize=7,
    )
    ax.set_title(f"{result['n_prompts']} prompts, {result['config']['max_new_tokens']} new tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main_rows(result: dict) -> list[str]:
    """The rows a by-task plot shows: the classifier, the fastest other disco row (the best baseline),
    the oracle (the bound), and the engines' own rows."""
    s, anchors = result["summary"], result["anchors"]
    disco = [label for label in s if label != result["reference"] and label not in anchors]
    others = [label for label in disco if label not in ("classifier", "oracle")]
    best = [max(others, key=lambda label: s[label]["speedup"])] if others else []
    return [label for label in ("classifier", *best, "oracle") if label in disco] + list(anchors)


def _speedup_by_task(result: dict, path: Path) -> Path | None:
    """Speedup by task (pooled over each task's prompts; "all": over every prompt) for the main rows."""
    by_task = result.get("summary_by_task") or {}
    if len(by_task) < 2:
        return None
    rows, tasks = main_rows(result), ["all", *by_task]
    value = lambda task, label: (result["summary"] if task == "all" else by_task[task])[label]["speedup"]  # noqa: E731
    width = 0.8 / max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(min(18.0, max(6.0, 0.16 * len(tasks) * len(rows) + 4)), 4.2))
    for j, label in enumerate(rows):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(tasks))]
        ax.bar(xs, [value(t, label) for t in tasks], width=width, label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="target-only")
    ax.axvline(0.5, color="0.8", lw=0.8)  # "all" apart from the tasks
    ax.set_xticks(range(len(tasks)), tasks, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs target-only")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars of any height stay visible
    ax.set_title(f"speedup by task, {result['n_prompts']} prompts", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reliability_diagram(
    report: dict, path: Path, where: str = "on the validation prompts", how: str | None = None
) -> Path:
    """`disco train`'s reliability diagram (fitting.calibration_report): for each model, the observed accept
    rate against the mean predicted P(accept) in each equal-width bin, all positions pooled, before and after
    Platt scaling (one panel each), with the diagonal of perfect calibration; marker area ~ the bin's rows."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    for ax, tag in zip(axes, ("before", "after")):
        ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--", label="perfectly calibrated")
        for name, curves in report["reliability"].items():
            conf, rate, count = (np.asarray(a, float) for a in curves[tag])
            full = count > 0
            ece = report["models"][name][tag]["all"]["ece"]
            line = ax.plot(conf[full], rate[full], marker="", lw=1.2, label=f"{name} (ECE {ece:.3f})")[0]
            ax.scatter(conf[full], rate[full], s=12 + 200 * count[full] / count.sum(), color=line.get_color())
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted P(accept) (bin mean)")
        ax.set_title(f"{tag} calibration", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("observed accept rate")
    # where / how: the rows shown and how "after" was fitted (a held-out report's differ from disco train's)
    how = how or ("cross-fitted by prompt" if report["cross_fitted"] else "in-sample")
    fig.suptitle(f"reliability {where} ({report['bins']} equal-width bins; after: Platt, {how})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
