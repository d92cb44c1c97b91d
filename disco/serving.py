"""disco's policy inside vLLM's speculative decoding: the side-engine proposer, and `disco compare`/`profile`/
`generate --engine vllm` (docs/architecture.md, "vLLM"). The proposer on vLLM's own batched draft is
vllm_proposer.py; compare runs both.

The side-engine proposer: vLLM loads it by name:

    speculative_config = {"method": "custom_class", "model": "disco.serving.DiscoProposer",
                          "num_speculative_tokens": MAX}

and at every step asks it for each running request's draft tokens, which vLLM then verifies in one batched
target forward. For each request the proposer keeps a draft and a policy, and runs disco's round (rounds.py, the
same code as disco's loop): draft a token, ask the policy, go on or stop; so each request gets its own number of
draft tokens. On a llama.cpp draft every request is a sequence of one batched draft (Engine.batched_draft) and
each draft position is one forward for all requests still drafting; on others each request has a session of its
own and drafts in turn. What vLLM accepted is read back
from the request's tokens at the next step (the leading run of drafts it kept) and told to the policy.

Load awareness: given a vLLM load profile (`disco profile --engine vllm`: the target's step time by the
tokens in the step), the cost rules decide with the cost model of the batch they are in (CostModel.at_load):
a request's extra draft token costs what it adds to the whole step, so under load they draft less or not at all.

The policy and pair come from the process (compare sets them: vLLM's engine core runs in-process) or, under
`vllm serve`, from the JSON file named by DISCO_VLLM_POLICY (README, "Serving with vLLM").
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from disco import vllm_proposer
from disco.answers import answer_first_turns
from disco.cost import CostModel, load_view
from disco.cpu import read_load_profile, this_machine
from disco.decode import DecodeConfig, Drafter
from disco.defaults import (
    DEFAULT_VLLM_MAX_SEQS,
    DEFAULT_VLLM_PROPOSERS,
    SIDE_DRAFT_SEQS,
    VLLM_PROFILE_BATCHES,
    VLLM_PROFILE_WINDOWS,
)
from disco.engines.base import BatchedDraft
from disco.engines.vllm import DISCO_DRAFT, ServingRow, SpecConfig
from disco.errors import DiscoError, said_in_one_line
from disco.pair import Pair
from disco.policy import StoppingPolicy, decide_now
from disco.policy_registry import PolicySpec
from disco.rounds import decide_token, draft_window, end_round, leading_run, opens_window
from disco.stats import GenResult, GenStats
from disco.vllm_proposer import read_settings

PROPOSER = "disco.serving.DiscoProposer"
ENV = vllm_proposer.ENV  # the settings JSON: {"policy": {PolicySpec fields}, "pair": {...}, "profile": ...}
GREEDY = DecodeConfig()  # the proposer drafts each request's most likely tokens (vLLM verifies, also when sampling)
_WARNED: set[str] = set()  # classifiers already told they read target signals vLLM cannot give (once each)


@dataclass
class Shared:
    """What this process's proposer drafts with (set by compare before vLLM builds it, or read from ENV)."""

    pair: Pair | None = None  # the draft engine, the tokenizer (token classes), the names the artifact checks
    policy: PolicySpec = field(default_factory=lambda: PolicySpec("threshold"))
    load: CostModel | None = None  # a vLLM load profile (c_step): the cost rules decide per batch
    proposer: DiscoProposer | None = None  # the live proposer (compare reads its counts)
    # keep finished requests' counts until asked for (in-process compare, profile, generate); under `vllm serve`
    # nothing is kept per finished request (memory stays flat however many it serves)
    keep_stats: bool = False
    # draft every request in one batched forward per position where the draft engine has a batched draft
    # (Engine.batched_draft: llama.cpp); False: one request after another on sessions of their own (the tests
    # compare the two; read at each set_policy)
    batched: bool = True


SHARED = Shared()


