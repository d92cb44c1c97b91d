"""The trace format: its schema, the folder's layout and shard names, its manifest, its one writer
and its one reader. One Parquet row per draft position of a prompt's target continuation.

A trace folder is `OUT/manifest.json` beside `OUT/data/`, which holds Parquet shards
`part-rRRR-NNNNNN.parquet` (RRR: the rank that wrote it), each holding whole prompts, so
`pandas.read_parquet("OUT/data")` and `datasets.load_dataset("parquet", data_files="OUT/data/*.parquet")`
read the trace as is. A shard is written under a hidden temporary name and renamed (`ShardWriter`), so a
killed run never leaves a partial shard that reads as complete; the prompt ids inside the finished shards
are the done-list a rerun resumes from (`done_ids`); an unreadable shard is set aside under a hidden name
until its prompts are traced again. `disco collect` (collect.py) decides what goes in; this module how.

Read by the simulator, the trainer and the tests through ONE reader,
`read_traces` below (hidden files are never read: a partial or set-aside shard starts with a dot),
which refuses a prompt position that appears twice. Rows of one prompt are
stored in generation order (gen_pos = 0, 1, ...), one row for EVERY position of the target's
continuation y (greedy, or sampled: see disco/jobs/collect.py), so that any policy can be replayed: `oracle_drafted` marks the rows
the oracle loop actually drafts (it never drafts the bonus token after a window that was
accepted whole), and the window columns describe the oracle's windows.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from disco.base.errors import DiscoError
from disco.base.files import atomic_write_json, current_umask
from disco.core.features import FEATURES, TargetSignals, hidden_projection
from disco.engines.base import numeric_identity

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

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
# Traces of an engine that does not show the target's distribution (vLLM's greedy continuations: the manifest's
# collection.target_signals is false) hold NaN in the target-side columns above (target_prob, accept_prob,
# overlap, target_top1, target_entropy, target_prob_target) and in the TARGET_SIGNALS features.
HIDDEN_COLUMN = "draft_hidden"  # bytes: the draft's last hidden state here, float16 (manifest "hidden")
# gen_pos is both an id column and a feature: listed once.
COLUMNS = ID_COLUMNS + tuple(f for f in FEATURES if f not in ID_COLUMNS) + LABEL_COLUMNS + (HIDDEN_COLUMN,)
MANIFEST = "manifest.json"
# bump when the layout or the meaning of a column changes; /2 added the target-side signal columns
# and the draft's hidden state, /3 sampled traces and target_prob_target (older traces stay readable
# for the columns they have)
FORMAT = "disco-trace/3"
DATA = "data"  # the shards' subfolder: a folder of Parquet files only, so any Parquet reader takes it whole
SHARD_GLOB = "part-r*.parquet"
_SHARD_RE = re.compile(r"part-r(\d+)-(\d+)\.parquet")
_TMP_PREFIX = ".part-"  # hidden and not *.parquet: no reader globbing the folder sees a partial shard
_DAMAGED_PREFIX = (
    ".damaged-"  # an unreadable shard, set aside (hidden: trace.read_traces skips it) until its prompts are redone
)
LOCK = ".lock"  # flock'ed by the one run writing the folder (rank 0); other ranks hold .lock-rNNN
_INT_COLUMNS = ("gen_pos", "window_id", "label", "draft_token", "target_token")


@functools.cache
def schema() -> pa.Schema:
    """The Parquet schema of a shard (pyarrow is imported when a trace is written or read, not before)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(
                c,
                pa.string()
                if c in ("prompt_id", "task")
                else pa.bool_()
                if c == "oracle_drafted"
                else pa.binary()
                if c == HIDDEN_COLUMN
                else pa.int64()
                if c in _INT_COLUMNS
                else pa.float32(),
            )
            for c in COLUMNS
        ]
    )


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


def encode_hidden(states: torch.Tensor) -> list[bytes]:
    """One float16 byte string per row: the draft's hidden states, projected when wide (features.hidden_projection)."""
    states = states.float().cpu()
    proj = hidden_projection(states.shape[-1])
    if proj is not None:
        states = states @ proj
    return [row.tobytes() for row in states.to(torch.float16).numpy()]


def identity(manifest: dict) -> dict:
    """What must agree for two runs to share a folder (the device may change: resuming a CPU run
    on a GPU is fine; the dtype may not: it changes the numbers)."""
    pair = {k: v for k, v in manifest.get("pair", {}).items() if k != "device"}
    pair["engine"] = numeric_identity(pair.get("engine"))
    prompts = {k: v for k, v in manifest.get("prompts", {}).items() if k != "sources"}
    return {
        "format": manifest.get("format"),
        "pair": pair,
        "features": manifest.get("features"),
        "columns": manifest.get("columns"),
        "generation": manifest.get("generation"),
        "prompts": prompts,
    }


