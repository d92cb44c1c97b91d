"""PNG plots of a `disco compare` result (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: CI and servers have no display
import matplotlib.pyplot as plt  # noqa: E402


def write_plots(result: dict, out_dir: Path) -> list[Path]:
    """The plots of a compare result (compare.run_compare: its "reference" row is target-only decoding,
    its "anchors" the engines' own decoding, whose windows are not known)."""
    paths = [
        _windows_vs_oracle(result, out_dir / "windows_vs_oracle.png"),
        _window_histograms(result, out_dir / "window_histograms.png"),
        _speedup_bars(result, out_dir / "speedup.png"),
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


def _speedup_bars(result: dict, path: Path) -> Path:
    labels = list(result["summary"])
    s = result["summary"]
    pooled = [s[label]["speedup"] for label in labels]
    lo = [s[label]["speedup"] - s[label]["speedup_min"] for label in labels]
    hi = [s[label]["speedup_max"] - s[label]["speedup"] for label in labels]
    fig, ax = plt.subplots(figsize=(1.1 * len(labels) + 2, 3.6))
    ax.bar(
        range(len(labels)),
        pooled,
        yerr=[[max(0, x) for x in lo], [max(0, x) for x in hi]],
        capsize=4,
        color=["0.6" if label == result["reference"] else "tab:blue" for label in labels],
    )
    for i, label in enumerate(labels):  # each prompt as a dot: the spread behind the bar
        ys = [p["runs"][label]["speedup"] for p in result["prompts"]]
        ax.scatter([i] * len(ys), ys, s=8, color="k", zorder=3)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs target-only")
    ax.set_title(f"{result['n_prompts']} prompts, {result['config']['max_new_tokens']} new tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
