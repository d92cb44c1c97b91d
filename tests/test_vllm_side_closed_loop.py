"""The closed loop on the side engine (side.DiscoProposer under online.closed_loop.ClosedLoop; docs/vllm.md, "Closed
loop"): lossless at one request and four, a wrong seed profile (×3, ×⅓) corrected by the costs the proposer measures
at the second step of a stream, and the governor drafting nothing (no draft forward at all) where drafting loses,
said once. Each runs three times: on a stub of vLLM's side of the custom_class interface (StubVllm: greedy,
synchronous, no vLLM started) with the tiny pair's draft on torch (a session per request) and on llama.cpp (the
batched draft), and on vLLM itself with the tiny float32 pair (tests/vllm_pair.py). The loop
sees a synthetic clock (closed_loop_clock.py), so nothing here depends on the machine's load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from closed_loop_clock import SEED, TABLE_BATCH, matches, scaled, synthetic_clock
from helpers import one_error_line
from tiny import EOS, char_tokenizer, tiny_pair
from tiny_gguf import write_tiny_gguf
from vllm_pair import K_MAX, PROMPTS, folders, logistic_artifact, pair  # noqa: F401 -- pytest fixtures

from disco.base.defaults import CLOSED_LOOP_PROBES, GOVERNOR_HOLD, GOVERNOR_WINDOW
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.loop.engine_registry import as_engine
from disco.loop.pair import load_pair, pair_from_models
from disco.policies.policy_registry import PolicySpec
from disco.vllm.engine import PROPOSER, SpecConfig
from disco.vllm.process import PROCESS, Shared
from disco.vllm.settings import ENV
from disco.vllm.side import DiscoProposer, _load_shared_from_env

SIDE = SpecConfig("custom_class", K_MAX, PROPOSER)
BUDGETS = [8 + 8 * n for n in range(len(PROMPTS))]  # requests finish at different steps
# the warm-up probes of a stream's first batch band (ClosedLoop._band_probes: k = 0 and each length three times)
PROBES = 3 + 3 * len([k for k in CLOSED_LOOP_PROBES if k <= K_MAX])
# a draft position costs five target steps: no window pays, however many of its tokens are accepted
COSTLY_DRAFT = dataclasses.replace(SEED, c_draft=tuple(0.05 * b for b in range(1, TABLE_BATCH + 1)), source="costly")


class StubVllm:
    """vLLM's side of the custom_class interface (what process.PROCESS.runner shows the proposer, and the propose()
    call), greedy and synchronous, on a torch target: each step verifies every running request's drafts (the leading
    run the target agrees with, then its own token), cuts at the request's budget, and asks the proposer for the next
    drafts; a request is still in the step it finished in and gone at the next, as in vLLM's runner."""

    def __init__(self, target: torch.nn.Module) -> None:
        self.target = target
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests: dict[str, Any] = {}
        self.query_start_loc = SimpleNamespace(np=np.zeros(1, dtype=np.int64))  # the step's tokens, row by row
        self.made = 0  # requests so far (their ids)

    @torch.inference_mode()
    def greedy(self, tokens: list[int], last: int) -> list[int]:
        """The target's greedy token after each of the last `last` prefixes of `tokens`."""
        return self.target(torch.tensor([tokens])).logits[0, -last:].argmax(-1).tolist()

    def run(self, proposer: DiscoProposer, prompts: list[list[int]], budgets: list[int], together: int):
        outs: list[list[int]] = [[] for _ in prompts]
        waiting, running = list(range(len(prompts))), {}
        while waiting or running:
            while waiting and len(running) < together:
                i = waiting.pop(0)
                self.made += 1
                running[f"stub-{self.made}"] = SimpleNamespace(i=i, tokens=list(prompts[i]), drafts=None)
            rows, sampled, qlen = list(running), [], []
            for rid in rows:
                req = running[rid]
                drafts = req.drafts or []
                target = self.greedy(req.tokens + drafts, len(drafts) + 1)
                n = next((j for j, (d, t) in enumerate(zip(drafts, target)) if d != t), len(drafts))
                new = (drafts[:n] + [target[n]])[: budgets[req.i] - len(outs[req.i])]
                qlen.append(len(req.tokens) if req.drafts is None else len(drafts) + 1)  # (its prefill, or a window)
                req.tokens += new
                outs[req.i] += new
                sampled.append(new)
            self.input_batch.req_ids, self.requests = rows, dict(running)
            self.query_start_loc.np = np.concatenate([[0], np.cumsum(qlen)])
            lengths = np.array([len(running[rid].tokens) for rid in rows])
            token_ids = np.zeros((len(rows), int(lengths.max()) + K_MAX), dtype=np.int64)
            for j, rid in enumerate(rows):
                token_ids[j, : lengths[j]] = running[rid].tokens
            for rid, drafts in zip(rows, proposer.propose(sampled, lengths, token_ids)):
                running[rid].drafts = drafts
            for rid in rows:
                if len(outs[running[rid].i]) >= budgets[running[rid].i]:
                    running.pop(rid)
        return outs


