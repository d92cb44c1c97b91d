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

from disco.batch_policy import Batch, BatchPolicy, RequestState, never_drafts
from disco.cost import CostModel
from disco.embedded import pair_name
from disco.errors import DiscoError, said_in_one_line
from disco.features import assemble_token_features, batch_logit_distribution, token_class_table
from disco.hub import load_tokenizer, tokenizer_hash
from disco.policy_registry import BatchContext, PolicySpec
from disco.vllm.config import check_drafter, first_rank, in_effect
from disco.vllm.process import PROCESS, take_stats
from disco.vllm.settings import ENV, settings_from_env


class _AllStopped(Exception):
    """Raised inside vLLM's draft loop once no request drafts on: the loop ends there."""


_CLASS: list[type] = []  # DiscoDraftProposer, once defined


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
        self.set_policy(settings.policy, settings.load)
        PROCESS.proposers.append(self)
        if not first_rank():
            return  # under tensor parallelism every rank decides alike: one line
        said = (
            f"disco: the {settings.policy.name} policy decides on vLLM's draft, per request ({in_effect(runner, self)})"
        )
        if self.never_drafts and armed is None:  # (serving; in-process compare arms the target policy first)
            # vLLM still runs its speculative path every step, no draft proposed: the worker's draft bookkeeping
            # and one more call from the engine for the drafts (bench/RESULTS.md, "Sixth session")
            said += (
                ": it never drafts here (batch_policy.never_drafts: no window pays at any batch size, or the target "
                "policy), so vLLM's draft is skipped; serving this machine without --speculative-config spares "
                "vLLM's speculative path too (1-4 % a step at one request)"
            )
        print(said, file=sys.stderr)

    # --- the policy ---------------------------------------------------------------------------------

    def set_policy(self, spec: PolicySpec | None, load: CostModel | None = None) -> None:
        """Decide with `spec` from now on (compare's rows switch it between runs); None: vLLM's own draft-model
        decoding (compare's rows of vLLM's own fixed lengths and Dynamic SD share this instance on CPUs)."""
        self.own = spec is None
        self.decide_s, self.forward_s, self.n_positions = 0.0, 0.0, 0
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
        self._step = self._begin(cad.batch_size(), num_speculative_tokens, kwargs["next_token_ids"], cad, kwargs)
        step = self._step
        k = num_speculative_tokens if bool(step.live.any()) else 0  # 0: vLLM only keeps the draft's KV in sync
        try:
            if k or not self.never_drafts:  # (no request will ever draft: the draft's KV is never read)
                super().propose(k, *args, **kwargs)  # type: ignore[misc]
        except _AllStopped:
            pass
        finally:
            self._step = None
        self.forward_s += time.perf_counter() - t0 - step.decide_s
        self.decide_s += step.decide_s
        self.n_positions += step.pos
        return step.windows()

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any):
        if self._step is None:
            return super()._sample_draft_tokens(hidden_states, sampling_metadata)  # type: ignore[misc]
        logits = self.model.compute_logits(hidden_states)  # type: ignore[attr-defined]
        tokens = logits.argmax(-1)  # disco drafts greedily (vLLM's rejection sampler verifies, sampling or not)
        self._step.after(logits, tokens)
        return tokens, None

    def _begin(self, n: int, k_max: int, next_token_ids: torch.Tensor, cad: Any, kwargs: dict) -> _Step:
        """This step's batch: each row's request (by id), what vLLM accepted of its last window (told to the
        policy), whether it drafts now, and its context for the features."""
        runner = self._runner
        ib = runner.input_batch
        ids = list(ib.req_ids[:n])
        for gone in [r for r in self.requests if r not in runner.requests]:  # finished or aborted: freed
            state = self.requests.pop(gone)
            if self.settings is not None and self.settings.keep_stats:
                self.finished[gone] = state.stats
        for rid in set(self.requests) - set(ids):  # preempted: its last window was never verified
            self.requests[rid].window = []
        rejected = kwargs.get("num_rejected_tokens_gpu")
        rejected = rejected.tolist() if rejected is not None else [0] * n
        qlen = np.diff(cad.query_start_loc_cpu[: n + 1].numpy())
        nxt = next_token_ids.tolist()
        states, tails = [], []
        for i, rid in enumerate(ids):
            seen = rid in self.requests
            st = self.requests.setdefault(rid, RequestState(rid))
            accepted = 0
            if seen:
                st.stats.target_forwards += 1  # this step's target forward (the prefill is not counted)
            if st.window and 0 < qlen[i] - 1 <= len(st.window):  # a decode step verifying its last window
                scheduled = int(qlen[i]) - 1
                accepted = scheduled - int(rejected[i])
                self.policy.update(st, scheduled, accepted)
                st.stats.record_window(scheduled, accepted)
            tails.append(st.window[:accepted] + [int(nxt[i])])  # what this step added to the request
            st.window = []
            states.append(st)
        batch = Batch.under(states, self.load, self._k_most())
        drafts = self.policy.drafts(batch)  # (B,) on the host
        live = drafts.to(self.device)
        context = lengths = gen0 = None
        if self.policy.reads_features and bool(drafts.any()):  # (no request drafting: no features to compute)
            context, lengths, gen0 = self._contexts(ids, tails, k_max)
        self.policy.start(batch, self.device)
        return _Step(self, states, live, k_max, context, lengths, gen0)

    def _contexts(self, ids: list[str], tails: list[list[int]], k_max: int):
        """Each row's tokens so far (prompt, output, this step's accepted drafts and sampled token) as a (B, L)
        tensor padded with -1 and room for the window; their lengths; the generated index of the first draft."""
        runner = self._runner
        ib = runner.input_batch
        done = ib.num_tokens_no_spec[: len(ids)].astype(np.int64)  # vLLM's tokens before this step's
        lengths = done + np.array([len(t) for t in tails], dtype=np.int64)
        ctx = np.full((len(ids), int(lengths.max()) + k_max), -1, dtype=np.int64)
        for i, tail in enumerate(tails):
            ctx[i, : done[i]] = ib.token_ids_cpu[i, : done[i]]
            ctx[i, done[i] : lengths[i]] = tail
        prompt = np.array([runner.requests[r].num_prompt_tokens for r in ids], dtype=np.int64)
        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return to(ctx), to(lengths), to(lengths - prompt)


