"""The trace schema: one Parquet row per draft position of a prompt's target continuation.

Written by `disco collect`; read by the simulator, the trainer and the tests through ONE reader,
`read_traces` below (hidden files are never read: a partial or set-aside shard starts with a dot),
which refuses a prompt position that appears twice. Rows of one prompt are
stored in generation order (gen_pos = 0, 1, ...), one row for EVERY position of the target's
continuation y (greedy, or sampled: see disco/collect.py), so that any policy can be replayed: `oracle_drafted` marks the rows
the oracle loop actually drafts (it never drafts the bonus token after a window that was
accepted whole), and the window columns describe the oracle's windows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from disco.errors import DiscoError
from disco.features import FEATURES, TargetSignals

if TYPE_CHECKING:
    import pandas as pd

ID_COLUMNS = (
    "prompt_id",  # str: the prompt's id
    "task",  # str: the prompt's task (code, explain, write, ...)
    "gen_pos",  # int: index in the continuation y (also a feature)
    "window_id",  # int: index of the oracle window holding this position (-1: bonus position)
    "oracle_drafted",  # bool: the oracle loop drafts this position
)
LABEL_COLUMNS = (
    "label",  # int 0/1: the target accepts draft_token here (greedy: it equals y; sampled: collect.coupled_draft)
    "draft_token",  # int: the draft's token (greedy: its argmax; sampled: drawn given y, collect.coupled_draft)
    "target_token",  # int: y at this position
    "draft_prob",  # float: the draft's probability of draft_token
    "target_prob",  # float: the target's probability of draft_token
    "accept_prob",  # float: min(1, target_prob / draft_prob), Leviathan's acceptance probability (the soft label)
    "overlap",  # float: 1 - TV(target, draft) = sum_x min(p(x), q(x)), acceptance rate when sampling
    "target_top1",  # float: the target's top-1 probability (its probability of target_token under greedy)
    "target_entropy",  # float: the target's entropy here (nats); with the next two, the target-side signals
    "target_prob_target",  # float: the target's probability of target_token (= target_top1 under greedy)
    "draft_prob_target",  # float: the draft's probability of target_token
)
HIDDEN_COLUMN = "draft_hidden"  # bytes: the draft's last hidden state here, float16 (manifest "hidden")
# gen_pos is both an id column and a feature: listed once.
COLUMNS = ID_COLUMNS + tuple(f for f in FEATURES if f not in ID_COLUMNS) + LABEL_COLUMNS + (HIDDEN_COLUMN,)
MANIFEST = "manifest.json"


def signals_at(
    target_prob_target: float, target_entropy: float, draft_prob_target: float, rejected: bool
) -> TargetSignals:
    """The TargetSignals a window ending at a trace position hands to the next one: the live loop's
    features.target_signals at the target's own token (traces older than disco-trace/3 give the
    target's top-1 probability, the same number under greedy decoding)."""
    return TargetSignals(
        rejected,
        float(target_prob_target),
        float(target_entropy),
        float(target_prob_target) - float(draft_prob_target) if rejected else 0.0,
    )


# --- the one reader ----------------------------------------------------------------------------


@dataclass
class TraceSource:
    """The rows of one trace folder (or Parquet file) and the manifest beside them."""

    path: Path
    rows: pd.DataFrame
    manifest: dict | None  # manifest.json as `disco collect` writes it; None when absent

    @property
    def sampling(self) -> dict:
        """The decoding the traces were collected under: {temperature, top_p} (greedy: 0 and 1)."""
        gen = (self.manifest or {}).get("generation") or {}
        return {"temperature": float(gen.get("temperature", 0.0)), "top_p": float(gen.get("top_p", 1.0))}

    @property
    def max_new_tokens(self) -> int | None:
        """The generation budget the traces were collected with, if the manifest records it."""
        m = self.manifest or {}
        for where in (m, m.get("generation"), m.get("config"), m.get("settings")):
            if isinstance(where, dict) and isinstance(where.get("max_new_tokens"), int):
                return where["max_new_tokens"]
        return None