class StubHarness:
    """The side engine on StubVllm, the tiny pair (noise 0.3: the draft agrees often, not always): its draft on torch
    (a session per request, one after another) or, given a folder for the files, written as GGUF files on llama.cpp
    (one batched draft, a forward per position for all requests)."""

    def __init__(self, gguf_root: Path | None = None) -> None:
        target, draft = (m.requires_grad_(False) for m in tiny_pair(noise=0.3, dtype=torch.float32))
        self.pair = pair_from_models(target, draft, char_tokenizer())
        self.pair.draft = as_engine(self.pair.draft)  # (the proposer drafts on an engine, as a vLLM pair's is)
        if gguf_root is not None:
            tok = char_tokenizer()
            files = [write_tiny_gguf(m, tok, gguf_root / f"{name}.gguf") for m, name in ((target, "t"), (draft, "d"))]
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("DISCO_CACHE", str(gguf_root / "cache"))
                self.pair = load_pair(PairOptions(*map(str, files), engine="llama.cpp", threads=1))
        self.vllm = StubVllm(target)
        self.ids = [self.pair.encode(p, chat=False) for p in PROMPTS]
        PROCESS.side, PROCESS.runner = Shared(pair=self.pair), self.vllm
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=K_MAX),
            scheduler_config=SimpleNamespace(max_num_seqs=TABLE_BATCH),
        )
        self.proposer = DiscoProposer(config)

    def run(self, prompts: list[list[int]], budgets: list[int], together: int) -> list[list[int]]:
        PROCESS.runner = self.vllm
        return self.vllm.run(self.proposer, prompts, budgets, together)

    def reference(self, prompts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        outs = []
        for prompt, budget in zip(prompts, budgets):
            tokens = list(prompt)
            while len(tokens) < len(prompt) + budget:
                tokens += self.vllm.greedy(tokens, 1)
            outs.append(tokens[len(prompt) :])
        return outs


class VllmHarness:
    """The side engine in vLLM (custom_class, in-process) on the tiny float32 pair."""

    def __init__(self, pair) -> None:
        self.pair = pair
        PROCESS.side = Shared(pair=pair)
        pair.target_engine.llm(SIDE)  # built once: its proposer registers itself in PROCESS.side
        self.proposer = PROCESS.side.proposer
        self.ids = [pair.encode(p, False) for p in PROMPTS]
        self._reference: dict[tuple, list[int]] = {}

    def _generate(self, spec: SpecConfig, prompts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(temperature=0.0, max_tokens=b, stop_token_ids=[EOS]) for b in budgets]
        llm = self.pair.target_engine.llm(spec)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def run(self, prompts: list[list[int]], budgets: list[int], together: int) -> list[list[int]]:
        outs = []
        for s in range(0, len(prompts), together):
            outs += self._generate(SIDE, prompts[s : s + together], budgets[s : s + together])
        return outs

    def reference(self, prompts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        """vLLM target-only's outputs, each request alone."""
        for prompt, budget in zip(prompts, budgets):
            if (tuple(prompt), budget) not in self._reference:
                self._reference[tuple(prompt), budget] = self._generate(SpecConfig(), [prompt], [budget])[0]
        return [self._reference[tuple(p), b] for p, b in zip(prompts, budgets)]


@pytest.fixture(scope="module", params=["stub", "stub-llama.cpp", "vllm"])
def harness(request, tmp_path_factory):
    saved = PROCESS.side, PROCESS.runner
    try:
        if request.param == "stub":
            yield StubHarness()
        elif request.param == "stub-llama.cpp":
            yield StubHarness(tmp_path_factory.mktemp("gguf"))
        else:
            pytest.importorskip("vllm")
            yield VllmHarness(request.getfixturevalue("pair"))
    finally:
        PROCESS.side, PROCESS.runner = saved


def _record(monkeypatch, proposer: DiscoProposer, costs: bool = False) -> list[SimpleNamespace]:
    """Each step the proposer runs from now on: its windows' lengths, the draft forwards it ran, and (costs) the
    running table's cost model after it."""
    steps: list[SimpleNamespace] = []
    propose = proposer.propose

    def recorded(*args: Any, **kwargs: Any) -> list[list[int]]:
        before = proposer.n_forwards
        windows = propose(*args, **kwargs)
        model = proposer.loop.cost_model() if costs and proposer.loop is not None else None
        steps.append(
            SimpleNamespace(windows=[len(w) for w in windows], forwards=proposer.n_forwards - before, costs=model)
        )
        return windows

    monkeypatch.setattr(proposer, "propose", recorded)  # (vLLM's runner calls its drafter's propose by name)
    return steps


@pytest.mark.parametrize("rule", ["threshold", "classifier-cost"])
def test_lossless_under_the_closed_loop_at_one_request_and_four(harness, rule, monkeypatch, tmp_path):
    """Probes, the policy or the governor's lengths, a classifier's P(accept) through the calibration: every output
    is target-only's, one request at a time and four together, and the loop measured the steps and the positions."""
    synthetic_clock(monkeypatch)  # (drafting pays: which windows the policy decides does not depend on the load)
    policy = PolicySpec("threshold", threshold=0.4)
    if rule != "threshold":
        policy = PolicySpec(
            "classifier", classifier=str(logistic_artifact(tmp_path / "clf", harness.pair, "cost", 1.0))
        )
    proposer = harness.proposer
    proposer.set_policy(policy, SEED, closed_loop=True)
    alone = harness.run(harness.ids, BUDGETS, 1)
    together = harness.run(harness.ids[:4], BUDGETS[:4], 4)
    reference = harness.reference(harness.ids, BUDGETS)
    assert alone == reference and together == reference[:4]
    loop = proposer.loop
    assert loop is not None and loop.costs.steps.observed > 0 and loop.costs.drafts.observed > 0
    assert loop.governor.steps > 0
    calibration = loop.calibration
    if rule == "threshold":
        assert calibration is None  # (no model's P(accept) to calibrate)
    else:  # the model's P(accept) of the windows the classifier decided met what was verified
        assert calibration is not None and int(calibration.seen[1]) > 0


@pytest.mark.parametrize("by", [3.0, 1 / 3])
def test_a_wrong_seed_is_corrected_at_the_second_step(harness, by, monkeypatch):
    """A seed ×3 or ×⅓ (another machine's profile, an in-process one) and a process whose steps cost SEED's seconds:
    the running table is the seed at the first step (nothing timed yet) and SEED in every bucket, observed or not,
    from the second on (online_costs.OnlineCosts: the first observation of each kind corrects the scale; the first
    step's target step is timed at the second, whose probe of two drafts times the first draft position). The target
    steps are timed by the tokens vLLM's runner ran: five requests verifying three drafts each, 20."""
    synthetic_clock(monkeypatch)
    proposer = harness.proposer
    assert proposer.max_seqs == TABLE_BATCH  # (SEED covers the running table's every bucket)
    proposer.set_policy(PolicySpec("constant", k=3), scaled(SEED, by), closed_loop=True)
    steps = _record(monkeypatch, proposer, costs=True)
    harness.run(harness.ids, [40] * len(harness.ids), len(harness.ids))
    assert not matches(steps[0].costs, SEED) and matches(steps[0].costs, scaled(SEED, by))
    assert all(matches(step.costs, SEED) for step in steps[1:]), [step.costs.source for step in steps]
    assert proposer.loop.costs.steps.count[5 * (3 + 1) - 1] > 0


def test_the_governor_drafts_nothing_where_drafting_loses(harness, monkeypatch, capsys):
    """A process where a draft position costs five target steps (COSTLY_DRAFT) and a policy that always drafts
    K_MAX: after the probes and one judged spell of the policy (GOVERNOR_WINDOW steps, judged every GOVERNOR_WINDOW / 8)
    the governor drafts nothing for a hold of GOVERNOR_HOLD steps at least, in which the draft runs no forward at all
    (off means off: each request's draft catches up at its next window), says so once, and the outputs stay
    target-only's."""
    synthetic_clock(monkeypatch, COSTLY_DRAFT)
    monkeypatch.setattr(PROCESS, "said", set())  # (the line is said once per process)
    proposer = harness.proposer
    proposer.set_policy(PolicySpec("constant", k=K_MAX), closed_loop=True)  # (no seed: the probes warm the table)
    steps = _record(monkeypatch, proposer)
    bound = PROBES + GOVERNOR_WINDOW + GOVERNOR_WINDOW // 8
    prompts: list[list[int]] = []
    outs: list[list[int]] = []
    while len(steps) < bound + GOVERNOR_HOLD + 1:  # requests one after another, the prompts in turn
        prompts.append(harness.ids[len(prompts) % len(harness.ids)])
        outs += harness.run(prompts[-1:], [40], 1)
    held = range(len(steps) - GOVERNOR_HOLD + 1)
    off = next((i for i in held if not any(sum(s.windows) for s in steps[i : i + GOVERNOR_HOLD])), None)
    assert off is not None and off <= bound, ([sum(s.windows) for s in steps], proposer.loop.governor.estimates)
    assert all(s.forwards == 0 for s in steps[off : off + GOVERNOR_HOLD])
    assert capsys.readouterr().err.count("drafting does not pay") == 1
    assert outs == harness.reference(prompts, [40] * len(prompts))


def test_the_settings_turn_the_closed_loop_on_for_the_side_engine(monkeypatch, folders):
    """`vllm serve` with the side-engine proposer: "closed_loop" in DISCO_VLLM_POLICY reaches the proposer's settings
    (process.PROCESS.side); anything but true or false stops in one line."""
    monkeypatch.setattr(PROCESS, "side", Shared())
    monkeypatch.setenv(ENV, '{"policy": {"name": "threshold"}, "closed_loop": "yes"}')
    with pytest.raises(DiscoError) as e:
        _load_shared_from_env()
    assert one_error_line(f"error: {e.value}") == f"error: {ENV}: \"closed_loop\" is true or false, not 'yes'"
    target, draft = folders
    pair = {"target": str(target), "draft": str(draft), "dtype": "float32"}
    monkeypatch.setenv(ENV, json.dumps({"pair": pair, "policy": {"name": "threshold"}, "closed_loop": True}))
    _load_shared_from_env()
    assert PROCESS.side.closed_loop is True and PROCESS.side.load is None  # (no profile: a warm-up seeds it)
