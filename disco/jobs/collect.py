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

Where the continuations come from is the engine's business (engines.base.ContinuationSource): disco's own
loop decodes one prompt at a time and keeps the target's logits (`LoopContinuations`: torch, llama.cpp); an
engine that decodes by itself runs all of a rank's prompts in one batched run and hands each continuation
over as it finishes (vLLM: vllm.stages.VllmContinuations, whose greedy traces have no target side: no
target-side columns, no target signals). The collector traces and writes each continuation as it comes.

Storage: the trace format (disco/formats/trace.py: schema, shards, manifest, writer and reader). Several
processes (torchrun / accelerate launch) each take prompts i with i % world == rank and write their own
shards (disco/jobs/launch.py: ranks, the folder lock); the folder then holds the rows of a single-process run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import torch

from disco.base.crash import keep
from disco.base.defaults import DEFAULT_COLLECT_MAX_BATCH, DEFAULT_FLUSH_S, DEFAULT_SHARD_PROMPTS
from disco.base.errors import DiscoError
from disco.base.files import os_error
from disco.base.settings import check_setting
from disco.core.features import (
    FEATURES,
    TARGET_SIGNALS,
    WindowState,
    entropy,
    hidden_info,
    token_class_table,
    token_features,
)
from disco.engines.base import Continuation, ContinuationSource
from disco.formats.prompts import Prompt
from disco.formats.trace import (
    COLUMNS,
    FORMAT,
    HIDDEN_COLUMN,
    ShardWriter,
    check_prepared,
    check_trace_out,
    damaged_files,
    done_ids,
    encode_hidden,
    finalize,
    prepare_out_dir,
    schema,
    signals_at,
)
from disco.jobs.answers import answer_first_turns
from disco.jobs.launch import Dist, folder_lock, sigterm_as_interrupt
from disco.loop.decode import DecodeConfig, target_generate, warp
from disco.loop.engine_registry import ENGINE_KINDS, teacher_forced
from disco.loop.pair import Pair
from disco.policies.artifact import versions
from disco.policies.rounds import window_limit

NAN = float("nan")  # the trace columns of what a run did not see (the target side of vLLM's greedy continuations)

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
    p: torch.Tensor | None, q: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None
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
    Greedy (gen None): the draft's argmax, accepted when it equals y (p is not needed: None when unknown)."""
    if gen is None:
        x = q.argmax(-1)
        return x, x == y
    assert p is not None, "sampled labels are drawn from the target's distribution"
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
    scorer: Any = "target",
) -> pa.Table:
    """The trace rows of a prompt whose target continuation y is known: one per position of y.

    token_classes: features.token_class_table(...) on the pair's device. target_logits: the target's
    logits at every position of y, as its generation computed them (None: one teacher-forced forward of
    `scorer` computes them, by default the pair's target; scorer None too: the target's distribution is
    unknown, as vLLM's greedy continuations come: the labels need y alone, and the target-side columns and
    the TARGET_SIGNALS features are NaN). The draft's logits and last hidden states come from one
    teacher-forced draft forward over prompt + y. Both are warped as the loop warps them
    (decode.warp: softmax when greedy, temperature and top-p when sampling); under sampling the
    draft tokens and labels come from `coupled_draft`, seeded by config.seed (prompt_seed)."""
    n_prompt, n = len(prompt_ids), len(y)
    if n == 0:
        raise DiscoError(f"prompt {prompt_id!r}: the target's continuation is empty; nothing to trace")
    ids = torch.tensor([*prompt_ids, *y], dtype=torch.long, device=pair.device)
    y_ids = ids[n_prompt:]
    greedy = config.temperature == 0.0
    if target_logits is None and scorer is not None:
        target_logits, _ = teacher_forced(pair.target if isinstance(scorer, str) else scorer, ids, n_prompt)
    if target_logits is None and not greedy:
        raise DiscoError(f"prompt {prompt_id!r}: a sampled trace's labels are drawn from the target's distribution")
    draft_logits, states = teacher_forced(pair.draft, ids, n_prompt, hidden=True)
    q = warp(draft_logits, config.temperature, config.top_p)
    p = warp(target_logits, config.temperature, config.top_p) if target_logits is not None else None
    gen = None if greedy else torch.Generator(device=pair.device).manual_seed(config.seed)
    draft_tok, labels = coupled_draft(p, q, y_ids, gen)
    draft_prob = q.gather(-1, draft_tok[:, None])[:, 0]
    draft_prob_target = torch.where(
        y_ids < q.shape[-1], q.gather(-1, y_ids[:, None].clamp_max(q.shape[-1] - 1))[:, 0], 0.0
    )
    if p is not None:
        vocab = min(p.shape[-1], q.shape[-1])  # draft and target heads may be padded differently
        target_prob = p[:, :vocab].gather(-1, draft_tok[:, None].clamp_max(vocab - 1))[:, 0]
        overlap = torch.minimum(p[:, :vocab], q[:, :vocab]).sum(-1)  # 1 - TV(p, q)
        target_top1 = p.max(-1).values
        target_prob_target = p.gather(-1, y_ids[:, None])[:, 0]
        target_entropy = entropy(p)
    else:  # no target side: NaN, never a made-up number
        target_prob = overlap = target_top1 = target_prob_target = target_entropy = torch.full_like(draft_prob, NAN)

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
            state.end(k, accepted, signals_at(*signal_cols[end], accepted < k) if p is not None and end < n else None)
            j, wid = j + k, wid + 1
        else:
            fresh = WindowState(prev_accepted=state.prev_accepted, signals=state.signals)
            fresh.start()
            feats[j] = fresh.step(tok_feats[j], 1)
            j += 1

    matrix = torch.stack(feats).cpu().numpy()  # (n, len(FEATURES)) float32
    if p is None:  # the trace has no target signals (NO_SIGNALS stood in above): say so
        matrix[:, [FEATURES.index(f) for f in TARGET_SIGNALS]] = NAN
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
    return pa.table({c: columns[c] for c in COLUMNS}, schema=schema())