def trace_files(folder: Path) -> list[Path]:
    """The Parquet files of a trace folder, except hidden ones (a name or folder starting with a dot:
    collect's partial shards and the damaged shards it set aside): those of its data/ folder when it
    is one `disco collect` wrote (manifest + data/), else those at any depth."""
    if (folder / MANIFEST).is_file() and (folder / "data").is_dir():
        folder = folder / "data"
    return sorted(
        f for f in folder.rglob("*.parquet") if not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )


def _read_shard(file: Path, folder: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    import pandas as pd
    import pyarrow as pa

    try:
        return pd.read_parquet(file, columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as e:
        raise DiscoError(
            f"{file} is damaged or truncated ({str(e).splitlines()[0]}): rerun the disco collect "
            f"command that wrote {folder}; it sets the shard aside and traces its prompts again"
        ) from None


def duplicate_error(folder: Path, prompt_id: str, files: Sequence[Path]) -> DiscoError:
    """A prompt traced twice: named, with the shards holding it and the fix."""
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        return DiscoError(
            f"{folder}: prompt {prompt_id!r} is in {len(files)} shards ({names}), as when two disco "
            f"collect ran into one folder at once: delete {files[-1]} and rerun the same disco collect "
            "(it traces that shard's other prompts again)"
        )
    where = files[0] if files else folder
    return DiscoError(
        f"{folder}: prompt {prompt_id!r} has duplicated positions in {where}: delete that shard and "
        "rerun the same disco collect (it traces its prompts again)"
    )


def check_unique(folder: Path, ids_per_file: Sequence[tuple[Path, Iterable[str]]]) -> None:
    """Refuse a prompt whose rows are in two shards (resumption and training key on prompt ids)."""
    first: dict[str, Path] = {}
    for file, ids in ids_per_file:
        for pid in ids:
            if pid in first:
                raise duplicate_error(folder, pid, [first[pid], file])
            first[pid] = file


def _check_rows(folder: Path, files: Sequence[Path], frames: Sequence[pd.DataFrame]) -> None:
    """No (prompt_id, gen_pos) twice: not across shards, not within one."""
    if not frames or not {"prompt_id", "gen_pos"} <= set(frames[0].columns):
        return
    check_unique(folder, [(f, df["prompt_id"].astype(str).unique()) for f, df in zip(files, frames)])
    for f, df in zip(files, frames):
        dup = df.duplicated(["prompt_id", "gen_pos"])
        if dup.any():
            raise duplicate_error(folder, str(df.loc[dup, "prompt_id"].iloc[0]), [f])


def read_traces(paths: Iterable[str | Path], columns: Sequence[str] | None = None) -> list[TraceSource]:
    """Read trace folders (Parquet shards + manifest.json, as `disco collect` writes them) or
    single Parquet files; `columns`: only these (all when None)."""
    import pandas as pd

    sources = []
    for path in map(Path, paths):
        if path.is_dir():
            files, manifest = trace_files(path), path / MANIFEST
        elif path.is_file() and path.suffix == ".parquet":
            files, manifest = [path], path.parent / MANIFEST
        else:
            raise DiscoError(f"no trace folder or .parquet file at {path} (make traces with: disco collect)")
        if not files:
            raise DiscoError(f"{path} holds no .parquet trace shards (make traces with: disco collect)")
        meta = None
        if manifest.is_file():
            try:
                meta = json.loads(manifest.read_text())
            except ValueError as e:
                raise DiscoError(f"{manifest} is not valid JSON: {e}") from None
        frames = [_read_shard(f, path, columns) for f in files]
        _check_rows(path, files, frames)
        sources.append(TraceSource(path, pd.concat(frames, ignore_index=True), meta))
    if not sources:
        raise DiscoError("no traces given: pass --traces FOLDER (written by disco collect)")
    if all(src.rows.empty for src in sources):
        raise DiscoError("the traces hold no rows")
    return sources


def read_trace_rows(folder: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One trace folder's rows as a DataFrame sorted by (prompt_id, gen_pos): the same rows as
    `datasets.load_dataset("parquet", data_files=f"{folder}/data/*.parquet")`, in a fixed order."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise DiscoError(f"{folder} is not a trace folder (no {MANIFEST}): run `disco collect --out {folder}` first")
    df = read_traces([folder], columns)[0].rows
    if {"prompt_id", "gen_pos"} <= set(df.columns):
        df = df.sort_values(["prompt_id", "gen_pos"], kind="stable").reset_index(drop=True)
    return df
