"""disco's policy on vLLM's own batched draft (docs/architecture.md, "vLLM's own draft").

vLLM's `draft_model` method drafts every running request in one batched forward per draft position, inside
vLLM (its model runner, paged KV cache, device, tensor parallelism), and verifies k tokens per request.
`DiscoDraftProposer` is that proposer (a subclass of vLLM's `DraftModelProposer`) with one change: after each
draft position it computes the features of every request from the draft's logits as one (B, F) tensor on the
draft's device (features.batch_logit_distribution, assemble_token_features), asks the policy about the whole
batch in one call (batch_policy.py), masks the requests that stopped, ends the loop when none drafts on, and
hands vLLM each request's own number of draft tokens. Per-request state is keyed by vLLM's request id and freed
when vLLM drops the request.

How it gets in: process.PROCESS.install() makes vLLM's V1 runner build this class (under `vllm serve` the
plugin does, in every vLLM process, when DISCO_VLLM_POLICY is set; in-process, engine.VllmTarget does around
building disco's instance). Without settings it behaves exactly as vLLM's own (compare's "vllm draft k=K" rows
share the process).

What it relies on (read from vLLM 0.32; settings.SUPPORTED_VLLM): propose(...) and
_sample_draft_tokens(hidden, sampling_metadata) of llm_base_proposer.py, the runner's input_batch (req_ids,
token_ids_cpu, num_tokens_no_spec) and requests, ragged list[list[int]] drafts under synchronous scheduling
(config.check_config says what else).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import torch

from disco.base.errors import DiscoError, said_in_one_line
from disco.core.cost import CostModel
from disco.core.features import assemble_token_features, batch_logit_distribution, token_class_table
from disco.online.closed_loop import ClosedLoop
from disco.policies.batch_policy import (
    Batch,
    BatchClassifier,
    BatchConstant,
    BatchPolicy,
    BatchTarget,
    RequestState,
    RowState,
    never_drafts,
    verified,
)
from disco.policies.policy_registry import BatchContext, PolicySpec
from disco.sources.embedded import pair_name
from disco.sources.hub import load_tokenizer, tokenizer_hash
from disco.vllm.config import check_drafter, first_rank, in_effect
from disco.vllm.process import PROCESS, take_stats
from disco.vllm.settings import ENV, settings_from_env


class _AllStopped(Exception):
    """Raised inside vLLM's draft loop once no request drafts on: the loop ends there."""


_CLASS: list[type] = []  # DiscoDraftProposer, once defined


# what the governor's "drafting does not pay" adds under vLLM, on either proposer (its speculative path costs a little
# with no draft: custom_class also turns async scheduling off)
SERVE_BARE = " (serving without --speculative-config would be faster still)"


def proposer_class() -> type:
    """DiscoDraftProposer, defined on first use (it subclasses vLLM's, which imports vLLM)."""
    if not _CLASS:
        from vllm.v1.spec_decode.draft_model import DraftModelProposer

        _CLASS.append(type("DiscoDraftProposer", (_DiscoDraft, DraftModelProposer), {"__module__": __name__}))
    return _CLASS[0]