class _Request:
    """One running request as the proposer sees it: its draft (a session of its own, or a sequence of the
    batched draft keyed by its id) and its policy (by vLLM request id)."""

    def __init__(self, rid: str, prompt: np.ndarray, engine, policy: StoppingPolicy | None, hidden: bool) -> None:
        self.rid = rid
        self.prompt = prompt  # the tokens before the first draft (prompt + first sampled token)
        self.engine = engine  # its own draft engine (None: it drafts on the proposer's batched draft)
        self.policy = policy
        self.drafter = Drafter(engine, len(prompt) - 1, hidden, None, GREEDY, None)
        self.fed = np.empty(0, dtype=np.int64)  # the tokens its draft holds, in order
        self.proposed: list[int] = []  # the last window sent to vLLM
        self.n_before = 0  # the request's length when that window was drafted
        self.k_max = 0  # this step's most draft tokens
        self.stats = GenStats()


class DiscoProposer:
    """vLLM's custom_class proposer running a disco policy per request: on the draft engine's batched draft
    (Engine.batched_draft, llama.cpp) one forward per position for all requests (_draft_batched), else each
    request on a session of its own, one after another (_draft)."""

    @said_in_one_line()  # under `vllm serve` vLLM shows a refused setting as a traceback: the line comes first
    def __init__(self, vllm_config: Any) -> None:
        self.k_max = int(vllm_config.speculative_config.num_speculative_tokens)
        if SHARED.pair is None:
            _load_shared_from_env()
        assert SHARED.pair is not None
        self.pair = SHARED.pair
        self.requests: dict[str, _Request] = {}  # the running requests, by vLLM request id
        self.batch: BatchedDraft | None = None  # every request's draft sequence (None: a session per request)
        self.spare_engines: list[Any] = [self.pair.draft]  # draft engines not held by a request
        self._view: CostModel | None = None
        self.set_policy(SHARED.policy, SHARED.load)
        SHARED.proposer = self

    def load_model(self, *args, **kwargs) -> None:
        pass  # vLLM hands over its target; the draft is disco's own engine (loaded with the pair)

    def set_policy(self, spec: PolicySpec, load: CostModel | None = None) -> None:
        """Decide with `spec` from now on (compare's rows switch it between runs); requests start afresh."""
        if spec.kind.needs_target_tokens:
            raise DiscoError(f"the {spec.name} policy needs the target's output in advance: not in vLLM")
        self.spec, self.load = spec, load
        self._template = spec.build(pair=self.pair, max_window=self.k_max)
        if getattr(self._template, "reads_signals", False) and spec.classifier not in _WARNED:
            _WARNED.add(spec.classifier)
            # vLLM verifies without showing the proposer the target's probabilities: its last_* features
            # stay at their before-any-window values, which the model never saw after a window in training
            print(
                f"disco: {spec.classifier} reads the target's signals (last_*), which vLLM does not show its "
                "proposer: they stay at their first-window values; for vLLM train with --no-target-signals",
                file=sys.stderr,
            )
        for rid in list(self.requests):
            self._release(rid)
        if SHARED.batched != (self.batch is not None):
            self.batch = self.pair.draft.batched_draft(SIDE_DRAFT_SEQS) if SHARED.batched else None
            self.spare_engines = [] if self.batch is not None else [self.pair.draft]
        self.finished: dict[str, GenStats] = {}  # keep_stats: finished requests' counts, by request id
        self.decide_s = 0.0  # in the policy (features, model, rule): the decision-cost figure
        self.forward_s = 0.0  # in draft forwards

    def _policy(self) -> StoppingPolicy | None:
        t = self._template
        if t is None:
            return None
        return t.fresh() if hasattr(t, "fresh") else self.spec.build(pair=self.pair, max_window=self.k_max)

    def _release(self, rid: str) -> None:
        """A request vLLM no longer holds (finished or aborted): its draft sequence or engine is free again."""
        r = self.requests.pop(rid)
        if SHARED.keep_stats:
            self.finished[rid] = r.stats
        if self.batch is not None:
            self.batch.remove(rid)
        else:
            self.spare_engines.append(r.engine)

    def stats_for(self, prompt: list[int], request_id: str) -> GenStats | None:
        """The counts of the request vLLM's LLM returned as `request_id` (its engine adds a suffix), once."""
        for rid in [*self.finished, *self.requests]:
            if rid == request_id or rid.startswith(f"{request_id}-"):
                if rid in self.requests:  # finished, not yet seen gone by propose(): its draft is free now
                    stats = self.requests[rid].stats
                    self._release(rid)
                    self.finished.pop(rid, None)
                    return stats
                return self.finished.pop(rid)
        return None

    def _request(self, rid: str, ctx: np.ndarray) -> _Request:
        """Request `rid`'s state, made at its first step (its own draft sequence or session, and policy)."""
        r = self.requests.get(rid)
        if r is None:
            engine = None
            if self.batch is None:
                engine = self.spare_engines.pop() if self.spare_engines else self.pair.draft.spare()
            policy = self._policy()
            r = _Request(rid, ctx.copy(), engine, policy, bool(policy is not None and policy.needs_hidden))
            self.requests[rid] = r
        return r

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Each running request's draft tokens for this step (vLLM 0.32's custom_class interface: row i's
        tokens so far are token_ids_cpu[i, :num_tokens_no_spec[i]], this step's sampled ones included; its
        request id comes from the runner, vllm_proposer.batch_requests)."""
        ids, alive = vllm_proposer.batch_requests(len(sampled_token_ids))
        for gone in [rid for rid in self.requests if rid not in alive]:
            self._release(gone)
        self._view = load_view(self.load, sum(1 for s in sampled_token_ids if s), self.k_max)
        out: list[list[int]] = [[] for _ in sampled_token_ids]  # a request still in its prompt: nothing to draft
        work: list[tuple[int, _Request, np.ndarray]] = []
        for i, (rid, sampled, n) in enumerate(zip(ids, sampled_token_ids, num_tokens_no_spec)):
            if sampled:
                ctx = token_ids_cpu[i, : int(n)]
                r = self._request(rid, ctx)
                self._begin(r, ctx)
                work.append((i, r, ctx))
        t0, forward_s = time.perf_counter(), 0.0
        if self.batch is not None:
            forward_s = self._draft_batched([r for _, r, _ in work])
        else:
            forward_s = sum(self._draft(r) for _, r, _ in work)
        self.decide_s += time.perf_counter() - t0 - forward_s
        self.forward_s += forward_s
        for i, r, ctx in work:
            window = [int(t) for t in r.drafter.tokens]
            if window:  # the draft now holds ctx and every drafted token but the last
                r.fed = np.concatenate([ctx.astype(np.int64), np.asarray(window[:-1], dtype=np.int64)])
            r.proposed, r.n_before = window, len(ctx)
            out[i] = window
        return out

    def _begin(self, r: _Request, ctx: np.ndarray) -> None:
        """A request's round up to its drafting: (5) tell its policy how much of the last window vLLM kept, roll
        its draft back to the tokens vLLM kept, set this step's cost view and window limit."""
        if r.proposed:
            kept = ctx[r.n_before : r.n_before + len(r.proposed)]
            accepted = leading_run(torch.from_numpy(kept == np.asarray(r.proposed[: len(kept)])))
            end_round(r.policy, r.stats, len(r.proposed), accepted, None)  # vLLM keeps the target's logits
            r.proposed = []
        if self._view is not None and isinstance(getattr(r.policy, "cost", None), CostModel):
            r.policy.cost = self._view  # type: ignore[union-attr]  # the batch this step is in
        m = min(len(r.fed), len(ctx))
        agree = r.fed[:m] == ctx[:m]
        same = m if agree.all() else int(np.argmin(agree))  # the draft's tokens still on the request's path
        # a window vLLM did not verify (it scheduled no drafts this step) whose first token the target then chose
        # itself leaves the request's tokens a prefix of the draft's: re-feed the last one, the next draft's input
        same = min(same, len(ctx) - 1)
        if self.batch is not None:
            self.batch.truncate(r.rid, same)
        elif r.drafter.session is not None:
            r.drafter.session.truncate(same)
        r.fed = r.fed[:same]
        r.drafter.begin(torch.from_numpy(ctx.astype(np.int64)))
        r.k_max = min(self.k_max, self.pair.context_length - len(ctx) - 1)

    def _draft(self, r: _Request) -> float:
        """(1) One request's window on its own session, the policy deciding after each token (rounds.draft_window,
        disco's loop's code); returns the seconds spent in draft forwards."""
        forward_s = [0.0]

        def propose(pos: int):
            t = time.perf_counter()
            step = r.drafter.propose(pos)
            forward_s[0] += time.perf_counter() - t
            return step

        decide_now(draft_window(r.policy, r.k_max, propose, r.stats), r.policy)
        return forward_s[0]

    def _draft_batched(self, work: list[_Request]) -> float:
        """(1) Every request's window in lockstep: position 1 is one forward over the tokens each drafting
        request's sequence lacks (a new prompt, what vLLM kept and sampled), each later one over the last draft
        token of every request still drafting; after each, each request's policy decides as in
        rounds.draft_window (the same calls); one that stopped is left out. Returns the seconds in forwards."""
        assert self.batch is not None
        live = [r for r in work if r.policy is not None and opens_window(r.policy, r.k_max)]
        feeds = {r.rid: r.drafter.ids[self.batch.length(r.rid) :].tolist() for r in live}
        hidden = any(r.drafter.want_hidden for r in live)
        forward_s, pos = 0.0, 1
        while live:
            t = time.perf_counter()
            rows = self.batch.feed(feeds, hidden)
            forward_s += time.perf_counter() - t
            going = []
            for r in live:
                assert r.policy is not None
                logits, state = rows[r.rid]
                step = r.drafter.take(pos, logits, state)
                stop = decide_now(decide_token(r.policy, step, r.stats), r.policy)
                if not (stop or pos == r.k_max):
                    going.append(r)
            live, pos = going, pos + 1
            feeds = {r.rid: [int(r.drafter.tokens[-1])] for r in live}
        return forward_s