def target_continuation(pair: Pair, prompt_ids: Sequence[int], config: DecodeConfig) -> tuple[list[int], torch.Tensor]:
    """The target's continuation y (greedy, or sampled with config.seed) by plain target-only decoding,
    and the target's logits at every position of y from the same steps (so the trace needs no second
    target pass). Target-only: on the llama.cpp engine no speculation pays at 2 threads (bench/results/llamacpp.md), and on torch the whole
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


# --- where the continuations come from ----------------------------------------------------------------


class LoopContinuations:
    """disco's own loop as a ContinuationSource (engines.base): each prompt's target-only decode in turn,
    with the target's logits from the same steps (the engines disco drives token by token)."""

    scorer = None  # never asked: every continuation comes with the target's logits

    def __init__(self, pair: Pair) -> None:
        self.pair = pair

    def record(self) -> dict:
        return {
            "continuations": f"disco's loop on {self.pair.engine_name}: target-only, one prompt at a time",
            "features": f"the pair's draft on {self.pair.engine_name}",
            "target_distribution": "the target's logits from its own generation steps",
            "target_signals": True,
        }

    def continuations(
        self, prompts: Sequence[list[int]], configs: Sequence[DecodeConfig]
    ) -> Generator[tuple[int, Continuation], None, None]:
        for j, (ids, config) in enumerate(zip(prompts, configs)):
            y, logits = target_continuation(self.pair, ids, config)
            yield j, Continuation(y, logits)


def continuation_source(
    pair: Pair, config: DecodeConfig, max_batch: int = DEFAULT_COLLECT_MAX_BATCH
) -> ContinuationSource:
    """The engine's own source of continuations (EngineKind.continuations: a serving engine's batched run),
    else disco's loop. Its `pair` is the pair as the trace is made (the features' draft)."""
    own = ENGINE_KINDS[pair.engine_name].continuations
    return own(pair, config, max_batch) if own is not None else LoopContinuations(pair)


# --- the trace folder ---------------------------------------------------------------------------