class _DiscoDraft:
    """The methods DiscoDraftProposer adds to vLLM's DraftModelProposer (its other base)."""

    @said_in_one_line()  # under `vllm serve` a refusal here would otherwise reach the user as vLLM's traceback
    def __init__(self, vllm_config: Any, device: torch.device, runner: Any = None) -> None:
        super().__init__(vllm_config, device, runner)  # type: ignore[call-arg]
        self._runner = runner  # its input_batch and requests: the ids, tokens and prompt lengths of the batch
        armed = PROCESS.armed
        settings = armed if armed is not None else (settings_from_env() if os.environ.get(ENV) else None)
        self.settings = settings
        self._step: _Step | None = None
        self.own = settings is None
        if settings is None:
            return  # vLLM's own draft-model decoding
        check_drafter(self)
        self.vllm_config = vllm_config
        self.requests: dict[str, RequestState] = {}  # the running requests' states, by vLLM request id
        self.finished: dict[str, Any] = {}  # keep_stats: finished requests' GenStats, by request id
        self.set_policy(settings.policy, settings.load, settings.closed_loop)
        PROCESS.proposers.append(self)
        if not first_rank():
            return  # under tensor parallelism every rank decides alike: one line
        said = (
            f"disco: the {settings.policy.name} policy decides on vLLM's draft, per request ({in_effect(runner, self)})"
        )
        if self.loop is not None:
            seed = "the profile's" if settings.load is not None else "a warm-up's"
            said += f", closed loop (costs measured here from {seed} start, calibration, governor)"
        if self.never_drafts and armed is None:  # (serving; in-process compare arms the target policy first)
            # vLLM still runs its speculative path every step, no draft proposed: the worker's draft bookkeeping
            # and one more call from the engine for the drafts
            # (bench/results/vllm-avx2-cpu.md, "A proposer that never drafts")
            said += (
                ": it never drafts here (batch_policy.never_drafts: no window pays at any batch size, or the target "
                "policy), so vLLM's draft is skipped; serving this machine without --speculative-config spares "
                "vLLM's speculative path too (1-4 % a step at one request)"
            )
        print(said, file=sys.stderr)

    # --- the policy ---------------------------------------------------------------------------------

    def set_policy(self, spec: PolicySpec | None, load: CostModel | None = None, closed_loop: bool = False) -> None:
        """Decide with `spec` from now on (compare's rows switch it between runs); None: vLLM's own draft-model
        decoding (compare's rows of vLLM's own fixed lengths and Dynamic SD share this instance on CPUs).
        closed_loop: the costs the rules read are measured in this process (`load` only seeds them), the
        classifier's probabilities are recalibrated from vLLM's verified outcomes, and a governor falls back to a
        fixed length when the policy loses to one (closed_loop.ClosedLoop)."""
        self.own = spec is None
        self.loop: ClosedLoop | None = None
        self.decide_s, self.forward_s, self.n_positions = 0.0, 0.0, 0
        self.n_skipped = 0  # steps whose draft pass the closed loop's governor skipped (off)
        if spec is None:
            return
        if not spec.runs_batched:
            knobs = " with these settings" if spec.kind.batched is not None else ""  # (the adaptive threshold)
            raise DiscoError(
                f"the {spec.name} policy{knobs} has no batched form on vLLM's draft: use target, constant, a fixed "
                "threshold or classifier there (or the side-engine proposer, disco.vllm.side.DiscoProposer)"
            )
        self.spec, self.load = spec, load
        # decide_s: in the policy (features, model, rule); forward_s: in vLLM's draft loop besides the policy
        # (its forwards, sampling, metadata); n_positions: draft positions run (one batched forward each)
        if getattr(self, "_pair", None) is None:  # (once: compare switches policies between runs)
            self._pair, self._classes = self._pair_record(), None
        self.policy: BatchPolicy = spec.kind.batched(spec, BatchContext(self._pair, self.device))
        if self.policy.reads_features and self._classes is None:
            vocab = self.vllm_config.speculative_config.draft_model_config.get_vocab_size()
            self._classes = token_class_table(self._tok, vocab).to(self.device)  # a few seconds for 150k tokens
        # (a policy that never drafts here: propose() skips vLLM's draft loop altogether)
        most = int(self.vllm_config.scheduler_config.max_num_seqs)
        self.never_drafts = never_drafts(self.policy, load, most, self._k_most())
        self._tables = None  # (the rows' state is the policy's: a new policy starts afresh)
        if closed_loop:
            # the costs may change: the draft's KV cache is kept current (vLLM's catch-up pass) for a later window
            self.never_drafts = False
            self.loop = ClosedLoop(
                load, most, self._k_most(), self.device, calibrate=isinstance(self.policy, BatchClassifier),
                idle_position=True, say=lambda line: PROCESS.say_once("governor", f"disco: {line}{SERVE_BARE}"),
                skip_idle=True,
            )  # fmt: skip
            if self.loop.calibration is not None:
                self.policy.predict = _calibrated(self.policy.predict, self)  # type: ignore[attr-defined]
        self._fixed: dict[int, BatchPolicy] = {0: BatchTarget()}  # the governor's fixed lengths, by k
        # requests that missed the draft's pass in an off step (closed_loop.ClosedLoop): holes in the draft's KV cache
        self._stale: set[str] = set()
        self.decider: BatchPolicy = self.policy  # who decided the last step: the policy or a fixed length

    def _pair_record(self) -> dict:
        """What the artifact check compares (Pair.describe()'s fields): the models (the embedded pair's files
        recognised by content), the tokenizer, the engine."""
        spec = self.vllm_config.speculative_config
        self._tok = load_tokenizer(str(self.vllm_config.model_config.tokenizer))
        return {
            "target": pair_name(str(self.vllm_config.model_config.model)),
            "draft": pair_name(str(spec.draft_model_config.model)),
            "tokenizer_hash": tokenizer_hash(self._tok),
            "engine": {"name": "vllm", "dtype": str(spec.draft_model_config.dtype).removeprefix("torch.")},
        }

    def _k_most(self) -> int:
        """The longest window vLLM lets this instance propose (its num_speculative_tokens)."""
        return int(self.vllm_config.speculative_config.num_speculative_tokens)

    def stats_for(self, prompt: list[int], request_id: str) -> Any:
        """The counts of the request vLLM's LLM returned as `request_id`, once."""
        return take_stats(request_id, self.finished, self.requests)

    # --- vLLM's draft loop --------------------------------------------------------------------------

    def propose(self, num_speculative_tokens: int, *args: Any, **kwargs: Any):  # type: ignore[override]
        if self.own:  # no settings, or set_policy(None): vLLM's own draft-model decoding
            return super().propose(num_speculative_tokens, *args, **kwargs)  # type: ignore[misc]
        t0 = time.perf_counter()
        cad = kwargs["common_attn_metadata"]
        n = cad.batch_size()
        # the last step's decision: its windows' outcomes are read at the end of this one, after this step's choice
        judged = self.loop.decision if self.loop is not None else None
        self._step = self._begin(n, num_speculative_tokens, kwargs["next_token_ids"], cad, kwargs)
        step = self._step
        k = num_speculative_tokens if step.may_draft else 0  # 0: vLLM only keeps the draft's KV in sync
        off = self.loop is not None and self.loop.off  # (the governor drafts nothing: pass skipped, rows stale)
        passed = bool(k or not (self.never_drafts or off))  # (no request will ever draft: the draft's KV is never read)
        try:
            if passed:
                super().propose(k, *args, **kwargs)  # type: ignore[misc]
            elif off:
                self._stale.update(st.request_id for st in step.states)
                self.n_skipped += 1
        except _AllStopped:
            pass
        finally:
            self._step = None
        self.forward_s += time.perf_counter() - t0 - step.decide_s
        self.decide_s += step.decide_s
        self.n_positions += step.pos
        windows = step.windows()
        if self.loop is not None:  # the target step that ran before this one, the windows it verified
            self.loop.step(t0, int(cad.query_start_loc_cpu[n]), step.verified, step.accepted_now, judged)
            self.loop.ended(time.perf_counter(), n if passed else 0, step.decide_s)
        return windows

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any):
        if self._step is None:
            return super()._sample_draft_tokens(hidden_states, sampling_metadata)  # type: ignore[misc]
        logits = self.model.compute_logits(hidden_states)  # type: ignore[attr-defined]
        tokens = logits.argmax(-1)  # disco drafts greedily (vLLM's rejection sampler verifies, sampling or not)
        self._step.after(logits, tokens)
        return tokens, None

    _tables: _Tables | None = None  # the running requests' state on the draft's device (made on first use)

    def _begin(self, n: int, k_max: int, next_token_ids: torch.Tensor, cad: Any, kwargs: dict) -> _Step:
        """This step's batch: each row's request (by id), what vLLM accepted of its last window (told to the
        policy), whether it drafts now, and its context for the features. What vLLM accepted and sampled stays on
        the draft's device, where the policy's state and the requests' tokens are kept between steps (_Tables):
        the host sends what it knows (_known) in one copy and waits for nothing."""
        tables = self._tables = self._tables or _Tables(self.device, self._k_most())
        states, known = self._known(n, cad)
        loop = self.loop
        by_policy = self.decider is self.policy  # the windows verified now: the policy's (not a fixed length's)
        self.decider = self._decider(loop, states)
        # the features' context only where the policy decides (a fixed length reads none: a row's tokens then fall
        # behind in the tables and are sent again, `reload`, at its next step the policy decides)
        features = self.policy.reads_features and self.decider is self.policy
        ib = self._runner.input_batch
        # rows whose tables row lacks tokens vLLM has (a new request, one back from preemption): theirs too
        reload = [i for i, st in enumerate(states) if tables.held.get(st.request_id, 0) < known[i, _DONE]]
        reload = reload if features else []
        sent = tables.to_device(
            np.concatenate([known.ravel(), *(ib.token_ids_cpu[i, : known[i, _DONE]] for i in reload)])
        )
        rows = sent[: known.size].view(known.shape)
        rejected = kwargs.get("num_rejected_tokens_gpu")  # (None: no window verified in this step)
        verified = rows[:, _VERIFIED]
        accepted = torch.where(verified > 0, verified - (rejected[:n].long() if rejected is not None else 0), 0)
        state = tables.state.take(rows[:, _SLOT])
        self.policy.update(state, verified, accepted)
        if loop is not None and loop.calibration is not None and by_policy:
            # what vLLM verified of the windows the classifier drafted last step (its p's, in the tables)
            loop.calibration.observe_windows(tables.p[rows[:, _SLOT]], verified, accepted)
        batch = Batch.under(states, loop.cost_model() if loop is not None else self.load, self._k_most(), state)
        drafts = self.decider.drafts(batch)
        tables.state.put(rows[:, _SLOT], state)
        # a mask on the host is read for free; one the policy makes on the device (cost-adaptive's forecasts) is
        # read with the first position's answer (a policy that does not say: on the host)
        on_host = not getattr(self.decider, "drafts_on_device", False)
        may_draft = bool(drafts.any()) if on_host else True
        live = tables.to_device(drafts) if on_host else drafts
        context = None
        if features:
            context = self._contexts(known, rows, reload, sent[known.size :], accepted, next_token_ids[:n], k_max)
        self.decider.start(batch, self.device)
        return _Step(self, states, known, rows[:, _SLOT], accepted, live, may_draft, k_max, context)

    def _decider(self, loop: ClosedLoop | None, states: list[RequestState]) -> BatchPolicy:
        """Who decides this step: the policy, or the fixed length the closed loop chose (closed_loop.ClosedLoop: a
        probe, the governor's, 0 while a stale request is in the batch; the policy still learns every outcome
        through update)."""
        stale = sum(st.request_id in self._stale for st in states) if self._stale else 0
        k = loop.override(len(states), stale) if loop is not None else None
        if k is None:
            return self.policy
        if k not in self._fixed:
            self._fixed[k] = BatchConstant(k)
        return self._fixed[k]

    def _known(self, n: int, cad: Any) -> tuple[list[RequestState], np.ndarray]:
        """The rows' requests (by vLLM's id; finished ones freed, preempted ones' windows dropped) and what the host
        knows of each row without the device (vLLM's host copies and the windows disco handed it): (B, columns
        _SLOT.. then the verified drafts, -1 past them)."""
        runner = self._runner
        ib = runner.input_batch
        tables = self._tables
        assert tables is not None
        ids = list(ib.req_ids[:n])
        for gone in [r for r in self.requests if r not in runner.requests]:  # finished or aborted: freed
            state = self.requests.pop(gone)
            self._stale.discard(gone)
            if self.settings is not None and self.settings.keep_stats:
                self.finished[gone] = state.stats
        tables.release([r for r in tables.slots if r not in runner.requests])
        for rid in set(self.requests) - set(ids):  # preempted: its last window was never verified
            self.requests[rid].window = []
        qlen = np.diff(cad.query_start_loc_cpu[: n + 1].numpy())
        known = np.full((n, _DRAFTS + self._k_most()), -1, dtype=np.int64)
        states = []
        for i, rid in enumerate(ids):
            seen = rid in self.requests
            st = self.requests.setdefault(rid, RequestState(rid))
            if seen:
                st.stats.target_forwards += 1  # this step's target forward (the prefill is not counted)
            verified = int(qlen[i]) - 1 if st.window and 0 < qlen[i] - 1 <= len(st.window) else 0
            prompt = runner.requests[rid].num_prompt_tokens
            known[i, :_DRAFTS] = tables.slot(rid), ib.num_tokens_no_spec[i], prompt, verified
            known[i, _DRAFTS : _DRAFTS + verified] = st.window[:verified]
            st.window = []
            states.append(st)
        return states, known

    def _contexts(
        self,
        known: np.ndarray,
        rows: torch.Tensor,
        reload: list[int],
        tokens: torch.Tensor,
        accepted: torch.Tensor,
        sampled: torch.Tensor,
        k_max: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's tokens so far (prompt, output, this step's accepted drafts and sampled token) as a (B, L)
        tensor on the device with room for the window; their lengths; the generated index of the first draft.
        The tables hold each request's tokens up to vLLM's count before this step (`reload`'s rows: just sent,
        flat in `tokens`); the step extends them there by the verified drafts, as many as vLLM accepted, and the
        sampled token. known, rows: _known's, on the host and on the device."""
        tables = self._tables
        assert tables is not None
        slots, done, drafts = rows[:, _SLOT], rows[:, _DONE], known.shape[1] - _DRAFTS
        width = int((known[:, _DONE] + known[:, _VERIFIED]).max()) + 1 + k_max  # the longest, its window past it
        tables.fit(max(width, int(known[:, _DONE].max()) + drafts + 1))
        at = 0
        for i in reload:
            count = int(known[i, _DONE])
            tables.tokens[int(known[i, _SLOT]), :count] = tokens[at : at + count]
            at += count
        # the verified drafts (what lies past the accepted ones lies past the length, or under the sampled token)
        tables.tokens[slots[:, None], done[:, None] + torch.arange(drafts, device=done.device)] = rows[:, _DRAFTS:]
        tables.tokens[slots, done + accepted] = sampled.long()
        lengths = done + accepted + 1
        return tables.tokens[:, :width][slots], lengths, lengths - rows[:, _PROMPT]


