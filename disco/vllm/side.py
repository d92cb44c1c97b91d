"""disco's policy inside vLLM's speculative decoding: the side-engine proposer (docs/architecture.md, "vLLM").
The proposer on vLLM's own batched draft is draft.py; compare runs both, through the vLLM runner
(stages.VllmRunner, which also runs `generate` and `profile` on vLLM).

The side-engine proposer: vLLM loads it by name:

    speculative_config = {"method": "custom_class", "model": "disco.vllm.side.DiscoProposer",
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

The closed loop ("closed_loop": true in the settings; docs/architecture.md, "Closed loop"): the proposer times
vLLM's target step (from the end of its drafting to the next propose, by the tokens the step ran) and its own draft
positions (a batched one by the requests in it; on sessions, the sum of the requests' at that position) into the
running cost table (online.closed_loop.ClosedLoop; `profile` only seeds it), each request's policy decides under
the loop (closed_loop_policy.LoopDecisions: the running costs at this batch, P(accept) recalibrated from what vLLM
verified), and once a step the loop may fix the length for every request (a warm-up probe, the governor's choice).
The governor's k = 0 drafts nothing and feeds the draft nothing: a request's draft catches up lazily at its next
window (position 1 feeds what it lacks), so "off" costs vLLM's speculative path alone, and it says so once.

The policy and pair come from the process (the vLLM runner sets them in process.PROCESS.side: vLLM's engine core
runs in-process) or, under
`vllm serve`, from the JSON file named by DISCO_VLLM_POLICY (README, "Serving with vLLM").
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from disco.base.defaults import SIDE_DRAFT_SEQS
from disco.base.errors import DiscoError, said_in_one_line
from disco.base.shipped import find_classifier
from disco.core.cost import CostModel, load_view
from disco.core.load_profiles import SIDE_ENGINE, LoadProfiles
from disco.core.stats import GenStats
from disco.engines.base import BatchedDraft
from disco.loop.decode import DecodeConfig, Drafter
from disco.online.closed_loop import ClosedLoop
from disco.policies.classifier import ClassifierPolicy
from disco.policies.closed_loop_policy import LoopDecisions
from disco.policies.policy import StoppingPolicy, decide_now
from disco.policies.policy_registry import PolicySpec
from disco.policies.rounds import decide_token, draft_window, end_round, leading_run, opens_window
from disco.vllm.draft import SERVE_BARE
from disco.vllm.engine import PROPOSER
from disco.vllm.process import PROCESS, is_request
from disco.vllm.settings import ENV, closed_loop, read_settings

__all__ = ["ENV", "PROPOSER", "DiscoProposer"]
GREEDY = DecodeConfig()  # the proposer drafts each request's most likely tokens (vLLM verifies, also when sampling)


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
        if PROCESS.side.pair is None:
            _load_shared_from_env()  # (a missing or bad setting is refused first, in one line)
        self.max_seqs = int(vllm_config.scheduler_config.max_num_seqs)  # the most requests in a step
        assert PROCESS.side.pair is not None
        self.pair = PROCESS.side.pair
        self.requests: dict[str, _Request] = {}  # the running requests, by vLLM request id
        self.batch: BatchedDraft | None = None  # every request's draft sequence (None: a session per request)
        self.spare_engines: list[Any] = [self.pair.draft]  # draft engines not held by a request
        self.set_policy(PROCESS.side.policy, PROCESS.side.load, PROCESS.side.closed_loop)
        PROCESS.side.proposer = self

    def load_model(self, *args, **kwargs) -> None:
        pass  # vLLM hands over its target; the draft is disco's own engine (loaded with the pair)

    def set_policy(self, spec: PolicySpec, load: CostModel | None = None, closed_loop: bool = False) -> None:
        """Decide with `spec` from now on (compare's rows switch it between runs); requests start afresh.
        closed_loop: the costs the rules read are measured in this process (`load` only seeds them), a classifier's
        P(accept) is recalibrated from what vLLM verified, and a governor falls back to a fixed length (or none)
        when the policy loses to one (online.closed_loop.ClosedLoop)."""
        if spec.kind.needs_target_tokens:
            raise DiscoError(f"the {spec.name} policy needs the target's output in advance: not in vLLM")
        self.spec, self.load = spec, load
        self._template = spec.build(pair=self.pair, max_window=self.k_max)
        if getattr(self._template, "reads_signals", False):
            # vLLM verifies without showing the proposer the target's probabilities: its last_* features
            # stay at their before-any-window values, which the model never saw after a window in training
            PROCESS.say_once(
                f"signals:{spec.classifier}",
                f"disco: {spec.classifier} reads the target's signals (last_*), which vLLM does not show its "
                "proposer: they stay at their first-window values; for vLLM train with --no-target-signals",
            )
        for rid in list(self.requests):
            self._release(rid)
        if PROCESS.side.batched != (self.batch is not None):
            self.batch = self.pair.draft.batched_draft(SIDE_DRAFT_SEQS) if PROCESS.side.batched else None
            self.spare_engines = [] if self.batch is not None else [self.pair.draft]
        self.finished: dict[str, GenStats] = {}  # keep_stats: finished requests' counts, by request id
        self.decide_s = 0.0  # in the policy (features, model, rule): the decision-cost figure
        self.forward_s = 0.0  # in draft forwards
        self.n_forwards = 0  # draft forwards run (a batched position is one)
        self.loop = self._closed_loop(spec, load) if closed_loop else None

    def _closed_loop(self, spec: PolicySpec, load: CostModel | None) -> ClosedLoop:
        """The closed loop the requests decide under, seeded by `load` (a classifier's P(accept) calibrated; k = 0 runs
        no draft position here, as the draft catches up at the next window: no idle position), said once."""
        loop = ClosedLoop(
            load, self.max_seqs, self.k_max, torch.device("cpu"), isinstance(self._template, ClassifierPolicy),
            idle_position=False, say=lambda line: PROCESS.say_once("governor:side", f"disco: {line}{SERVE_BARE}"),
        )  # fmt: skip
        seed = "the profile's" if load is not None else "a warm-up's"
        calibration = ", P(accept) recalibrated" if loop.calibration is not None else ""
        PROCESS.say_once(
            "closed loop:side",
            f"disco: the {spec.name} policy decides on the side engine under the closed loop (costs measured here "
            f"from {seed} start{calibration}, a governor against fixed draft lengths)",
        )
        return loop

    def _policy(self) -> StoppingPolicy | None:
        t = self._template
        if t is None:
            return None
        policy = t.fresh() if hasattr(t, "fresh") else self.spec.build(pair=self.pair, max_window=self.k_max)
        return LoopDecisions(policy, self.loop) if self.loop is not None else policy

    def _release(self, rid: str) -> None:
        """A request vLLM no longer holds (finished or aborted): its draft sequence or engine is free again."""
        r = self.requests.pop(rid)
        if PROCESS.side.keep_stats:
            self.finished[rid] = r.stats
        if self.batch is not None:
            self.batch.remove(rid)
        else:
            self.spare_engines.append(r.engine)

    def stats_for(self, prompt: list[int], request_id: str) -> GenStats | None:
        """The counts of the request vLLM's LLM returned as `request_id` (its engine adds a suffix), once."""
        for rid in [*self.finished, *self.requests]:
            if is_request(rid, request_id):
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
        request id comes from the runner, process.PROCESS.batch_requests)."""
        t0 = time.perf_counter()
        ids, alive = PROCESS.batch_requests(len(sampled_token_ids))
        for gone in [rid for rid in self.requests if rid not in alive]:
            self._release(gone)
        out: list[list[int]] = [[] for _ in sampled_token_ids]  # a request still in its prompt: nothing to draft
        work: list[tuple[int, _Request, np.ndarray]] = []
        for i, (rid, sampled, n) in enumerate(zip(ids, sampled_token_ids, num_tokens_no_spec)):
            if sampled:
                ctx = token_ids_cpu[i, : int(n)]
                work.append((i, self._request(rid, ctx), ctx))
        verified = [self._verified(r, ctx) for _, r, ctx in work]
        fixed, view = self._choice(t0, len(sampled_token_ids), verified)
        for _, r, ctx in work:
            self._begin(r, ctx, fixed, view)
        t1, forward_s = time.perf_counter(), 0.0
        if self.batch is not None:
            forward_s = self._draft_batched([r for _, r, _ in work])
        else:
            forward_s = self._draft_each([r for _, r, _ in work])
        self.decide_s += time.perf_counter() - t1 - forward_s
        self.forward_s += forward_s
        for i, r, ctx in work:
            window = [int(t) for t in r.drafter.tokens]
            if window:  # the draft now holds ctx and every drafted token but the last
                r.fed = np.concatenate([ctx.astype(np.int64), np.asarray(window[:-1], dtype=np.int64)])
            r.proposed, r.n_before = window, len(ctx)
            out[i] = window
        if self.loop is not None:
            self.loop.ended(time.perf_counter())  # the target step starts
        return out

    def _verified(self, r: _Request, ctx: np.ndarray) -> tuple[int, int]:
        """(5) Tell a request's policy how much of its last window vLLM kept (the leading run of its tokens that the
        request's tokens now hold); returns the window's drafted and accepted lengths (0, 0: it had none)."""
        if not r.proposed:
            return 0, 0
        kept = ctx[r.n_before : r.n_before + len(r.proposed)]
        accepted = leading_run(torch.from_numpy(kept == np.asarray(r.proposed[: len(kept)])))
        end_round(r.policy, r.stats, len(r.proposed), accepted, None)  # vLLM keeps the target's logits
        drafted, r.proposed = len(r.proposed), []
        return drafted, accepted

    def _choice(self, t0: float, rows: int, verified: list[tuple[int, int]]) -> tuple[int | None, CostModel | None]:
        """This step's fixed length for every request (None: each policy decides) and the cost rules' model at this
        batch: the load profile's, or under the closed loop the running table's, after it has taken in the target
        step that just ran (vLLM's, over all `rows`' tokens, from the end of the last drafting to `t0`) and the
        outcomes of the windows it verified."""
        batch = len(verified)
        if self.loop is None:
            return None, load_view(self.load, batch, self.k_max)
        self.loop.step(t0, _step_tokens(rows), [d for d, _ in verified], [a for _, a in verified])
        fixed = self.loop.override(batch) if batch else None
        return fixed, load_view(self.loop.cost_model(), batch, self.k_max) if fixed is None else None

    def _begin(self, r: _Request, ctx: np.ndarray, fixed: int | None, view: CostModel | None) -> None:
        """A request's round up to its drafting: set this step's choice (the closed loop's fixed length, the cost
        view of the batch it is in), roll its draft back to the tokens vLLM kept, set its window limit."""
        if isinstance(r.policy, LoopDecisions):
            r.policy.choose(fixed, view)
        elif view is not None and isinstance(getattr(r.policy, "cost", None), CostModel):
            r.policy.cost = view  # type: ignore[union-attr]  # the batch this step is in
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

    def _draft_each(self, work: list[_Request]) -> float:
        """(1) Each request's window on its own session, one after another (_draft); to the closed loop a position
        over the requests drafting at it costs the sum of theirs (what one batched position is to the batched draft).
        Returns the seconds in draft forwards."""
        rows: dict[int, int] = defaultdict(int)  # position -> the requests that drafted it ...
        seconds: dict[int, float] = defaultdict(float)  # ... and their forwards' seconds
        forward_s = sum(self._draft(r, rows, seconds) for r in work)
        if self.loop is not None:
            for pos in sorted(rows):
                if pos > 1:  # (position 1 also feeds what the request's draft lacks: vLLM's kept and sampled tokens)
                    self.loop.position(rows[pos], seconds[pos])
        return forward_s

    def _draft(self, r: _Request, rows: dict[int, int], seconds: dict[int, float]) -> float:
        """(1) One request's window on its own session, the policy deciding after each token (rounds.draft_window,
        disco's loop's code); adds each position's forward to rows / seconds; returns its seconds in draft forwards."""
        forward_s = [0.0]

        def propose(pos: int):
            t = time.perf_counter()
            step = r.drafter.propose(pos)
            took = time.perf_counter() - t
            forward_s[0] += took
            rows[pos] += 1
            seconds[pos] += took
            self.n_forwards += 1
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
            took = time.perf_counter() - t
            forward_s += took
            self.n_forwards += 1
            if self.loop is not None and pos > 1:  # (position 1 also feeds what each request's sequence lacks)
                self.loop.position(len(live), took)
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