def prompts_fingerprint(prompts: Sequence[Prompt]) -> str:
    """sha256 of the prompts (ids, tasks, texts) in order: identifies a run's prompt list."""
    h = hashlib.sha256()
    for p in prompts:  # one prompt at a time: a full news corpus never sits in memory as one string
        h.update(json.dumps([p.id, p.task, p.prompt], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()[:16]


def build_manifest(
    pair: Pair,
    prompts: Sequence[Prompt],
    config: DecodeConfig,
    chat: bool,
    sources: Sequence[str] = (),
    collection: dict | None = None,
) -> dict:
    """collection: the ContinuationSource's record (how continuations, features and the target side were made)."""
    pair_info = pair.describe()
    return {
        "format": FORMAT,
        "pair": pair_info,
        "features": list(FEATURES),
        "columns": list(COLUMNS),
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
        **({"collection": collection} if collection is not None else {}),
        "versions": versions(),
        "status": {"complete": False},
    }


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
    generate_s: float = 0.0  # time waiting for continuations y (target-only decoding, or a serving engine's run)
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
    max_batch: int = DEFAULT_COLLECT_MAX_BATCH,
) -> CollectStats:
    """Trace this rank's prompts into `out_dir`, skipping those already there; resumable at any point.
    max_batch: the most requests an engine that decodes by itself (vLLM) runs at once."""
    t0 = time.perf_counter()
    config.validate()
    if shard_prompts < 1:
        raise DiscoError(f"--shard-prompts must be at least 1 (got {shard_prompts})")
    if not prompts:
        raise DiscoError("no prompts to trace")
    if len({p.id for p in prompts}) != len(prompts):
        raise DiscoError("prompt ids must be unique: traces and resumption key on them")
    check_setting("max_batch", max_batch)
    chat = pair.has_chat_template if chat is None else chat
    out_dir = Path(out_dir)
    # mt-bench-2: the target answers each first turn (once, cached) before its second is traced; the
    # conversations then enter the manifest's prompt fingerprint, so other answers are other prompts
    source = continuation_source(pair, config, max_batch)  # first: a serving engine's batch bound holds for all
    prompts = answer_first_turns(pair, prompts, config.max_new_tokens, chat, progress and dist.rank == 0)
    pair = source.pair  # the pair as the trace is made: its draft computes the features
    encoded = encode_prompts(pair, prompts, config, chat)  # every check before the first write
    manifest = build_manifest(pair, prompts, config, chat, sources, source.record())
    check_trace_out(out_dir)
    stats = CollectStats(dist.rank, dist.world, len(prompts))
    with contextlib.ExitStack() as held:
        try:

            def prepare() -> None:  # rank 0
                held.enter_context(folder_lock(out_dir, dist))
                prepare_out_dir(out_dir, manifest, overwrite)

            def join() -> None:  # the other ranks, once rank 0 prepared the folder
                held.enter_context(folder_lock(out_dir, dist))
                check_prepared(out_dir, manifest)

            dist.main_first(prepare, join)
            dist.release()  # the ranks never synchronise again; vLLM, if it runs, takes its own group
            done = done_ids(out_dir)
            mine = dist.mine(len(prompts))
            todo = round_robin([i for i in mine if prompts[i].id not in done], [p.task for p in prompts])
            stats.prompts_mine, stats.prompts_skipped = len(mine), len(mine) - len(todo)
            if todo:
                keep(f"the finished shards are kept in {out_dir}: rerun the same command to resume")
                with sigterm_as_interrupt():  # a `kill` ends the run like Ctrl-C: the finished prompts are flushed
                    _run(source, prompts, encoded, todo, out_dir, config, dist, shard_prompts, flush_s, progress, stats)
            stats.manifest = finalize(out_dir, len(prompts))
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


def _run(
    source: ContinuationSource,
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

    pair = source.pair
    token_classes = token_class_table(pair.tokenizer, pair.vocab_size).to(pair.device)
    # each prompt's own decoding settings: its own sampling stream (prompt_seed), so a resumed or sharded run
    # draws what a single one would
    configs = [
        config if config.temperature == 0 else replace(config, seed=prompt_seed(config.seed, prompts[i].id))
        for i in todo
    ]
    stream = source.continuations([encoded[i] for i in todo], configs)  # a serving engine starts here, untimed
    writer = ShardWriter(out_dir, dist.rank, shard_prompts, flush_s)
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
    try:
        t = time.perf_counter()
        for j, cont in stream:  # as each continuation finishes (a serving engine's: in any order)
            i, t_gen = todo[j], time.perf_counter()
            table = teacher_forced_trace(
                pair,
                encoded[i],
                cont.tokens,
                configs[j],
                token_classes,
                prompts[i].id,
                prompts[i].task,
                cont.target_logits,
                source.scorer,
            )
            stats.generate_s += t_gen - t
            stats.trace_s += time.perf_counter() - t_gen
            stats.prompts_traced += 1
            stats.rows += table.num_rows
            stats.tokens += len(cont.tokens)
            writer.add(table)
            bar.update(1)
            bar.set_postfix_str(f"{stats.tokens / (stats.generate_s + stats.trace_s):.1f} tok/s", refresh=False)
            t = time.perf_counter()
        writer.flush()
    except BaseException:
        # Ctrl-C or an error: the buffered prompts are complete, keep them (a hard kill loses them,
        # which a rerun repairs; so do continuations that finished but were not traced yet). A failing
        # flush must not hide the original error.
        with contextlib.suppress(Exception):
            writer.flush()
        raise
    finally:
        stream.close()  # an engine's requests still running are dropped
        bar.close()