def differences(old: dict, new: dict) -> list[str]:
    a, b = identity(old), identity(new)
    out = []
    for key in b:
        if isinstance(b[key], dict) and isinstance(a[key], dict):
            out += [f"{key}.{k}" for k in b[key] if a[key].get(k) != b[key][k]]
        elif a[key] != b[key]:
            out.append(key)
    return out


def shard_files(out_dir: Path) -> list[Path]:
    return sorted(p for p in (out_dir / DATA).glob(SHARD_GLOB) if _SHARD_RE.fullmatch(p.name))


def read_manifest(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DiscoError(f"{path} is not valid JSON ({e.msg}): delete the folder or use --overwrite") from e


def prepare_out_dir(out_dir: Path, manifest: dict, overwrite: bool) -> None:
    """Create the folder and its manifest, or check that a rerun may continue in it.

    Only this module's files are ever deleted (shards, temporary shards, the manifest), so a
    mistyped --out with --overwrite cannot wipe anything else."""
    check_trace_out(out_dir)
    shards = shard_files(out_dir)
    old = None if overwrite else read_manifest(out_dir)
    if old is not None:
        diff = differences(old, manifest)
        if diff:
            raise DiscoError(
                f"{out_dir} holds traces of another pair, feature list, prompt list or settings "
                f"(differs in {', '.join(diff)}): choose another --out, or pass --overwrite to replace them"
            )
    elif shards and not overwrite:
        raise DiscoError(
            f"{out_dir} holds trace shards but no {MANIFEST}: choose another --out, or pass --overwrite to replace them"
        )
    temps = list((out_dir / DATA).glob(f"{_TMP_PREFIX}*"))  # leftovers of a killed run: never complete
    for path in temps + (shards + damaged_files(out_dir) if overwrite else []):
        path.unlink()
    if not overwrite:
        set_aside_damaged(out_dir)
    if old is None:
        atomic_write_json(out_dir / MANIFEST, manifest)
    (out_dir / DATA).mkdir(exist_ok=True)


def check_trace_out(out_dir: Path) -> None:
    """--out can hold traces: a new or empty folder, or one `disco collect` wrote. Anything else (a
    file, an artifact, someone's folder) is refused even with --overwrite, which only ever replaces
    traces."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DiscoError(f"--out {out_dir} is a file: give a folder for the trace")
    if not out_dir.is_dir():
        return
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        try:
            fmt = str(json.loads(manifest.read_text(encoding="utf-8")).get("format", ""))
        except (ValueError, AttributeError, OSError):
            return  # a torn manifest: read_manifest explains
        if not fmt.startswith("disco-trace"):
            raise DiscoError(
                f"--out {out_dir} holds a {MANIFEST} that is not a trace's (a classifier artifact?): "
                "choose another --out for the traces"
            )
        return
    ours = {DATA, LOCK}
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in ours and not p.name.startswith(f"{LOCK}-r"))
    if others:
        raise DiscoError(
            f"--out {out_dir} is not empty and holds no traces ({', '.join(others[:3])}"
            f"{', …' if len(others) > 3 else ''}): choose a new or empty folder for the traces"
        )


def damaged_files(out_dir: Path) -> list[Path]:
    return sorted((out_dir / DATA).glob(f"{_DAMAGED_PREFIX}*"))


def set_aside_damaged(out_dir: Path) -> list[Path]:
    """Rename shards that cannot be read (a disk error, a copy cut short) to a hidden name that no
    reader globs, so that their prompts count as not done and this run traces them again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    damaged = []
    for path in shard_files(out_dir):
        try:
            pq.read_table(path, columns=["prompt_id"])
        except (pa.ArrowException, OSError) as e:
            aside = path.with_name(f"{_DAMAGED_PREFIX}{path.name}")  # removed once every prompt is traced
            path.rename(aside)
            print(
                f"disco collect: {path} is damaged ({str(e).splitlines()[0]}); set aside as {aside.name}, "
                "its prompts are traced again",
                file=sys.stderr,
            )
            damaged.append(aside)
    return damaged


def check_prepared(out_dir: Path, manifest: dict) -> None:
    """What ranks other than 0 do after rank 0 prepared the folder: make sure it is ours."""
    old = read_manifest(out_dir)
    if old is None or differences(old, manifest):
        raise DiscoError(f"{out_dir} was not prepared for this run (see rank 0's error)")


def read_shards(out_dir: Path, columns: Sequence[str], dictionary: Sequence[str] = ()) -> pa.Table:
    """Columns of every finished shard; `dictionary`: string columns to keep dictionary-encoded
    (pandas categoricals: millions of rows of prompt ids then cost little memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = shard_files(out_dir)
    tables = [pq.read_table(f, columns=list(columns), read_dictionary=list(dictionary)) for f in files]
    if not tables:
        return schema().empty_table().select(list(columns))
    return pa.concat_tables(tables, promote_options="permissive")


def done_ids(out_dir: Path) -> set[str]:
    """The prompts of the finished shards; a prompt in two shards is refused (check_unique)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    per_file = [
        (f, pc.unique(pq.read_table(f, columns=["prompt_id"]).column("prompt_id")).to_pylist())
        for f in shard_files(out_dir)
    ]
    check_unique(out_dir, per_file)
    return {pid for _, ids in per_file for pid in ids}


def summarize(df) -> dict:
    """Rows, prompts, positive rate and oracle window lengths, overall and per task."""

    def one(g) -> dict:
        drafted = g[g["oracle_drafted"]]
        windows = drafted.groupby(["prompt_id", "window_id"], observed=True)["label"].agg(["size", "sum"])
        return {
            "prompts": int(g["prompt_id"].nunique()),
            "rows": int(len(g)),
            "positive_rate": float(g["label"].mean()) if len(g) else 0.0,
            "oracle_drafted_rows": int(len(drafted)),
            "oracle_windows": int(len(windows)),
            "mean_window": float(windows["size"].mean()) if len(windows) else 0.0,  # drafted per window
            "mean_accepted": float(windows["sum"].mean()) if len(windows) else 0.0,  # accepted per window
        }

    return {"all": one(df), "by_task": {str(t): one(g) for t, g in df.groupby("task", sort=True, observed=True)}}


def format_summary(summary: dict) -> str:
    """A Markdown table of `summarize`'s output: one line per task, then all."""
    lines = [
        "| task | prompts | rows | positive rate | oracle windows | mean window | mean accepted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for task, s in [*summary["by_task"].items(), ("all", summary["all"])]:
        lines.append(
            f"| {task} | {s['prompts']} | {s['rows']} | {s['positive_rate']:.3f} | {s['oracle_windows']} "
            f"| {s['mean_window']:.2f} | {s['mean_accepted']:.2f} |"
        )
    return "\n".join(lines)


def finalize(out_dir: Path, n_prompts: int) -> dict | None:
    """Record counts in the manifest when every prompt is traced; None while some are missing.

    Each rank calls this when it is done: only a rank that sees all prompts done writes, and
    what it writes is computed from the finished shards alone, so two ranks finishing together
    write the same file and a rank that finished early never overwrites the final counts."""
    if len(done_ids(out_dir)) < n_prompts:
        return None
    columns = ["prompt_id", "task", "label", "window_id", "oracle_drafted"]
    df = read_shards(out_dir, columns, dictionary=["prompt_id", "task"]).to_pandas()
    manifest = read_manifest(out_dir)
    manifest["status"] = {"complete": True, "prompts": n_prompts, "rows": int(len(df)), "summary": summarize(df)}
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


class ShardWriter:
    """Buffers whole prompts and writes them as one shard: temporary name, then rename."""

    def __init__(self, out_dir: Path, rank: int, shard_prompts: int, flush_s: float) -> None:
        self.out_dir, self.rank, self.shard_prompts, self.flush_s = out_dir, rank, shard_prompts, flush_s
        seqs = [int(m[2]) for p in shard_files(out_dir) if (m := _SHARD_RE.fullmatch(p.name)) and int(m[1]) == rank]
        self.next_seq = max(seqs, default=-1) + 1  # a rerun appends after the shards it finds
        self.tables: list[pa.Table] = []
        self.since = time.monotonic()

    def add(self, table: pa.Table) -> None:
        self.tables.append(table)
        if len(self.tables) >= self.shard_prompts or time.monotonic() - self.since >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.tables:
            folder = self.out_dir / DATA
            final = folder / f"part-r{self.rank:03d}-{self.next_seq:06d}.parquet"
            fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}r{self.rank:03d}-", suffix=".tmp", dir=folder)
            os.close(fd)
            try:
                pq.write_table(pa.concat_tables(self.tables), tmp)
                os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's 0600 would hide the trace from the group
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self.next_seq += 1
            self.tables = []
        self.since = time.monotonic()


# --- reading ------------------------------------------------------------------------------------


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
