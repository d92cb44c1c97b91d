"""`disco train`'s data (docs/architecture.md, "Data flow"): trace folders read into one table of rows
(`load_trace_data`), the split by prompt, never by row (`split_by_prompt`: MT-Bench prompts keep their
committed side), and the per-prompt traces the simulator replays (`traces_for`).

Rows: the trainer fits on rows with oracle_drafted True. Those are the draft steps of the
oracle's windows, i.e. exactly the decisions "is this token accepted, given every earlier
token of its window was" that any policy faces, and the only rows whose stored window
features (window_pos, window_prob_prod, prev_accepted) describe a real window; the other
rows (positions the oracle never drafts: the target's bonus token after a window that hit
its cap) carry no window of their own. The validation speedups are measured on all rows
by the simulator, which recomputes window features for each policy's own windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from disco.base.defaults import (
    DEFAULT_ABLATE,
    DEFAULT_BALANCED,
    DEFAULT_CROSS_TASK,
    DEFAULT_HEAD,
    DEFAULT_LABELS,
    DEFAULT_MODEL,
    DEFAULT_TARGET_SIGNALS,
    DEFAULT_TRAIN_SEED,
    DEFAULT_VAL_FRACTION,
)
from disco.base.errors import DiscoError
from disco.base.settings import check_setting
from disco.core.features import FEATURES, TARGET_SIGNALS
from disco.engines.base import numeric_identity
from disco.formats.mtbench import load_split, split_of_prompt
from disco.formats.trace import HIDDEN_COLUMN, read_traces
from disco.policies.policy import DEFAULT_MAX_WINDOW
from disco.training.simulate import (
    SIGNAL_COLUMNS,
    PromptTrace,
    check_columns,
    prompt_traces,
    signal_columns,
)

if TYPE_CHECKING:
    import pandas as pd


# what `disco train` is asked to do (the CLI builds it; train.train and tuning read it)
@dataclass
class TrainConfig:
    traces: list[Path]  # trace folders written by `disco collect` (or Parquet files)
    out: Path  # the artifact folder, e.g. models/NAME
    model: str = DEFAULT_MODEL  # lightgbm, logistic or mlp
    profile: Path | None = None  # cost model JSON from `disco profile`; None: CostModel.default()
    max_window: int = DEFAULT_MAX_WINDOW  # max window of the simulated policies (as at decoding time)
    val_fraction: float = DEFAULT_VAL_FRACTION  # share of prompts held out for metrics and tuning
    seed: int = DEFAULT_TRAIN_SEED  # split and model seed
    balanced: bool = DEFAULT_BALANCED  # reweight classes to equal total weight (see the module docstring)
    ablate: bool = DEFAULT_ABLATE  # also train on feature subsets and report their tuned speedups
    cross_task: bool = DEFAULT_CROSS_TASK  # also train on each task alone and test on every task
    head: bool = DEFAULT_HEAD  # also fit an acceptance head on the draft's hidden state (traces that hold it)
    progress: bool = True  # progress bars on stderr
    target_signals: bool = (
        DEFAULT_TARGET_SIGNALS  # fit on the last_* features (False: for vLLM, which cannot give them)
    )
    labels: str = (
        DEFAULT_LABELS  # fit on: "sampled" accept/reject, "soft" min(1, p/q) (sampled traces); auto: soft when sampled
    )


TRAIN_COLUMNS = (
    "prompt_id",
    "oracle_drafted",
    "label",
    "accept_prob",
    *(f for f in FEATURES if f not in TARGET_SIGNALS),
)


@dataclass
class TraceData:
    rows: pd.DataFrame  # all trace rows; column "_source" indexes `budgets`
    budgets: list[int | None]  # max_new_tokens of each source (None: unknown, y cut by the budget)
    manifests: list[dict]  # the sources' manifests, with their paths
    pair: dict  # target, draft, tokenizer_hash of the pair the traces come from
    features: list[int]  # indices of the FEATURES the traces hold (older traces lack the target signals)
    hidden: dict | None = None  # the traces' hidden-state record (features.hidden_info); None: no hidden states
    sampling: dict = field(default_factory=lambda: {"temperature": 0.0, "top_p": 1.0})  # what the traces decoded with
    # the sources without target-side signals, each as "PATH (why)": a model cannot read the TARGET_SIGNALS
    # features there (train refuses them unless --no-target-signals)
    without_signals: list[str] = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        return self.sampling["temperature"] > 0

    def hidden_matrix(self, mask: np.ndarray) -> np.ndarray:
        """(rows in mask, stored_dim) float32 draft hidden states."""
        blob = b"".join(self.rows.loc[mask, HIDDEN_COLUMN].to_numpy())
        return np.frombuffer(blob, np.float16).reshape(int(mask.sum()), -1).astype(np.float32)


def _pair_of(manifest: dict) -> dict:
    pair = manifest.get("pair") if isinstance(manifest.get("pair"), dict) else {}
    out = {k: pair.get(k) for k in ("target", "draft", "tokenizer_hash")}
    out["engine"] = numeric_identity(pair.get("engine"))  # the engine that computed the traces
    out["tokenizer_hash"] = out["tokenizer_hash"] or manifest.get("tokenizer_hash")
    return out


def load_trace_data(paths: Sequence[str | Path]) -> TraceData:
    """Read and check traces: columns, feature list, one pair, both labels present."""
    import pandas as pd

    if not paths:
        raise DiscoError("no traces given: pass --traces FOLDER (written by disco collect)")
    sources = read_traces(paths)
    manifests, pairs, hidden = [], [], []
    for src in sources:
        if src.manifest is None:
            raise DiscoError(
                f"{src.path} has no manifest.json beside its Parquet shards: the pair the traces "
                "come from is unknown (recollect them with disco collect)"
            )
        check_columns(src.rows, TRAIN_COLUMNS, "training")
        manifests.append({"path": str(src.path), **src.manifest})
        pairs.append(_pair_of(src.manifest))
        hidden.append(src.manifest.get("hidden") if HIDDEN_COLUMN in src.rows.columns else None)
    if any(p != pairs[0] for p in pairs):
        raise DiscoError(
            f"the traces come from different pairs ({', '.join(map(str, pairs))}): train one classifier per pair"
        )
    sampling = [src.sampling for src in sources]
    if any(s != sampling[0] for s in sampling):
        shown = ", ".join(f"temperature {s['temperature']:g} top-p {s['top_p']:g}" for s in sampling)
        raise DiscoError(
            f"the traces were collected under different sampling settings ({shown}): train one "
            "classifier per setting (acceptance depends on it)"
        )
    # Older traces (disco-trace/1) lack the target-side signals, and so do traces of an engine that does not show
    # the target's distribution (vLLM: NaN there): train on the features all sources have.
    without = [
        f"{src.path} ({_why_no_signals(src.manifest)})"
        for src in sources
        if not (all(c in src.rows.columns for c in TARGET_SIGNALS) and signal_columns(src.rows))
    ]
    signals = not without
    features = [i for i, f in enumerate(FEATURES) if signals or f not in TARGET_SIGNALS]
    rows = pd.concat([src.rows.assign(_source=i) for i, src in enumerate(sources)], ignore_index=True)
    for f in FEATURES:
        if f not in rows.columns:
            rows[f] = 0.0  # never read: no model is given this column
    if not signals:
        rows = rows.drop(columns=[c for c in (*SIGNAL_COLUMNS, "target_top1") if c in rows.columns])
    if any(h != hidden[0] for h in hidden) or hidden[0] is None:
        hidden = [None]  # hidden states only when every source holds the same kind
        rows = rows.drop(columns=[HIDDEN_COLUMN], errors="ignore")
    rows["prompt_id"] = rows["prompt_id"].astype(str)
    labels = rows.loc[rows["oracle_drafted"].astype(bool), "label"]
    if labels.nunique() < 2:
        which = "accepted" if labels.empty or int(labels.iloc[0]) == 1 else "rejected"
        raise DiscoError(
            f"every drafted token in the traces is {which}: a classifier needs both accepted and "
            "rejected tokens (collect more or more varied prompts)"
        )
    if rows["prompt_id"].nunique() < 2:
        raise DiscoError("the traces hold a single prompt: training needs at least two (split by prompt)")
    return TraceData(
        rows, [src.max_new_tokens for src in sources], manifests, pairs[0], features, hidden[0], sampling[0], without
    )


def _why_no_signals(manifest: dict | None) -> str:
    collection = (manifest or {}).get("collection") or {}
    if collection.get("target_signals") is False:
        engine = ((manifest or {}).get("pair") or {}).get("engine") or {}
        return f"collected on {engine.get('name', 'an engine')}, which does not show the target's probabilities"
    return "collected by an older disco"


def split_by_prompt(
    prompt_ids: Sequence[str],
    val_fraction: float,
    seed: int,
    tasks: Sequence[str] | None = None,
    fixed: Callable[[str], str | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, validation) over rows, grouped so that no prompt is on both sides and
    stratified by task: each task with two prompts or more puts round(val_fraction * its prompts)
    (at least one) into validation, so every task is measured. fixed(id): a prompt's side when a split
    file places it ("train" or "val"; MT-Bench's data/mt-bench-split.json by default), None to draw it;
    a prompt it places in "test" is refused, so training and tuning never see a test question."""
    check_setting("val_fraction", val_fraction)
    ids = np.asarray(prompt_ids)
    row_tasks = np.asarray(tasks) if tasks is not None else np.full(len(ids), "")
    fixed = fixed or _mt_bench_split()
    placed = {pid: fixed(pid) for pid in sorted(set(ids.tolist()))}
    tests = [pid for pid, side in placed.items() if side == "test"]
    if tests:
        raise DiscoError(
            f"the traces hold {len(tests)} MT-Bench test prompt(s) ({', '.join(tests[:3])}"
            f"{', …' if len(tests) > 3 else ''}), which training must never see: collect MT-Bench with "
            "mt-bench:train+val (and mt-bench-2:train+val) instead"
        )
    rng = np.random.default_rng(seed)
    val_ids = [pid for pid, side in placed.items() if side == "val"]
    drawn = np.isin(ids, [pid for pid, side in placed.items() if side is None])
    for task in sorted(set(row_tasks[drawn].tolist())):
        prompts = sorted(set(ids[drawn & (row_tasks == task)].tolist()))
        if len(prompts) >= 2:
            n_val = min(len(prompts) - 1, max(1, round(val_fraction * len(prompts))))
            val_ids += rng.permutation(prompts)[:n_val].tolist()
    val = np.isin(ids, val_ids)
    return ~val, val