def _step_tokens(rows: int) -> int:
    """The tokens of the target step that just ran, its `rows` requests together: the end of the runner's
    query_start_loc, which it fills for the step it runs (vLLM 0.32 gpu_model_runner.py ~2029; settings.SUPPORTED_VLLM;
    a custom_class proposer is not handed the scheduler's count)."""
    return int(PROCESS.runner.query_start_loc.np[rows])


def _load_shared_from_env() -> None:
    """`vllm serve` with disco's proposer: the pair and policy named by the DISCO_VLLM_POLICY JSON."""
    settings = read_settings()  # (the same file as the proposer on vLLM's draft reads, with the side pair)
    PROCESS.side.closed_loop = closed_loop(settings)
    from disco.base.options import PairOptions
    from disco.loop.pair import load_pair

    pair_opts = {k: v for k, v in (settings.get("pair") or {}).items() if k in PairOptions.__dataclass_fields__}
    PROCESS.side.pair = load_pair(PairOptions(**{**pair_opts, "engine": "vllm"}))
    policy = settings.get("policy") or {"name": "threshold"}
    if policy.get("classifier"):
        path = find_classifier(Path(policy["classifier"]).expanduser())  # a path, or a shipped one by name
        policy = {**policy, "classifier": str(path)}
        if not (path / "manifest.json").is_file():
            raise DiscoError(f"the proposer's classifier {path} is not an artifact (no manifest.json): check {ENV}")
    PROCESS.side.policy = PolicySpec(**policy)
    PROCESS.side.load = LoadProfiles(settings["profile"]).choose(SIDE_ENGINE) if settings.get("profile") else None
