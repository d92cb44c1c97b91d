"""`disco collect`: oracle traces of draft features with accept/reject labels (docs/architecture.md, "Data flow").

Under greedy decoding every policy's accepted text is a prefix of the target's own greedy
continuation y. So per prompt: one target generation of y (which also gives the target's
logits at every position of y), then ONE teacher-forced draft forward over prompt + y give, at
every position of y, exactly the distributions the oracle loop sees there, and the draft's
last hidden states. The oracle's windows follow from the labels alone (`oracle_windows`).

Under sampling (--temperature > 0) y is a seeded sample of the target, and at each position the
drafted token and its accept/reject outcome are drawn from their distribution *given* y under
the loop's rejection sampling (`coupled_draft`), so a sampled trace is one realisation of the
live loop's randomness (see `coupled_draft` for what that does and does not approximate).

Prompts are traced round-robin over tasks, so a partial (or interrupted) run covers every task.

Storage (schema in disco/trace.py): `OUT/manifest.json` beside `OUT/data/`, which holds Parquet
shards `part-rRRR-NNNNNN.parquet`: one row per position of y, each shard holding whole prompts,
so `pandas.read_parquet("OUT/data")` and `datasets.load_dataset("parquet",
data_files="OUT/data/*.parquet")` read the trace as is. A shard is written under
a hidden temporary name and renamed, so a killed run never leaves a partial shard that reads as
complete; the prompt ids inside the finished shards are the done-list a rerun resumes from.
Several processes (torchrun / accelerate launch) each take prompts i with i % world == rank and
write their own shards; the folder then holds the rows of a single-process run.

One run writes a folder at a time (`folder_lock`: flock on OUT/.lock, so a second `disco collect`
into it says it is busy); a prompt found in two shards is refused (trace.check_unique), and an
unreadable shard is set aside under a hidden name until its prompts are traced again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

import disco
from disco.answers import answer_first_turns
from disco.crash import keep
from disco.decode import DecodeConfig, target_generate, warp
from disco.defaults import DEFAULT_FLUSH_S, DEFAULT_SHARD_PROMPTS
from disco.engines.base import numeric_identity
from disco.engines.registry import teacher_forced
from disco.errors import DiscoError
from disco.features import (
    FEATURES,
    WindowState,
    entropy,
    hidden_info,
    hidden_projection,
    token_class_table,
    token_features,
)
from disco.files import atomic_write_json, current_umask, os_error
from disco.pair import Pair
from disco.prompts import Prompt
from disco.rounds import window_limit
from disco.trace import COLUMNS, HIDDEN_COLUMN, MANIFEST, check_unique, signals_at

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

TRACE_COLUMNS: tuple[str, ...] = COLUMNS
_INT_COLUMNS = ("gen_pos", "window_id", "label", "draft_token", "target_token")
SCHEMA = pa.schema(
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
        for c in TRACE_COLUMNS
    ]
)


# --- one prompt ---------------------------------------------------------------------------------


def oracle_windows(labels: Sequence[bool], max_new_tokens: int, max_window: int) -> list[tuple[int, int]]:
    """The oracle loop's draft windows over y as (first position, tokens drafted), from the labels.

    The loop's round (rounds.py): a round at position pos may draft k_max = rounds.window_limit(...)
    tokens (0: a target-only round, nothing drafted); the oracle drafts
    until the first mismatch (drafted, rejected) or k_max; the target then commits the accepted
    tokens plus one of its own, so the next round starts after the correction token, or after the
    bonus token when the whole window was accepted. Positions in no window are never drafted."""
    windows: list[tuple[int, int]] = []
    pos = 0
    while pos < len(labels):
        k_max = window_limit(max_window, max_new_tokens, pos)
        if k_max <= 0:
            pos += 1
            continue
        k = 0
        while pos + k < len(labels):
            k += 1
            if not labels[pos + k - 1] or k == k_max:
                break
        windows.append((pos, k))
        pos += sum(bool(x) for x in labels[pos : pos + k]) + 1  # accepted tokens + the target's token
    return windows


def prompt_seed(seed: int, prompt_id: str) -> int:
    """The sampling seed of one prompt: from the run's seed and the prompt's id, so a resumed or
    sharded run draws the same numbers for a prompt whatever else it traces."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()[:7], "little")