def _mt_bench_split() -> Callable[[str], str | None]:
    """MT-Bench's committed split as a `fixed` of split_by_prompt (read only when an MT-Bench id is asked about)."""
    split: dict[int, tuple[str, str]] = {}

    def side(prompt_id: str) -> str | None:
        if not prompt_id.startswith("mt-bench-"):
            return None
        if not split:
            split.update(load_split())
        return split_of_prompt(prompt_id, split)

    return side


def traces_for(data: TraceData, mask: np.ndarray, expected: bool | None = None) -> list[PromptTrace]:
    """The simulator's per-prompt traces of the rows in `mask`, each with its source's budget; sampled
    traces count each window's expected acceptance (simulate.py) unless `expected` is False."""
    sub = data.rows[mask]
    expected = data.sampled if expected is None else expected
    return [
        tr
        for i, budget in enumerate(data.budgets)
        for tr in prompt_traces(sub[sub["_source"] == i], budget, data.hidden is not None, expected)
        if len(tr)
    ]


def row_tasks(rows: pd.DataFrame) -> np.ndarray:
    """The task of each row (traces without a task column count as one task, "")."""
    return rows["task"].fillna("").to_numpy(str) if "task" in rows else np.full(len(rows), "")


def task_masks(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row mask of each task."""
    tasks = row_tasks(rows)
    return {t: tasks == t for t in sorted(set(tasks.tolist()))}


def check_split(rows: pd.DataFrame, train_mask: np.ndarray, val_mask: np.ndarray) -> None:
    """Both sides of the split need drafted rows of some prompt: say how many prompts that takes."""
    drafted = rows["oracle_drafted"].to_numpy(bool)
    if (train_mask & drafted).any() and (val_mask & drafted).any():
        return
    tasks = row_tasks(rows)
    per_task = {t: len(set(rows.loc[tasks == t, "prompt_id"])) for t in sorted(set(tasks.tolist()))}
    shown = ", ".join(f"{n} of task {t or '(none)'}" for t, n in per_task.items())
    raise DiscoError(
        f"the traces hold too few prompts to split by prompt ({shown}): training needs at least 2 "
        "prompts of one task with drafted tokens (one to fit, one to validate), and more for useful "
        "metrics: collect more prompts"
    )