def _load_shared_from_env() -> None:
    """`vllm serve` with disco's proposer: the pair and policy named by the DISCO_VLLM_POLICY JSON."""
    settings = read_settings()  # (the same file as the proposer on vLLM's draft reads, with the side pair)
    from disco.options import PairOptions
    from disco.pair import load_pair

    pair_opts = {k: v for k, v in (settings.get("pair") or {}).items() if k in PairOptions.__dataclass_fields__}
    SHARED.pair = load_pair(PairOptions(**{**pair_opts, "engine": "vllm"}))
    policy = settings.get("policy") or {"name": "threshold"}
    if policy.get("classifier"):
        path = Path(policy["classifier"]).expanduser()
        if not (path / "manifest.json").is_file():
            raise DiscoError(f"the proposer's classifier {path} is not an artifact (no manifest.json): check {ENV}")
    SHARED.policy = PolicySpec(**policy)
    SHARED.load = read_load_profile(settings["profile"]) if settings.get("profile") else None


# --- disco compare --engine vllm -----------------------------------------------------------------------


def serving_rows(pair: Pair, entries: list, max_window: int, settings: dict) -> list[ServingRow]:
    """vLLM's own rows (target-only first: the reference; its draft-model decoding at fixed lengths), then
    each of compare's policy entries as disco's proposers inside vLLM: on vLLM's own draft ("vllm draft +
    POLICY", where the pair has a draft folder and the policy a batched form) and on the side engine ("vllm +
    POLICY"), as settings["proposers"] asks. The oracle needs the target's output in advance and has no vLLM row."""
    target = pair.target_engine
    rows = target.serving_rows(settings)
    side = SpecConfig("custom_class", max_window, PROPOSER)
    draft = SpecConfig(DISCO_DRAFT, max_window, str(target.draft_folder)) if target.draft_folder else None
    proposers = settings.get("proposers", DEFAULT_VLLM_PROPOSERS)
    for e in entries:
        if e.spec is None or e.spec.kind.needs_target_tokens or e.variant is not None:
            continue
        if draft is not None and "draft" in proposers and e.spec.kind.batched is not None:
            rows.append(ServingRow(f"vllm draft + {e.label}", draft, policy=e.spec))
        if "side" in proposers:
            rows.append(ServingRow(f"vllm + {e.label}", side, policy=e.spec))
    return rows