# _DiscoDraft._known's columns: each row's row in the tables, vLLM's tokens before this step's, its prompt's length,
# the drafts of its last window verified now (0: none); its verified drafts from _DRAFTS on
_SLOT, _DONE, _PROMPT, _VERIFIED, _DRAFTS = range(5)


class _Tables:
    """The running requests' state on the draft's device, a row each from a request's first step until vLLM drops
    it: the policy's fields (batch_policy.RowState) and the request's tokens (the features' context, extended there
    each step). The host keeps whose row is which and how many of its tokens a row holds."""

    def __init__(self, device: torch.device, k_most: int) -> None:
        self.device = device
        self.state = RowState.fresh(0, device)
        # the model's P(accept) of each row's drafts in its last window (the closed loop's calibration learns from
        # what vLLM then verified of them)
        self.p = torch.zeros((0, k_most), device=device)
        self.tokens = torch.full((0, 0), -1, dtype=torch.long, device=device)
        self.slots: dict[str, int] = {}  # request id -> its row
        self.held: dict[str, int] = {}  # request id -> how many of its first tokens its row holds (its last step's)
        self.free: list[int] = []

    def slot(self, rid: str) -> int:
        if rid not in self.slots:
            if not self.free:  # twice as many rows (made on the device: nothing copied from the host)
                have, more = len(self.state.forecast), max(8, len(self.state.forecast))
                grown = RowState.fresh(have + more, self.device)
                grown.put(slice(0, have), self.state)
                self.state = grown
                pad = torch.full((more, self.tokens.shape[1]), -1, dtype=torch.long, device=self.device)
                self.tokens = torch.cat([self.tokens, pad])
                self.p = torch.cat([self.p, torch.zeros((more, self.p.shape[1]), device=self.device)])
                self.free = list(range(have + more - 1, have - 1, -1))
            self.slots[rid] = self.free.pop()
        return self.slots[rid]

    def release(self, gone: list[str]) -> None:
        """The rows of requests vLLM dropped, for new ones (their policy fields as a new request's)."""
        for rid in gone:
            slot = self.slots.pop(rid)
            self.held.pop(rid, None)
            self.state.put(slice(slot, slot + 1), RowState.fresh(1, self.device))
            self.free.append(slot)

    def fit(self, width: int) -> None:
        """Room for `width` tokens a row (twice as many when it grows)."""
        have = self.tokens.shape[1]
        if width > have:
            grown = torch.full((self.tokens.shape[0], max(width, 2 * have)), -1, dtype=torch.long, device=self.device)
            grown[:, :have] = self.tokens
            self.tokens = grown

    def to_device(self, host: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The host's values on the device, copied without waiting for it (from pinned memory, as vLLM copies)."""
        from vllm.utils.torch_utils import async_tensor_h2d

        return async_tensor_h2d(host, self.device)


class _Step:
    """One step's draft loop as disco sees it: which requests still draft, their tokens, each window's length.
    All on the draft's device; the host reads it after each position (does any request draft on: vLLM's loop
    goes on or ends) and once at the end (the windows, and what vLLM accepted of the last ones)."""

    def __init__(
        self,
        proposer: Any,
        states: list[RequestState],
        known: np.ndarray,
        slots: torch.Tensor,
        accepted: torch.Tensor,
        live: torch.Tensor,
        may_draft: bool,
        k_max: int,
        context: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ) -> None:
        self.proposer, self.states, self.known, self.slots, self.accepted = proposer, states, known, slots, accepted
        self.verified: list[int] = [int(v) for v in known[:, _VERIFIED]]  # each row's drafts verified this step
        self.accepted_now: list[int] = [0] * len(states)  # ... and accepted (read with the windows)
        self._mark: float | None = None  # when the last position's decision ended (its next forward began)
        self.live, self.may_draft, self.k_max = live, may_draft, k_max
        self.context, self.lengths, self.gen0 = context if context is not None else (None, None, None)
        self.drafted = torch.zeros(len(states), dtype=torch.long, device=live.device)  # each window's length
        self.tokens: list[torch.Tensor] = []
        self.pos = 0
        self.decide_s = 0.0

    def after(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """Draft position pos + 1 is in: which requests stop after it (raises _AllStopped when none goes on)."""
        t0 = time.perf_counter()
        loop = self.proposer.loop
        if loop is not None and self._mark is not None:  # one batched position (the first has vLLM's catch-up)
            loop.position(len(tokens), t0 - self._mark)
        self.pos += 1
        self.tokens.append(tokens)
        feats = None
        if self.context is not None:
            assert self.lengths is not None and self.gen0 is not None
            dist = batch_logit_distribution(logits, tokens)  # (no (B, V) probabilities: features.py says why)
            p_chosen = dist[2]
            gen = self.gen0 + self.pos - 1
            feats = assemble_token_features(dist, tokens, gen, self.context, self.lengths, self.proposer._classes)
            rows = torch.arange(len(tokens), device=tokens.device)
            self.context[rows, self.lengths] = tokens  # the next position's context
            self.lengths = self.lengths + 1
        else:  # the threshold's p_chosen alone: exp(l_token − logsumexp(l))
            p_chosen = (logits.gather(1, tokens[:, None])[:, 0].float() - logits.float().logsumexp(-1)).exp()
        stop = self.proposer.decider.stops(self.pos, feats, p_chosen, self.live)
        self.drafted = torch.where(self.live, self.pos, self.drafted)
        self.live = self.live & ~stop
        done = self.pos >= self.k_max or not bool(self.live.any())  # the position's one read of the device
        self._mark = time.perf_counter()
        self.decide_s += self._mark - t0
        if done:
            raise _AllStopped

    def windows(self) -> list[list[int]]:
        """Each request's draft tokens for vLLM (its own number), remembered for the next step; what vLLM accepted
        of the last ones comes with them (the step's one read of the device) for the counts."""
        n, judged = len(self.states), self.known[:, _VERIFIED]
        accepted, drafted, handed, tokens = [0] * n, [0] * n, [0] * n, [[] for _ in range(n)]
        if self.tokens or judged.any():
            # what goes to verification: the decider's trim of the drafts (batch_policy.verified), by default all
            trimmed = verified(self.proposer.decider, self.drafted) if self.tokens else self.drafted
            stacked = [torch.stack(self.tokens, 1).flatten()] if self.tokens else []
            values = torch.cat([self.accepted, self.drafted, trimmed, *stacked]).tolist()
            accepted, drafted, handed, flat = values[:n], values[n : 2 * n], values[2 * n : 3 * n], values[3 * n :]
            self.accepted_now = accepted
            tokens = [flat[i * self.pos : (i + 1) * self.pos] for i in range(n)]
        held = self.proposer._tables.held
        for i, st in enumerate(self.states):
            if judged[i]:
                st.stats.record_window(int(judged[i]), accepted[i])
            st.window = tokens[i][: handed[i]]
            st.stats.draft_forwards += drafted[i]  # its own positions (the batch may have run more, masked)
            if self.context is not None:  # its tables row now holds its tokens through this step's sampled one
                held[st.request_id] = int(self.known[i, _DONE]) + accepted[i] + 1
        return [st.window for st in self.states]


def _calibrated(predict: Any, proposer: Any) -> Any:
    """The classifier's batched predictor with the closed loop's online calibration on top (per window position,
    on the device): the model's own P(accept) is kept in the tables for the calibration to learn from what vLLM
    verifies, and the calibrated one is what the rule decides with."""

    def calibrated(feats: torch.Tensor) -> torch.Tensor:
        p = predict(feats)
        step, loop = proposer._step, proposer.loop
        if step is None or loop is None or loop.calibration is None:
            return p
        proposer._tables.p[step.slots, step.pos - 1] = p.to(proposer._tables.p.dtype)
        return loop.calibration.calibrate(step.pos, p)

    return calibrated