def coupled_draft(
    p: torch.Tensor, q: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position j, the draft token x_j ~ q_j and whether the target accepts it, drawn given the
    committed token y_j ~ p_j: (draft tokens, accepted). p, q: (n, vocab) warped target / draft rows.

    Under the loop's rejection sampling (decode._rejection_sample) one position has the joint law
        x ~ q;  accept with min(1, p(x)/q(x)) and commit y = x;  else commit y ~ max(0, p - q)/Z,
    whose marginal of y is p (Leviathan et al., Thm. 1). Given y, that law is: accepted (x = y) with
    probability min(1, q(y)/p(y)), else x ~ max(0, q - p)/Z' (a token the draft over-proposes),
    which is what this draws. So where the live loop drafts at a position whose earlier window
    tokens were accepted, its context is prompt + y[:j] exactly as here, and (x_j, accepted_j, y_j)
    have the loop's joint distribution: a replay over a sampled trace is one live sampled run, in
    distribution, and the recorded min(1, p(x)/q(x)) is the expected label given x. The one
    approximation is greedy's: after a rejection the live draft goes on from x_j != y_j, while
    the trace's later rows are teacher-forced on y (simulate.py, approximation 1).
    Greedy (gen None): the draft's argmax, accepted when it equals y."""
    if gen is None:
        x = q.argmax(-1)
        return x, x == y
    vocab = min(p.shape[-1], q.shape[-1])  # heads may be padded differently; tokens past a head have prob 0
    p, q = p[:, :vocab], q[:, :vocab]
    inside = y < vocab
    yc = y.clamp_max(vocab - 1)
    p_y = p.gather(-1, yc[:, None])[:, 0]
    q_y = torch.where(inside, q.gather(-1, yc[:, None])[:, 0], 0.0)
    keep = (q_y / p_y.clamp_min(1e-30)).clamp_max(1.0)
    accepted = torch.rand(len(y), generator=gen, device=y.device) < keep
    over = (q - p).clamp_min(0.0)
    # an all-zero row only where q <= p everywhere, i.e. q == p, where a rejection has probability 0
    over = torch.where(over.sum(-1, keepdim=True) > 0, over, q)
    other = torch.multinomial(over / over.sum(-1, keepdim=True), 1, generator=gen)[:, 0]
    return torch.where(accepted, y, other), accepted


@torch.inference_mode()
def teacher_forced_trace(
    pair: Pair,
    prompt_ids: Sequence[int],
    y: Sequence[int],
    config: DecodeConfig,
    token_classes: torch.Tensor,
    prompt_id: str = "",
    task: str = "",
    target_logits: torch.Tensor | None = None,
) -> pa.Table:
    """The trace rows of a prompt whose target continuation y is known: one per position of y.

    token_classes: features.token_class_table(...) on the pair's device. target_logits: the target's
    logits at every position of y, as its generation computed them (None: one teacher-forced
    target forward computes them). The draft's logits and last hidden states come from one
    teacher-forced draft forward over prompt + y. Both are warped as the loop warps them
    (decode.warp: softmax when greedy, temperature and top-p when sampling); under sampling the
    draft tokens and labels come from `coupled_draft`, seeded by config.seed (prompt_seed)."""
    n_prompt, n = len(prompt_ids), len(y)
    if n == 0:
        raise DiscoError(f"prompt {prompt_id!r}: the target's continuation is empty; nothing to trace")
    ids = torch.tensor([*prompt_ids, *y], dtype=torch.long, device=pair.device)
    y_ids = ids[n_prompt:]
    if target_logits is None:
        target_logits, _ = teacher_forced(pair.target, ids, n_prompt)
    draft_logits, states = teacher_forced(pair.draft, ids, n_prompt, hidden=True)
    q = warp(draft_logits, config.temperature, config.top_p)
    p = warp(target_logits, config.temperature, config.top_p)
    greedy = config.temperature == 0.0
    gen = None if greedy else torch.Generator(device=pair.device).manual_seed(config.seed)
    draft_tok, labels = coupled_draft(p, q, y_ids, gen)
    vocab = min(p.shape[-1], q.shape[-1])  # draft and target heads may be padded differently
    draft_prob = q.gather(-1, draft_tok[:, None])[:, 0]
    target_prob = p[:, :vocab].gather(-1, draft_tok[:, None].clamp_max(vocab - 1))[:, 0]
    overlap = torch.minimum(p[:, :vocab], q[:, :vocab]).sum(-1)  # 1 - TV(p, q)
    target_top1 = p.max(-1).values
    target_prob_target = p.gather(-1, y_ids[:, None])[:, 0]
    target_entropy = entropy(p)
    draft_prob_target = torch.where(
        y_ids < q.shape[-1], q.gather(-1, y_ids[:, None].clamp_max(q.shape[-1] - 1))[:, 0], 0.0
    )

    # Token features: the function the live policy calls, with the context the oracle loop has
    # at this position (prompt + y before it: every earlier draft token in its window was accepted).
    tok_feats = [token_features(q[j], draft_tok[j], j, ids[: n_prompt + j], token_classes) for j in range(n)]

    # Window features over the oracle's windows, with the bookkeeping the live policy keeps.
    # A position the oracle does not draft gets the features a window starting there would have
    # (window_pos 1, product = its own p_chosen, prev_accepted and target signals as of then):
    # what a policy that does draft it would see first, the best single guess for the simulator.
    label_list = labels.tolist()
    signal_cols = torch.stack([target_prob_target, target_entropy, draft_prob_target], 1).tolist()
    feats: list[torch.Tensor | None] = [None] * n
    window_id = np.full(n, -1, dtype=np.int64)
    state = WindowState()
    starts = dict(oracle_windows(label_list, config.max_new_tokens, config.max_window))
    j = wid = 0
    while j < n:
        if j in starts:
            k = starts[j]
            state.start()
            for i in range(k):
                feats[j + i] = state.step(tok_feats[j + i], i + 1)
            window_id[j : j + k] = wid
            accepted = sum(label_list[j : j + k])  # only the last token of a window can be rejected
            end = j + accepted  # where the target's own token lands
            state.end(k, accepted, signals_at(*signal_cols[end], accepted < k) if end < n else None)
            j, wid = j + k, wid + 1
        else:
            fresh = WindowState(prev_accepted=state.prev_accepted, signals=state.signals)
            fresh.start()
            feats[j] = fresh.step(tok_feats[j], 1)
            j += 1

    matrix = torch.stack(feats).cpu().numpy()  # (n, len(FEATURES)) float32
    columns: dict[str, Any] = {
        "prompt_id": [prompt_id] * n,
        "task": [task] * n,
        "gen_pos": np.arange(n, dtype=np.int64),
        "window_id": window_id,
        "oracle_drafted": window_id >= 0,
    }
    for i, name in enumerate(FEATURES):
        if name not in columns:  # gen_pos: the id column already holds it (as an integer)
            columns[name] = matrix[:, i]
    accept_prob = (target_prob / draft_prob).clamp_max(1.0)  # Leviathan's min(1, p/q); q > 0: q chose it
    for name, value in (
        ("label", labels.long()),
        ("draft_token", draft_tok),
        ("target_token", y_ids),
        ("draft_prob", draft_prob),
        ("target_prob", target_prob),
        ("accept_prob", accept_prob),
        ("overlap", overlap),
        ("target_top1", target_top1),
        ("target_entropy", target_entropy),
        ("target_prob_target", target_prob_target),
        ("draft_prob_target", draft_prob_target),
    ):
        columns[name] = value.cpu().numpy()
    columns[HIDDEN_COLUMN] = encode_hidden(states)
    return pa.table({c: columns[c] for c in TRACE_COLUMNS}, schema=SCHEMA)


def encode_hidden(states: torch.Tensor) -> list[bytes]:
    """One float16 byte string per row: the draft's hidden states, projected when wide (features.hidden_projection)."""
    states = states.float().cpu()
    proj = hidden_projection(states.shape[-1])
    if proj is not None:
        states = states @ proj
    return [row.tobytes() for row in states.to(torch.float16).numpy()]


def target_continuation(pair: Pair, prompt_ids: Sequence[int], config: DecodeConfig) -> tuple[list[int], torch.Tensor]:
    """The target's continuation y (greedy, or sampled with config.seed) by plain target-only decoding,
    and the target's logits at every position of y from the same steps (so the trace needs no second
    target pass). Target-only: on the llama.cpp engine no speculation pays at 2 threads (bench/RESULTS.md), and on torch the whole
    collection still costs about one plain generation."""
    rows: list[torch.Tensor] = []
    y = target_generate(pair.target, list(prompt_ids), config, pair.eos_token_ids, rows).tokens
    return y, torch.cat(rows)


def trace_prompt(
    pair: Pair,
    prompt_ids: Sequence[int],
    config: DecodeConfig,
    token_classes: torch.Tensor,
    prompt_id: str = "",
    task: str = "",
) -> pa.Table:
    """The trace of one prompt: the target's continuation, then the teacher-forced rows (config.seed: the
    prompt's own seed when sampling, see prompt_seed)."""
    y, target_logits = target_continuation(pair, prompt_ids, config)
    return teacher_forced_trace(pair, prompt_ids, y, config, token_classes, prompt_id, task, target_logits)


# --- processes ----------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's share of the prompts: prompt i belongs to rank i % world."""

    rank: int = 0
    world: int = 1

    def mine(self, n: int) -> list[int]:
        return list(range(self.rank, n, self.world))

    def main_first(self, main: Callable[[], T], other: Callable[[], T] | None = None) -> T:
        """Rank 0 runs `main` while the others wait, then the others run `other` (default `main`).

        The barrier is passed even when rank 0 fails, so the others never hang: they then run
        `other` themselves and fail with their own message, or carry on."""
        if self.world == 1:
            return main()
        if self.rank == 0:
            try:
                return main()
            finally:
                torch.distributed.barrier()
        torch.distributed.barrier()
        return (other or main)()


@contextlib.contextmanager
def distributed() -> Iterator[Dist]:
    """This process's rank and world size, from RANK / WORLD_SIZE as torchrun and `accelerate launch` set them.

    With several processes: each uses GPU LOCAL_RANK (when there are GPUs), and a gloo group
    serves the barriers at start-up (model loading, preparing the folder). Nothing is
    synchronised after that, so a slow or killed rank never stalls or kills the others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield Dist()
        return
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    # Rank 0 may first prepare the embedded pair (minutes): a generous timeout for the first barrier.
    torch.distributed.init_process_group("gloo", timeout=timedelta(hours=2))
    try:
        yield Dist(rank, world)
    finally:
        torch.distributed.destroy_process_group()


# --- the trace folder ---------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out = {"disco": disco.__version__, "python": platform.python_version()}
    for name in ("torch", "transformers", "llama-cpp-python", "pyarrow", "datasets", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def prompts_fingerprint(prompts: Sequence[Prompt]) -> str:
    """sha256 of the prompts (ids, tasks, texts) in order: identifies a run's prompt list."""
    h = hashlib.sha256()
    for p in prompts:  # one prompt at a time: a full news corpus never sits in memory as one string
        h.update(json.dumps([p.id, p.task, p.prompt], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()[:16]


def build_manifest(
    pair: Pair, prompts: Sequence[Prompt], config: DecodeConfig, chat: bool, sources: Sequence[str] = ()
) -> dict:
    pair_info = pair.describe()
    return {
        "format": FORMAT,
        "pair": pair_info,
        "features": list(FEATURES),
        "columns": list(TRACE_COLUMNS),
        "hidden": hidden_info(pair.draft_hidden_size),  # HIDDEN_COLUMN: the draft's last hidden state
        "generation": {
            "max_new_tokens": config.max_new_tokens,
            "max_window": config.max_window,
            "temperature": config.temperature,
            **({"top_p": config.top_p, "seed": config.seed} if config.temperature > 0 else {}),  # greedy: as before
            "chat": chat,
            "eos_token_ids": sorted(pair.eos_token_ids),
        },
        "prompts": {"sources": list(sources), "count": len(prompts), "sha256": prompts_fingerprint(prompts)},
        "versions": _versions(),
        "status": {"complete": False},
    }


def _identity(manifest: dict) -> dict:
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


def _differences(old: dict, new: dict) -> list[str]:
    a, b = _identity(old), _identity(new)
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
        diff = _differences(old, manifest)
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


def check_out_dir(out_dir: Path, manifest: dict) -> None:
    """What ranks other than 0 do after rank 0 prepared the folder: make sure it is ours."""
    old = read_manifest(out_dir)
    if old is None or _differences(old, manifest):
        raise DiscoError(f"{out_dir} was not prepared for this run (see rank 0's error)")


def _read_shards(out_dir: Path, columns: Sequence[str], dictionary: Sequence[str] = ()) -> pa.Table:
    """Columns of every finished shard; `dictionary`: string columns to keep dictionary-encoded
    (pandas categoricals: millions of rows of prompt ids then cost little memory)."""
    files = shard_files(out_dir)
    tables = [pq.read_table(f, columns=list(columns), read_dictionary=list(dictionary)) for f in files]
    if not tables:
        return SCHEMA.empty_table().select(list(columns))
    return pa.concat_tables(tables, promote_options="permissive")


def _done_ids(out_dir: Path) -> set[str]:
    """The prompts of the finished shards; a prompt in two shards is refused (trace.check_unique)."""
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


def _finalize(out_dir: Path, n_prompts: int) -> dict | None:
    """Record counts in the manifest when every prompt is traced; None while some are missing.

    Each rank calls this when it is done: only a rank that sees all prompts done writes, and
    what it writes is computed from the finished shards alone, so two ranks finishing together
    write the same file and a rank that finished early never overwrites the final counts."""
    if len(_done_ids(out_dir)) < n_prompts:
        return None
    columns = ["prompt_id", "task", "label", "window_id", "oracle_drafted"]
    df = _read_shards(out_dir, columns, dictionary=["prompt_id", "task"]).to_pandas()
    manifest = read_manifest(out_dir)
    manifest["status"] = {"complete": True, "prompts": n_prompts, "rows": int(len(df)), "summary": summarize(df)}
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


class _ShardWriter:
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


# --- the run ------------------------------------------------------------------------------------


@dataclass
class CollectStats:
    rank: int = 0
    world: int = 1
    prompts_total: int = 0  # prompts of the whole run (every rank)
    prompts_mine: int = 0  # this rank's share
    prompts_skipped: int = 0  # of this rank's share, already traced by an earlier run
    prompts_traced: int = 0  # traced by this call
    rows: int = 0  # rows written by this call
    tokens: int = 0  # target tokens generated by this call
    generate_s: float = 0.0  # time generating y (target-only)
    trace_s: float = 0.0  # time in the teacher-forced forwards and features
    wall_s: float = 0.0
    manifest: dict | None = field(default=None, repr=False)  # the final manifest if this call completed the folder

    def summary(self) -> str:
        who = f"rank {self.rank}/{self.world}: " if self.world > 1 else ""
        overhead = f" (+{100 * self.trace_s / self.generate_s:.0f}% over generation)" if self.generate_s else ""
        return (
            f"{who}traced {self.prompts_traced} prompts ({self.prompts_skipped} already done), "
            f"{self.rows} rows, {self.tokens} tokens in {self.wall_s:.1f}s: generation {self.generate_s:.1f}s, "
            f"teacher-forced {self.trace_s:.1f}s{overhead}"
        )


def round_robin(indices: Sequence[int], tasks: Sequence[str]) -> list[int]:
    """`indices` reordered to take one prompt of each task in turn (order within a task kept)."""
    rank: dict[str, int] = {}
    keyed = []
    for i in indices:
        keyed.append((rank.get(tasks[i], 0), i))
        rank[tasks[i]] = rank.get(tasks[i], 0) + 1
    return [i for _, i in sorted(keyed)]


def encode_prompts(pair: Pair, prompts: Sequence[Prompt], config: DecodeConfig, chat: bool) -> list[list[int]]:
    """Token ids of every prompt, refusing up front any that cannot fit (so no rank fails midway)."""
    encoded = []
    for p in prompts:
        try:
            ids = pair.encode(p.prompt, chat)
        except DiscoError as e:
            raise DiscoError(f"prompt {p.id!r}: {e}") from e
        if len(ids) + config.max_new_tokens > pair.context_length:
            raise DiscoError(
                f"prompt {p.id!r} ({len(ids)} tokens) plus --max-new-tokens {config.max_new_tokens} "
                f"exceeds the models' context of {pair.context_length} tokens: drop it or lower --max-new-tokens"
            )
        encoded.append(ids)
    return encoded


def collect(
    pair: Pair,
    prompts: Sequence[Prompt],
    out_dir: str | Path,
    config: DecodeConfig,
    *,
    chat: bool | None = None,
    overwrite: bool = False,
    dist: Dist = Dist(),
    sources: Sequence[str] = (),
    shard_prompts: int = DEFAULT_SHARD_PROMPTS,
    flush_s: float = DEFAULT_FLUSH_S,
    progress: bool = True,
) -> CollectStats:
    """Trace this rank's prompts into `out_dir`, skipping those already there; resumable at any point."""
    t0 = time.perf_counter()
    config.validate()
    if shard_prompts < 1:
        raise DiscoError(f"--shard-prompts must be at least 1 (got {shard_prompts})")
    if not prompts:
        raise DiscoError("no prompts to trace")
    if len({p.id for p in prompts}) != len(prompts):
        raise DiscoError("prompt ids must be unique: traces and resumption key on them")
    chat = pair.has_chat_template if chat is None else chat
    out_dir = Path(out_dir)
    # mt-bench-2: the target answers each first turn (once, cached) before its second is traced; the
    # conversations then enter the manifest's prompt fingerprint, so other answers are other prompts
    prompts = answer_first_turns(pair, prompts, config.max_new_tokens, chat, progress and dist.rank == 0)
    encoded = encode_prompts(pair, prompts, config, chat)  # every check before the first write
    manifest = build_manifest(pair, prompts, config, chat, sources)
    check_trace_out(out_dir)
    stats = CollectStats(dist.rank, dist.world, len(prompts))
    with contextlib.ExitStack() as held:
        try:

            def prepare() -> None:  # rank 0
                held.enter_context(folder_lock(out_dir, dist))
                prepare_out_dir(out_dir, manifest, overwrite)

            def join() -> None:  # the other ranks, once rank 0 prepared the folder
                held.enter_context(folder_lock(out_dir, dist))
                check_out_dir(out_dir, manifest)

            dist.main_first(prepare, join)
            done = _done_ids(out_dir)
            mine = dist.mine(len(prompts))
            todo = round_robin([i for i in mine if prompts[i].id not in done], [p.task for p in prompts])
            stats.prompts_mine, stats.prompts_skipped = len(mine), len(mine) - len(todo)
            if todo:
                keep(f"the finished shards are kept in {out_dir}: rerun the same command to resume")
                _run(pair, prompts, encoded, todo, out_dir, config, dist, shard_prompts, flush_s, progress, stats)
            stats.manifest = _finalize(out_dir, len(prompts))
            if stats.manifest is not None:  # every prompt traced, those of set-aside shards too: drop them
                for path in damaged_files(out_dir):
                    path.unlink(missing_ok=True)
        except OSError as e:  # a full disk, a folder made read-only: the shards written so far stay
            raise os_error(
                e,
                out_dir,
                f"the {stats.prompts_skipped + stats.prompts_traced} prompts traced so far "
                "are kept there: fix it and rerun the same command to resume",
            ) from None
    stats.wall_s = time.perf_counter() - t0
    return stats


def _lock_token(dist: Dist) -> str:
    """Who holds the folder: this process, or (torchrun, accelerate launch) this launch, whose ranks
    share the launcher's run id (or parent process)."""
    if dist.world == 1:
        return f"pid {os.getpid()} on {platform.node()}"
    return f"launch {os.environ.get('TORCHELASTIC_RUN_ID') or os.getppid()} on {platform.node()}"


def _busy(out_dir: Path, holder: str) -> DiscoError:
    return DiscoError(
        f"--out {out_dir} is busy: another disco collect ({holder or 'another process'}) is writing "
        "into it; wait for it to end (then rerun to resume), or choose another --out"
    )


def _try_flock(fh) -> bool:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def folder_lock(out_dir: Path, dist: Dist = Dist()) -> Iterator[None]:
    """One run writes a trace folder at a time. Rank 0 holds an exclusive flock on OUT/.lock for the
    whole run (released if the process dies) with its launch's token inside; every other rank checks
    that token (so the ranks of a second launch stop too) and holds OUT/.lock-rNNN, which rank 0 of a
    later run must find free (a rank may still be writing after rank 0 ended)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    token = _lock_token(dist)
    with contextlib.ExitStack() as stack:
        if dist.rank == 0:
            fh = stack.enter_context(open(out_dir / LOCK, "a+"))
            if not _try_flock(fh):
                fh.seek(0)
                raise _busy(out_dir, fh.read().strip())
            for other in out_dir.glob(f"{LOCK}-r*"):
                with open(other, "a+") as oh:
                    if not _try_flock(oh):
                        raise _busy(
                            out_dir, f"rank {other.name.rsplit('-r', 1)[-1].lstrip('0') or '0'} of an earlier launch"
                        )
                    fcntl.flock(oh, fcntl.LOCK_UN)
            fh.seek(0)
            fh.truncate()
            fh.write(token + "\n")
            fh.flush()
        else:
            holder = (out_dir / LOCK).read_text().strip() if (out_dir / LOCK).is_file() else ""
            if holder != token:
                raise _busy(out_dir, holder)
            fh = stack.enter_context(open(out_dir / f"{LOCK}-r{dist.rank:03d}", "a+"))
            if not _try_flock(fh):
                raise _busy(out_dir, f"rank {dist.rank} of another launch")
        yield


def probe_lock(out_dir: Path) -> None:
    """Before the models load: refuse a folder another run holds now (collect takes the lock itself later)."""
    lock = out_dir / LOCK
    if not lock.is_file():
        return
    with open(lock, "a+") as fh:
        if not _try_flock(fh):
            fh.seek(0)
            raise _busy(out_dir, fh.read().strip())
        fcntl.flock(fh, fcntl.LOCK_UN)


def _run(
    pair: Pair,
    prompts: Sequence[Prompt],
    encoded: list[list[int]],
    todo: list[int],
    out_dir: Path,
    config: DecodeConfig,
    dist: Dist,
    shard_prompts: int,
    flush_s: float,
    progress: bool,
    stats: CollectStats,
) -> None:
    from tqdm import tqdm

    token_classes = token_class_table(pair.tokenizer, pair.vocab_size).to(pair.device)
    writer = _ShardWriter(out_dir, dist.rank, shard_prompts, flush_s)
    # One bar, on rank 0: its share is within one prompt of every other rank's.
    bar = tqdm(
        total=stats.prompts_mine,
        initial=stats.prompts_skipped,
        unit="prompt",
        desc="collect",
        disable=not progress or dist.rank != 0,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    # A `kill` (SIGTERM, as job schedulers send) ends the run like Ctrl-C: the finished prompts are flushed.
    old_term = (
        signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        for i in todo:
            t = time.perf_counter()
            mine = config if config.temperature == 0 else replace(config, seed=prompt_seed(config.seed, prompts[i].id))
            y, target_logits = target_continuation(pair, encoded[i], mine)
            t_gen = time.perf_counter()
            table = teacher_forced_trace(
                pair, encoded[i], y, mine, token_classes, prompts[i].id, prompts[i].task, target_logits
            )
            stats.generate_s += t_gen - t
            stats.trace_s += time.perf_counter() - t_gen
            stats.prompts_traced += 1
            stats.rows += table.num_rows
            stats.tokens += len(y)
            writer.add(table)
            bar.update(1)
            bar.set_postfix_str(f"{stats.tokens / (stats.generate_s + stats.trace_s):.1f} tok/s", refresh=False)
        writer.flush()
    except BaseException:
        # Ctrl-C or an error: the buffered prompts are complete, keep them (a hard kill loses them,
        # which a rerun repairs). A failing flush must not hide the original error.
        with contextlib.suppress(Exception):
            writer.flush()
        raise
    finally:
        bar.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