def run_serving_compare(
    pair: Pair,
    prompts: list,
    entries: list,
    config: DecodeConfig,
    out_dir: Path,
    concurrency: list[int],
    chat: bool | None = None,
    progress: bool = True,
    plots: bool = True,
    settings: dict | None = None,
    load: CostModel | None = None,
) -> dict:
    """Every row on every prompt at each concurrency: the prompts in groups of c submitted together, the
    rows' order rotated per group; each request's time is its share of its group's wall clock (by tokens),
    so pooled figures are the groups' throughput. One compare result per concurrency (compare.json,
    table.md, plots in out_dir/c{c}/) and all tables in out_dir/table.md."""
    from tqdm import tqdm

    from disco.compare import TARGET_LABEL, _record, format_tables, summarise
    from disco.files import atomic_write_json, atomic_write_text, write_dir

    if config.temperature > 0:
        raise DiscoError("compare --engine vllm runs greedy decoding (vLLM's outputs are compared token by token)")
    target = pair.target_engine
    rows = serving_rows(pair, entries, config.max_window, settings or {})
    ref_row, others = rows[0], rows[1:]
    if not others:
        raise DiscoError("no row to run beside vLLM target-only: choose rows with --policies")
    SHARED.pair, SHARED.load, SHARED.keep_stats = pair, load, True
    prompts = answer_first_turns(pair, prompts, config.max_new_tokens, chat, progress)  # mt-bench-2: turn 1 first
    ids = [pair.encode(p.prompt, chat) for p in prompts]
    results: dict[int, dict] = {}
    bar = tqdm(total=len(concurrency) * len(prompts) * len(rows), desc="compare", unit="run", disable=not progress)
    for c in concurrency:
        per_prompt = [
            {"id": p.id, "task": p.task, "seed": None, "prompt_tokens": len(i), "runs": {}}
            for p, i in zip(prompts, ids)
        ]
        costs: dict[str, dict] = {}
        refs: dict[int, GenResult] = {}  # vLLM target-only's output of each prompt: what "= target" compares with
        for g, start in enumerate(range(0, len(prompts), c)):
            group = list(range(start, min(start + c, len(prompts))))
            group_ids = [ids[i] for i in group]
            shift = g % len(others)
            for row in [ref_row, *others[shift:], *others[:shift]]:
                bar.set_postfix_str(f"c={c}: {row.label}")
                proposer = _proposer(target, row, max(concurrency), load)
                results_, request_ids, wall = row.generate(
                    target, group_ids, config.max_new_tokens, pair.eos_token_ids, c
                )
                _apportion(results_, group_ids, request_ids, wall, proposer)
                for i, res in zip(group, results_):
                    if row is ref_row:
                        refs[i] = res
                    label = TARGET_LABEL if row is ref_row else row.label
                    per_prompt[i]["runs"][label] = _record(pair, ids[i], config, res, refs[i], forwards_known=False)
                    bar.update(1)
                if proposer is not None:
                    cost = costs.setdefault(row.label, {"decide_s": 0.0, "forward_s": 0.0, "draft_forwards": 0})
                    cost["decide_s"] += proposer.decide_s
                    cost["forward_s"] += proposer.forward_s
                    cost["draft_forwards"] += sum(r["draft_forwards"] for r in _runs(per_prompt, group, row.label))
        labels = [TARGET_LABEL, *(r.label for r in others)]
        summary, by_task = summarise(labels, per_prompt)
        for label, cost in costs.items():  # the proposer's own time per draft token: deciding vs drafting
            n = max(cost["draft_forwards"], 1)
            summary[label]["decide_ms_per_draft"] = 1000 * cost["decide_s"] / n
            summary[label]["draft_ms_per_draft"] = 1000 * cost["forward_s"] / n
        results[c] = {
            "pair": pair.describe(),
            "config": config.__dict__,
            "n_prompts": len(prompts),
            "seeds": 1,
            "concurrency": c,
            "reference": f"{TARGET_LABEL} ({ref_row.label})",
            "anchors": [r.label for r in others if r.policy is None],
            "summary": summary,
            "summary_by_task": by_task,
            "prompts": per_prompt,
        }
    bar.close()

    def fill(folder: Path) -> None:
        tables = []
        for c, result in results.items():
            sub = folder / f"c{c}"
            sub.mkdir()
            atomic_write_json(sub / "compare.json", result)
            atomic_write_text(sub / "table.md", format_tables(result) + "\n")
            tables.append(f"## {c} request{'s' if c > 1 else ''} at a time ({TARGET_LABEL} = {ref_row.label})\n\n")
            tables[-1] += format_tables(result) + "\n"
            if plots:
                from disco.plots import write_plots

                write_plots(result, sub)
        atomic_write_text(folder / "table.md", "\n".join(tables))
        atomic_write_json(folder / "compare.json", {"concurrency": {str(c): r for c, r in results.items()}})

    write_dir(out_dir, fill, "comparison")
    return {"concurrency": results}