class _Step:
    """One step's draft loop as disco sees it: which requests still draft, their tokens, each window's length."""

    def __init__(
        self,
        proposer: Any,
        states: list[RequestState],
        live: torch.Tensor,
        k_max: int,
        context: torch.Tensor | None,
        lengths: torch.Tensor | None,
        gen0: torch.Tensor | None,
    ) -> None:
        self.proposer, self.states, self.live, self.k_max = proposer, states, live, k_max
        self.context, self.lengths, self.gen0 = context, lengths, gen0
        self.drafted = torch.zeros(len(states), dtype=torch.long, device=live.device)  # each window's length
        self.tokens: list[torch.Tensor] = []
        self.pos = 0
        self.decide_s = 0.0

    def after(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """Draft position pos + 1 is in: which requests stop after it (raises _AllStopped when none goes on)."""
        t0 = time.perf_counter()
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
        stop = self.proposer.policy.stops(self.pos, feats, p_chosen, self.live)
        self.drafted = torch.where(self.live, self.pos, self.drafted)
        self.live = self.live & ~stop
        done = self.pos >= self.k_max or not bool(self.live.any())  # the decision's one host sync
        self.decide_s += time.perf_counter() - t0
        if done:
            raise _AllStopped

    def windows(self) -> list[list[int]]:
        """Each request's draft tokens for vLLM (its own number), remembered for the next step."""
        if not self.tokens:
            return [[] for _ in self.states]
        tokens = torch.stack(self.tokens, 1).tolist()
        out = [row[:k] for row, k in zip(tokens, self.drafted.tolist())]
        for st, window in zip(self.states, out):
            st.window = window
            st.stats.draft_forwards += len(window)  # its own positions (the batch may have run more, masked)
        return out