def _runs(per_prompt: list[dict], group: list[int], label: str) -> list[dict]:
    return [per_prompt[i]["runs"][label] for i in group if label in per_prompt[i]["runs"]]


def _proposer(target, row: ServingRow, max_seqs: int, load: CostModel | None) -> Any:
    """disco's proposer for `row` (None: one of vLLM's own rows), built once, set to the row's policy: the one on
    vLLM's draft (vllm_proposer.DiscoDraftProposer) or the side-engine one (DiscoProposer, found in SHARED)."""
    if row.policy is None:
        return None
    if row.spec.method == DISCO_DRAFT:
        proposer = target.proposer(row.spec, max_seqs)
    else:
        target.llm(row.spec, max_seqs)  # built once; its proposer registers itself in SHARED
        proposer = SHARED.proposer
    assert proposer is not None
    proposer.set_policy(row.policy, load)
    return proposer


def _apportion(
    results: list[GenResult], prompts: list[list[int]], request_ids: list[str], wall: float, proposer: Any
) -> None:
    """Give each request of a group its share of the group's wall clock (by tokens) and, from disco's proposer,
    the counts of its windows."""
    total = sum(r.stats.new_tokens for r in results) or 1
    for ids, rid, res in zip(prompts, request_ids, results):
        res.stats.wall_s = wall * res.stats.new_tokens / total
        counted = proposer.stats_for(ids, rid) if proposer is not None else None
        if counted is not None:
            counted.new_tokens, counted.wall_s = res.stats.new_tokens, res.stats.wall_s
            counted.target_forwards = len(counted.windows)
            res.stats = counted


# --- disco profile --engine vllm: the target's step cost by the tokens in the step ----------------------


def step_costs(points: dict[int, float], top: int) -> list[float]:
    """C(1 .. top) from the step times measured at some widths: a step over more tokens never costs less, so
    the medians are first made non-decreasing (isotonic least squares: timing noise must not make an extra
    token look free, or cheaper than none, to the cost rules), then interpolated linearly between widths."""
    from sklearn.isotonic import IsotonicRegression

    widths = sorted(points)
    fitted = IsotonicRegression(increasing=True).fit_transform(widths, [points[w] for w in widths])
    return [float(v) for v in np.interp(np.arange(1, top + 1), widths, fitted)]


def profile_load(
    pair: Pair, max_window: int, context: int, max_batch: int = DEFAULT_VLLM_MAX_SEQS, steps: int = 10, progress=True
) -> dict:
    """Measure vLLM's step time C(t) for steps of t = b x (k + 1) tokens (b requests, each verifying k
    drafts of disco's proposer at a constant length) for b up to max_batch, k up to max_window, and the
    proposer's draft cost. C(t) is the time from the end of one propose() to the start of the next:
    the target's batched forward, sampling and vLLM's scheduling, what a step costs beside the drafting.
    The proposer is the one on vLLM's own draft when the pair has a draft folder (its draft forward timed
    by batch size: c_draft[b - 1], one batched position for b requests), else the side-engine one (c_d, a
    draft token of one request). Returns a profile (CostModel fields: c_d, c_t = C(1 .. max_window + 1),
    c_step = C(1 .. T) by linear interpolation between the measured widths, c_draft) with the points measured."""
    import statistics

    from tqdm.auto import tqdm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from disco.profile import context_ids

    target = pair.target_engine
    SHARED.pair, SHARED.load, SHARED.keep_stats = pair, None, True
    on_vllm_draft = target.draft_folder is not None
    if on_vllm_draft:
        spec = SpecConfig(DISCO_DRAFT, max_window, str(target.draft_folder))
        llm, proposer = target.llm(spec, max_batch), target.proposer(spec, max_batch)
    else:
        spec = SpecConfig("custom_class", max_window, PROPOSER)
        llm, proposer = target.llm(spec, max_batch), SHARED.proposer
    assert proposer is not None
    marks: list[tuple[float, float]] = []  # (entry, exit) of every propose() call
    inner = proposer.propose

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = inner(*args, **kwargs)
        marks.append((t, time.perf_counter()))
        return out

    proposer.propose = timed  # type: ignore[method-assign]
    batches = [b for b in VLLM_PROFILE_BATCHES if b <= max_batch]
    windows = sorted({k for k in VLLM_PROFILE_WINDOWS if k <= max_window} | {max_window})
    points: dict[int, float] = {}
    draft_s, drafts = 0.0, 0
    per_batch: dict[int, list[float]] = {}  # vLLM's draft: seconds per batched draft position, by batch size
    grid = [(b, k) for b in batches for k in windows]
    for b, k in tqdm(grid, desc="timing vLLM steps", disable=not progress):
        proposer.set_policy(PolicySpec("constant", k=k) if k else PolicySpec("target"))
        marks.clear()
        prompts = [TokensPrompt(prompt_token_ids=context_ids(pair.tokenizer, context + i)) for i in range(b)]
        params = SamplingParams(temperature=0.0, max_tokens=(steps + 3) * (k + 1), ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)
        gaps = [nxt[0] - prev[1] for prev, nxt in zip(marks, marks[1:])][2 : 2 + steps]  # steady decode steps
        if gaps:
            t = b * (k + 1)
            points[t] = min(points.get(t, float("inf")), statistics.median(gaps))
        if on_vllm_draft:
            if k and proposer.n_positions:
                per_batch.setdefault(b, []).append(proposer.forward_s / proposer.n_positions)
        else:
            draft_s += proposer.forward_s
            running = [r.stats for r in proposer.requests.values()]
            drafts += sum(s.draft_forwards for s in [*proposer.finished.values(), *running])
    proposer.propose = inner  # type: ignore[method-assign]
    proposer.set_policy(SHARED.policy if not on_vllm_draft else PolicySpec("target"), None)
    c_step = step_costs(points, max_batch * (max_window + 1))
    widths = sorted(points)
    c_draft: tuple[float, ...] = ()
    if on_vllm_draft:  # one batched draft position for b = 1 .. max_batch requests (never cheaper for more)
        c_draft = tuple(step_costs({b: min(v) for b, v in per_batch.items()}, max_batch))
        c_d = c_draft[0]
    else:
        c_d = draft_s / max(drafts, 1)
    cost = CostModel(c_d, tuple(c_step[: max_window + 1]), "profile", tuple(c_step), c_draft)
    return {
        **cost.to_dict(),
        "proposer": "vllm draft" if on_vllm_draft else "side engine",
        "unit": "s",
        "c_d_ratio": c_d / c_step[0],
        "c_t_ratio": [c / c_step[0] for c in c_step[: max_window + 1]],
        "measured_step_s": {str(w): points[w] for w in widths},  # C(t) at the widths timed
        "max_window": max_window,
        "max_batch": max_batch,
        "context_tokens": context,
        "steps": steps,
        "pair": pair.describe(),
        "device_name": "cpu",
        "machine": this_machine(),  # its step costs are this machine's (cpu.read_load_profile warns elsewhere)
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def serving_generate(
    pair: Pair, prompts: list[list[int]], spec: PolicySpec, config: DecodeConfig, load: CostModel | None = None
) -> list[GenResult]:
    """`disco generate --engine vllm`: the prompts submitted together to vLLM with disco's proposer under
    `spec` (target-only for the target policy); each result's time is its share of the wall clock."""
    if config.temperature > 0:
        raise DiscoError("--engine vllm generates greedily here: drop --temperature (or serve with vLLM itself)")
    SHARED.pair, SHARED.load, SHARED.keep_stats = pair, load, True
    target = pair.target_engine
    if spec.name == "target":
        row = ServingRow(spec.name, SpecConfig())
    elif target.draft_folder is not None and spec.kind.batched is not None:  # on vLLM's own draft
        row = ServingRow(spec.name, SpecConfig(DISCO_DRAFT, config.max_window, str(target.draft_folder)), spec)
    else:  # a GGUF draft (vLLM loads none on CPUs), or a policy without a batched form: the side-engine proposer
        row = ServingRow(spec.name, SpecConfig("custom_class", config.max_window, PROPOSER), spec)
    proposer = _proposer(target, row, max(len(prompts), DEFAULT_VLLM_MAX_SEQS), load)
    results, request_ids, wall = row.generate(target, prompts, config.max_new_tokens, pair.eos_token_ids, len(prompts))
    _apportion(results, prompts, request_ids, wall, proposer)
    return results
