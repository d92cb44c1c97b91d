"""vLLM as the serving engine, on tiny float32 Qwen2 models (head size 64, which vLLM's CPU attention takes):
disco's proposer inside vLLM is lossless for every policy, follows its policy request by request, the
load-aware cost rule drafts less under load, `vllm serve` runs it, and bad input fails in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import free_port, stop_server, wait_ready
from tiny import EOS, char_tokenizer, perturbed, save_char_tiny, tiny_vllm_qwen

from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.core.cost import CostModel
from disco.formats.prompts import Prompt
from disco.jobs.compare import run_compare
from disco.jobs.runner import runner_for
from disco.loop.decode import DecodeConfig, target_generate
from disco.loop.pair import load_pair
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import PolicySpec
from disco.vllm import side as serving
from disco.vllm.engine import SpecConfig
from disco.vllm.process import PROCESS, Shared
from disco.vllm.settings import ENV
from disco.vllm.stages import VllmRunner

PROMPTS = ["def add(a, b):\n    return", "Hello, world! The quick brown fox", "x = [1, 2, 3]", "ab", "zz top 12"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    target = tiny_vllm_qwen()
    draft = perturbed(target, 0.03)  # agrees with the target most of the time
    return save_char_tiny(target, root / "target"), save_char_tiny(draft, root / "draft")


@pytest.fixture(scope="module")
def pair(folders):
    target, draft = folders
    p = load_pair(PairOptions(target=str(target), draft=str(draft), engine="vllm", dtype="float32"))
    PROCESS.side.pair, PROCESS.side.keep_stats = p, True  # in-process: the tests read the counts
    yield p
    p.target_engine.close()


@pytest.fixture(scope="module")
def ids(pair):
    return [pair.encode(p, False) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(pair, ids):
    outs, _ = pair.target_engine.generate_batch(SpecConfig(), ids, 40, pair.eos_token_ids, len(ids))
    return outs


def _run(pair, ids, policy: PolicySpec, max_tokens=40, k_max=6):
    spec = SpecConfig("custom_class", k_max, serving.PROPOSER)
    llm = pair.target_engine.llm(spec)
    PROCESS.side.proposer.set_policy(policy)
    outs, rids, _ = pair.target_engine.generate_requests(spec, ids, max_tokens, pair.eos_token_ids, len(ids))
    PROCESS.side.proposer.rids = rids  # (the tests ask for each request's counts by vLLM's id)
    return outs, PROCESS.side.proposer, llm


def _all_stats(proposer) -> list:
    return [*proposer.finished.values(), *(r.stats for r in proposer.requests.values())]


@pytest.mark.parametrize(
    "policy",
    [
        PolicySpec("constant", k=3),
        PolicySpec("threshold", threshold=0.4),
        PolicySpec("heuristic"),
        PolicySpec("adaedl"),
        PolicySpec("svip"),
    ],
    ids=lambda p: p.name,
)
def test_lossless_for_every_policy(pair, ids, reference, policy):
    outs, proposer, _ = _run(pair, ids, policy)
    assert outs == reference
    drafted = sum(s.drafted for s in _all_stats(proposer))
    assert drafted > 0  # it did speculate


def test_requests_of_different_lengths_finish_at_different_steps(pair, ids):
    """Budgets of 5..45 tokens submitted together: each request ends at its own step, the others go on."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    budgets = [5, 45, 17, 30, 9]
    spec = SpecConfig("custom_class", 6, serving.PROPOSER)
    llm = pair.target_engine.llm(spec)
    PROCESS.side.proposer.set_policy(PolicySpec("threshold", threshold=0.3))
    plain = pair.target_engine.llm(SpecConfig())
    params = [SamplingParams(temperature=0.0, max_tokens=b, stop_token_ids=[EOS]) for b in budgets]
    prompts = [TokensPrompt(prompt_token_ids=i) for i in ids]
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    want = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert sorted({len(g) for g in got}) == sorted({len(w) for w in want}) and len({len(g) for g in got}) > 2


def test_windows_follow_the_policy_per_request(pair, ids, reference):
    """Constant k = 2: every window of every request drafts exactly 2 tokens (1 near its budget's end),
    counted by the draft forwards (but for the last window: vLLM verifies it and ends the request, and the
    proposer, never asked again, does not see what it kept)."""
    outs, proposer, _ = _run(pair, ids, PolicySpec("constant", k=2))
    assert outs == reference
    for prompt, rid in zip(ids, proposer.rids):
        stats = proposer.stats_for(prompt, rid)
        assert stats is not None and stats.windows
        assert set(stats.windows) <= {1, 2} and stats.windows.count(2) >= len(stats.windows) - 1
        assert sum(stats.windows) == stats.drafted
        assert stats.draft_forwards - stats.drafted in (0, 1, 2)
        assert 0 <= stats.accepted <= stats.drafted


@pytest.mark.parametrize("draft", ["torch", "llama.cpp"])
def test_nothing_is_kept_per_finished_request(request, pair, ids, draft):
    """Under `vllm serve` (keep_stats off) the side-engine proposer keeps nothing per finished request: after
    500 requests served in groups it holds what it held after 50 (on llama.cpp: no sequence of a request that
    left, no more contexts)."""
    llm, proposer = _side(request, pair, draft)
    proposer.set_policy(PolicySpec("threshold", threshold=0.4))
    PROCESS.side.keep_stats = False
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    try:
        sizes = []
        for group in range(50):
            prompts = [TokensPrompt(prompt_token_ids=ids[(group + j) % len(ids)]) for j in range(10)]
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
            if group in (4, 49):
                held = (len(proposer.batch), len(proposer.batch._contexts)) if proposer.batch is not None else ()
                sizes.append((len(proposer.requests), len(proposer.finished), len(proposer.spare_engines), held))
    finally:
        PROCESS.side.keep_stats = True
    assert sizes[0] == sizes[1] and sizes[1][1] == 0
    assert (proposer.batch is not None) == (draft == "llama.cpp")
    if proposer.batch is not None:  # a sequence per request still held (finished, not yet seen gone), no other
        assert len(proposer.batch) <= len(proposer.requests)


def test_a_window_vllm_did_not_verify_is_drafted_on(pair, ids, monkeypatch):
    """vLLM may schedule no drafts for a request in a step (its token budget); when the target's own token then
    equals the window's first draft, the request's tokens are a prefix of what the draft session holds: the
    proposer drafts on from them (it crashed there under `vllm serve`: nothing left to feed)."""
    spec = SpecConfig("custom_class", 6, serving.PROPOSER)
    pair.target_engine.llm(spec)
    proposer = PROCESS.side.proposer
    proposer.set_policy(PolicySpec("constant", k=3))
    ctx = np.asarray(ids[0] + [5], dtype=np.int64)  # the prompt and its first sampled token
    monkeypatch.setattr(PROCESS, "batch_requests", lambda n: (["r0"], {"r0"}))  # as vLLM's runner says
    first = proposer.propose([[5]], np.array([len(ctx)]), ctx[None, :])[0]
    assert len(first) == 3
    unverified = np.concatenate([ctx, first[:1]])  # no draft verified; the target chose the first draft itself
    again = proposer.propose([[first[0]]], np.array([len(unverified)]), unverified[None, :])[0]
    assert len(again) == 3 and again[:2] == first[1:]  # the same draft model, the same path: the same tokens


@pytest.mark.parametrize("draft", ["torch", "llama.cpp"])
def test_same_prompt_sampled_and_a_second_turn_keep_their_own_state(request, pair, ids, draft):
    """The side engine keys each request by vLLM's id (process.PROCESS.batch_requests): four requests with one
    prompt at temperature 0.8 run together, then a second turn extending a finished first one; each has its own
    draft session (llama.cpp: sequence), policy and counts (recognised by their prompt, they took each other's)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, proposer = _side(request, pair, draft)
    proposer.set_policy(PolicySpec("threshold", threshold=0.4))

    def run(prompts, max_tokens, temperature, seeds):
        params = [
            SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_token_ids=[EOS], seed=s) for s in seeds
        ]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        for o in outs:  # a token from the prefill, then at least one a verified window: its own windows only
            stats = proposer.stats_for(o.prompt_token_ids, o.request_id)
            assert 0 < len(stats.windows) <= len(o.outputs[0].token_ids) - 1 and sum(stats.windows) == stats.drafted
        return [list(o.outputs[0].token_ids) for o in outs]

    first = run([ids[1]] * 4, 30, 0.8, [1, 2, 3, 4])
    assert len(set(map(tuple, first))) > 1  # they did sample differently
    run([ids[1] + first[0] + ids[2]], 20, 0.0, [None])
    assert proposer.requests == {}
    assert proposer.batch is None or len(proposer.batch) == 0  # counted requests' sequences are free


# --- the batched llama.cpp draft: one sequence per request, one draft forward per position for all --------


@pytest.fixture(scope="module")
def gguf_side(folders, tmp_path_factory):
    """The tiny pair with its draft as a GGUF on llama.cpp (the side engine's batched draft): its custom_class
    vLLM instance and that instance's proposer. SHARED is restored: the other tests' proposer is the torch one."""
    import shutil

    from tiny_gguf import write_tiny_gguf

    from disco.sources.hub import gguf_tokenizer

    root = tmp_path_factory.mktemp("gguf-side")
    draft = write_tiny_gguf(perturbed(tiny_vllm_qwen(), 0.03), char_tokenizer(), root / "draft.gguf")
    target = shutil.copytree(folders[0], root / "target")
    gguf_tokenizer(draft).save_pretrained(target)  # the tokenizer as the GGUF holds it: the draft's, exactly
    p = load_pair(PairOptions(str(target), str(draft), engine="vllm", dtype="float32", repack="off"))
    saved = PROCESS.side.pair, PROCESS.side.proposer
    PROCESS.side.pair = p
    try:
        llm = p.target_engine.llm(SpecConfig("custom_class", 6, serving.PROPOSER))
        proposer = PROCESS.side.proposer
    finally:
        PROCESS.side.pair, PROCESS.side.proposer = saved
    yield llm, proposer
    p.target_engine.close()


def _side(request, pair, draft: str):
    """The custom_class vLLM instance and its proposer drafting on `draft`: the torch folder or the GGUF."""
    if draft == "llama.cpp":
        return request.getfixturevalue("gguf_side")
    llm = pair.target_engine.llm(SpecConfig("custom_class", 6, serving.PROPOSER))
    return llm, PROCESS.side.proposer


@pytest.mark.parametrize("policy", [PolicySpec("constant", k=3), PolicySpec("threshold", threshold=0.4)], ids=str)
def test_batched_draft_is_lossless_and_drafts_as_one_request_at_a_time(gguf_side, pair, ids, policy):
    """Requests of budgets 5..45 submitted together on the batched llama.cpp draft: the output equals vLLM
    target-only's, and every step's windows (the draft tokens of every request) and each request's counts are
    those of the sequential path (each request on a llama.cpp context of its own, one after another)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, proposer = gguf_side
    budgets = [5, 45, 17, 30, 9]
    params = [SamplingParams(temperature=0.0, max_tokens=b, stop_token_ids=[EOS]) for b in budgets]
    prompts = [TokensPrompt(prompt_token_ids=i) for i in ids]
    plain = pair.target_engine.llm(SpecConfig())
    want = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, params, use_tqdm=False)]
    runs = {}
    inner = proposer.propose
    for batched in (True, False):
        PROCESS.side.batched = batched
        proposer.set_policy(policy)
        assert (proposer.batch is not None) == batched
        steps: list[list[list[int]]] = []
        proposer.propose = lambda *a, **k: steps.append(inner(*a, **k)) or steps[-1]
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            del proposer.propose
            PROCESS.side.batched = True
        assert [list(o.outputs[0].token_ids) for o in outs] == want
        counts = [proposer.stats_for(o.prompt_token_ids, o.request_id) for o in outs]
        runs[batched] = steps, [(c.windows, c.drafted, c.accepted, c.draft_forwards) for c in counts]
    assert runs[True] == runs[False]
    assert max(len(w) for step in runs[True][0] for w in step) > 1 and max(sum(map(bool, s)) for s in runs[True][0]) > 2
    proposer.set_policy(PolicySpec("threshold"))  # back to the batched draft


def test_a_policy_that_never_drafts_is_target_only(pair, ids, reference):
    outs, proposer, _ = _run(pair, ids, PolicySpec("target"))
    assert outs == reference
    assert all(s.drafted == 0 and s.draft_forwards == 0 for s in _all_stats(proposer))


class _Sure:
    """A stub classifier model: every draft token accepted with probability p."""

    hidden_dim = 0
    columns = None

    def __init__(self, p: float) -> None:
        self.p = p

    def predict_proba(self, X):
        return np.full(len(X), self.p)

    def torch_predictor(self, device):
        return lambda feats: torch.tensor(self.p)


def test_load_aware_cost_rule_drafts_less_under_load():
    """A memory-bound stub profile: steps of up to 8 tokens cost one token's time, wider ones grow linearly
    (1/8 per token). At one request 7 drafts ride free; at 8 requests an extra token costs its full share."""
    c_step = tuple(1.0 if t <= 8 else 1.0 + 0.125 * (t - 8) for t in range(1, 8 * 9 + 1))
    load = CostModel(0.05, c_step[:9], "stub", c_step)
    windows = {}
    for batch in (1, 2, 4, 8):  # tokens drafted per window (the stopping one included), 0: no window
        policy = ClassifierPolicy(_Sure(0.8), 1.0, rule="cost", cost=load.at_load(batch, 8))
        n = 0
        if policy.drafts():
            policy.start()
            while n < 8:
                n += 1
                if policy.stops(0.8):
                    break
        windows[batch] = n
    assert windows == {1: 7, 2: 4, 4: 1, 8: 0}
    assert load.at_load(1, 8).c_t == c_step[:9]  # one request: the profile itself


def test_at_load_refuses_a_profile_without_steps():
    with pytest.raises(DiscoError, match="no load profile"):
        CostModel(0.1, (1.0, 1.1)).at_load(2)


def test_serving_compare_rows_and_counts(pair, tmp_path):
    prompts = [Prompt(f"p{i}", "t", p) for i, p in enumerate(PROMPTS[:4])]
    from disco.jobs.compare import Entry

    entries = [Entry("constant k=2", PolicySpec("constant", k=2)), Entry("oracle", PolicySpec("oracle"))]
    cfg = DecodeConfig(max_new_tokens=24, max_window=6)
    result = run_compare(
        pair,
        prompts,
        entries,
        cfg,
        tmp_path / "out",
        chat=False,
        progress=False,
        plots=False,
        concurrency=[1, 3],
        settings={"fixed_k": [(2, "")], "schedule": ((1, 1, 3), (2, 256, 1))},  # vLLM's Dynamic SD: k=3, then 1
    )
    for c in (1, 3):
        summary = result["concurrency"][c]["summary"]
        # vLLM's own rows, disco's policy on vLLM's own draft and on its side engine; no oracle row in vLLM
        assert list(summary) == [
            "target",
            "vllm draft k=2",
            "vllm dynamic SD",
            "vllm draft + constant k=2",
            "vllm + constant k=2",
        ]
        assert summary["vllm dynamic SD"]["lossless"]
        for row in ("vllm draft + constant k=2", "vllm + constant k=2"):
            assert summary[row]["lossless"]
            assert summary[row]["mean_accepted_window"] is not None
            assert summary[row]["decide_ms_per_draft"] >= 0
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert set(saved["concurrency"]) == {"1", "3"}
    # every instance runs as many requests at once, sized once for the compare (instance_seqs)
    built = pair.target_engine._llms.values()
    assert {llm.llm_engine.engine_core.engine_core.scheduler.scheduler_config.max_num_seqs for llm in built} == {8}
    # target-only ran again after each group: the run's drift, measured on vLLM too
    assert set(saved["concurrency"]["3"]["drift"]["samples"]) == {"target again"}
    assert (tmp_path / "out" / "c3" / "table.md").is_file()


def test_one_rule_sizes_every_vllm_instance(folders):
    """vLLM's max_num_seqs comes from one rule (instance_seqs): a --max-batch as given, else the most requests
    submitted together and DEFAULT_VLLM_MAX_SEQS at least; a command's size (compare's levels, collect's and
    profile's --max-batch) holds for every instance it builds, whatever a group later wishes."""
    from disco.base.defaults import DEFAULT_VLLM_MAX_SEQS
    from disco.vllm.engine import VllmTarget, instance_seqs

    assert instance_seqs() == instance_seqs((1,)) == instance_seqs((1, DEFAULT_VLLM_MAX_SEQS)) == DEFAULT_VLLM_MAX_SEQS
    assert instance_seqs((1, 16)) == 16 and instance_seqs((16,), max_batch=4) == instance_seqs(max_batch=4) == 4
    target = VllmTarget(folders[0], None, "float32", 64)
    assert target.max_num_seqs is None  # llm() then builds with instance_seqs()
    target.size(instance_seqs((3,)), fixed=False)  # a group's wish
    target.size(instance_seqs((16,)), fixed=False)
    assert target.max_num_seqs == 16  # wishes grow it
    target.size(instance_seqs((1, 3)))  # compare --concurrency 1,3
    target.size(instance_seqs((32,)), fixed=False)
    assert target.max_num_seqs == DEFAULT_VLLM_MAX_SEQS  # fixed: every level's instance alike
    target.size(instance_seqs(max_batch=4))  # collect --max-batch 4
    assert target.max_num_seqs == 4


def test_the_shared_draft_instance_runs_each_rows_lengths(pair):
    """On CPUs vLLM's own draft rows and disco's share one instance: each row sets vLLM's draft length by batch
    size (its Dynamic SD lookup) and the proposer's policy (None: vLLM's own drafting); output stays lossless."""
    target = pair.target_engine
    shared = target.shared_draft({"fixed_k": [(2, "")]}, 6)
    assert shared is not None and shared.k == 6
    proposer = target.proposer(shared)
    asked: list[tuple[int, int]] = []  # (requests in the step, draft tokens vLLM asked for)
    inner = proposer.propose

    def counted(*args, **kwargs):
        asked.append((kwargs["common_attn_metadata"].batch_size(), kwargs["num_speculative_tokens"]))
        return inner(*args, **kwargs)

    ids = [pair.encode(p, False) for p in PROMPTS[:3]]
    want, _ = target.generate_batch(SpecConfig(), ids, 16, pair.eos_token_ids, 3)
    proposer.propose = counted
    try:
        for schedule in (((1, 1, 3), (2, 256, 1)), ((1, 1, 2),)):
            proposer.set_policy(None)
            target.set_lengths(shared, schedule)
            asked.clear()
            got, _ = target.generate_batch(shared, ids, 16, pair.eos_token_ids, 3)
            assert got == want
            lookup = {b: k for first, last, k in schedule for b in range(first, min(last, 8) + 1)}
            lookup = {b: lookup.get(b, schedule[-1][2]) for b in range(1, 9)}
            assert asked and all(k == lookup[b] for b, k in asked), asked
            assert {b for b, _ in asked} >= {3}
    finally:
        proposer.propose = inner
        target.set_lengths(shared, None)


def test_every_run_pays_its_prefill(pair, monkeypatch):
    """compare runs the same prompts row after row on one instance: each run starts with vLLM's prefix cache
    empty, so no row gets an earlier row's prefill for free (vLLM caches whole blocks: a prompt of several)."""
    target, spec = pair.target_engine, SpecConfig()
    prompt = pair.encode("def add(a, b):\n    return a + b\n" * 40, False)
    llm = target.llm(spec)
    cached: list[int | None] = []
    generate = llm.generate

    def recorded(*args, **kwargs):
        outs = generate(*args, **kwargs)
        cached.extend(o.num_cached_tokens for o in outs)
        return outs

    monkeypatch.setattr(llm, "generate", recorded)
    target.generate_requests(spec, [prompt], 4, pair.eos_token_ids, 1)
    recorded([{"prompt_token_ids": prompt}], use_tqdm=False)  # again, without the reset: served from the cache
    target.generate_requests(spec, [prompt], 4, pair.eos_token_ids, 1)
    assert cached[1] > 0, "vLLM's prefix cache is on here (else this test shows nothing)"
    assert cached[0] == cached[2] == 0


def test_serving_rows_by_proposer(pair):
    """--proposers picks disco's proposers; a policy without a batched form with its knobs (the adaptive
    threshold) runs on the side engine only."""
    from disco.jobs.compare import Entry
    from disco.vllm.stages import serving_rows

    entries = [
        Entry("threshold 0.5", PolicySpec("threshold", threshold=0.5)),
        Entry("threshold adaptive", PolicySpec("threshold", threshold=0.4, adaptive=True)),
    ]

    def labels(proposers: tuple[str, ...]) -> list[str]:
        return [r.label for r in serving_rows(pair, entries, 4, {"fixed_k": [], "proposers": proposers})]

    assert labels(("draft", "side")) == [
        "vllm target-only",
        "vllm draft + threshold 0.5",
        "vllm + threshold 0.5",
        "vllm + threshold adaptive",
    ]
    assert labels(("draft",)) == ["vllm target-only", "vllm draft + threshold 0.5"]
    assert labels(("side",)) == ["vllm target-only", "vllm + threshold 0.5", "vllm + threshold adaptive"]


def test_each_proposer_decides_with_its_own_load_profile(pair, tmp_path, capsys):
    """--load-profile names one profile per proposer (each records which): disco's proposer on vLLM's draft
    decides with the one measured on vLLM's draft, the side engine with its own, silently."""
    from disco.base.machine import this_machine
    from disco.core.load_profiles import SIDE_ENGINE, VLLM_DRAFT, LoadProfiles
    from disco.vllm.engine import DISCO_DRAFT

    files = []
    for proposer, c_d in ((VLLM_DRAFT, 0.5), (SIDE_ENGINE, 0.1)):
        body = {"c_d": c_d, "c_t": [1.0] * 7, "c_step": [1.0] * 64, "machine": this_machine(), "proposer": proposer}
        files.append(tmp_path / f"{proposer.replace(' ', '-')}.json")
        files[-1].write_text(json.dumps({**body, "c_draft": [c_d] * 8} if proposer == VLLM_DRAFT else body))
    runner = VllmRunner(pair, LoadProfiles(files))
    ids = [pair.encode(p, False) for p in PROMPTS[:2]]
    cfg = DecodeConfig(max_new_tokens=8, max_window=6)
    list(runner.decode(ids, PolicySpec("threshold", threshold=0.4), cfg))  # (a batched form: on vLLM's draft)
    on_draft = pair.target_engine.proposer(SpecConfig(DISCO_DRAFT, 6, str(pair.target_engine.draft_folder)))
    assert on_draft.load.c_draft == (0.5,) * 8
    list(runner.decode(ids, PolicySpec("threshold", threshold=0.4, adaptive=True), cfg))  # (the side engine)
    assert PROCESS.side.proposer.load.c_d == 0.1 and PROCESS.side.proposer.load.c_draft == ()
    assert "load profile" not in capsys.readouterr().err


def test_serving_compare_asks_second_turns_after_vllms_own_answers(pair, tmp_path, monkeypatch):
    """mt-bench-2 on vLLM: the first turns are answered by vLLM target-only, together (its target has no
    session), cached, and each second turn is decoded as the whole conversation."""
    from disco.jobs import answers
    from disco.jobs.compare import Entry

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    prompts = [Prompt(f"q{i}", "t-2", p, follow_up="and then?") for i, p in enumerate(PROMPTS[:3])]
    batches: list[int] = []
    real = pair.target_engine.greedy
    decode = VllmRunner.decode  # the runner's decode: only the first turns' answers call it in compare
    monkeypatch.setattr(VllmRunner, "decode", lambda self, ps, *a: batches.append(len(ps)) or decode(self, ps, *a))
    args = (pair, prompts, [Entry("constant k=2", PolicySpec("constant", k=2))], DecodeConfig(12, 4), tmp_path / "o")
    kw = {"chat": False, "progress": False, "plots": False, "concurrency": [1], "settings": {"fixed_k": []}}
    result = run_compare(*args, **kw)
    assert batches == [3]
    firsts = real([pair.encode(p.prompt, False) for p in prompts], 12, pair.eos_token_ids)
    turns = [p.answered(pair.decode(f).strip()) for p, f in zip(prompts, firsts)]
    runs = result["concurrency"][1]["prompts"]
    assert [r["prompt_tokens"] for r in runs] == [len(pair.encode(t.prompt, False)) for t in turns]
    assert result["concurrency"][1]["summary"]["vllm + constant k=2"]["lossless"]
    cached = json.loads(answers.answers_path(answers.answers_record(pair, False, 12)).read_text())["answers"]
    assert set(cached) == {"q0", "q1", "q2"}
    run_compare(*args[:4], tmp_path / "o2", **kw)
    assert batches == [3]  # from the cache


# --- bad input -----------------------------------------------------------------------------------------


def test_draft_with_another_vocabulary(folders, tmp_path):
    target, _ = folders
    other = save_char_tiny(tiny_vllm_qwen(vocab=2048), tmp_path / "other")
    with pytest.raises(DiscoError, match="vocabulary"):
        load_pair(PairOptions(target=str(target), draft=str(other), engine="vllm", dtype="float32"))


def test_target_must_be_a_folder(folders, tmp_path):
    _, draft = folders
    with pytest.raises(DiscoError, match="transformers folder"):
        load_pair(PairOptions(target=str(tmp_path), draft=str(draft), engine="vllm"))


def test_without_vllm_installed_one_line(folders, monkeypatch):
    target, draft = folders
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(DiscoError, match=r"needs vLLM, which is not installed: pip install 'disco-spec\[vllm\]'"):
        load_pair(PairOptions(target=str(target), draft=str(draft), engine="vllm"))


def test_cli_without_vllm(folders, tmp_path):
    """The CLI in a process where vLLM cannot import: one line, exit 1, no traceback."""
    target, draft = folders
    code = (
        "import sys; sys.modules['vllm'] = None; sys.argv = ['disco', 'compare', '--engine', 'vllm', "
        f"'--target', {str(target)!r}, '--draft', {str(draft)!r}, '--prompts', 'code-test', '--out', "
        f"{str(tmp_path / 'o')!r}]; from disco.cli.cli import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "needs vLLM, which is not installed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_artifact_for_another_pair(pair, tmp_path):
    artifact = tmp_path / "art"
    artifact.mkdir()
    manifest = {"pair": {"tokenizer_hash": "0000000000000000", "target": "x", "draft": "y"}}
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiscoError):
        PolicySpec("classifier", classifier=str(artifact)).build(pair=pair)


def test_missing_proposer_settings(monkeypatch, capsys):
    monkeypatch.setattr(PROCESS, "side", Shared())
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(DiscoError, match=ENV) as refused:
        serving.DiscoProposer(_FakeConfig())
    assert capsys.readouterr().err == f"disco: {refused.value}\n"  # before vLLM's own report of it
    monkeypatch.setenv(ENV, json.dumps({"policy": {"name": "classifier", "classifier": "/no/such"}}))
    with pytest.raises(DiscoError, match="not an artifact"):
        serving._load_shared_from_env()


class _FakeConfig:
    class speculative_config:  # noqa: N801 -- vLLM's attribute name
        num_speculative_tokens = 4


def test_the_draft_gets_no_more_threads_than_the_worker_has_cores(folders, tmp_path, monkeypatch, capsys):
    """vLLM's CPU worker under `vllm serve` is bound to one core: the proposer's llama.cpp draft runs one thread
    there, by default and when more were asked (said in one line)."""
    import shutil

    from tiny_gguf import write_tiny_gguf

    from disco.sources.hub import gguf_tokenizer

    draft = write_tiny_gguf(perturbed(tiny_vllm_qwen(), 0.03), char_tokenizer(), tmp_path / "draft.gguf")
    target = shutil.copytree(folders[0], tmp_path / "target")
    gguf_tokenizer(draft).save_pretrained(target)  # the tokenizer as the GGUF holds it: the draft's, exactly
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    for threads in (None, 4):
        options = PairOptions(str(target), str(draft), engine="vllm", dtype="float32", threads=threads, repack="off")
        assert load_pair(options).draft.describe()["threads"] == 1
    assert capsys.readouterr().err.count("the draft gets 1 thread, not the 4 asked") == 1


# --- vllm serve with disco's proposer --------------------------------------------------------------------


def _serve(folders, settings: dict, port: int, tmp_path: Path) -> subprocess.Popen:
    target, _ = folders
    settings_file = tmp_path / "disco-vllm.json"
    settings_file.write_text(json.dumps(settings))
    env = {**os.environ, ENV: str(settings_file), "VLLM_CPU_KVCACHE_SPACE": "1"}
    spec = json.dumps({"method": "custom_class", "model": serving.PROPOSER, "num_speculative_tokens": 6})
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
        "--speculative-config", spec,
    ]  # fmt: skip
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)


def test_vllm_serve_with_disco_policy(folders, pair, ids, tmp_path):
    """`vllm serve` with disco's proposer: concurrent greedy requests through the openai client equal
    vLLM's target-only output."""
    from openai import OpenAI

    target, draft = folders
    settings = {"policy": {"name": "threshold", "threshold": 0.4}, "pair": {"target": str(target), "draft": str(draft)}}
    port = free_port()
    proc = _serve(folders, settings, port, tmp_path)
    try:
        assert wait_ready(proc, port), (tmp_path / "server.log").read_text()[-3000:]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0)

        def ask(prompt_ids):
            r = client.completions.create(
                model=str(target), prompt=prompt_ids, max_tokens=24, temperature=0.0,
                extra_body={"stop_token_ids": [EOS], "return_token_ids": True},
            )  # fmt: skip
            return r.choices[0].text

        with ThreadPoolExecutor(len(ids)) as pool:
            got = list(pool.map(ask, ids))
    finally:
        stop_server(proc)
    assert proc.poll() is not None
    want, _ = pair.target_engine.generate_batch(SpecConfig(), ids, 24, pair.eos_token_ids, len(ids))
    assert got == [pair.tokenizer.decode(w, skip_special_tokens=True) for w in want]


def test_vllm_serve_with_a_missing_artifact_stops_in_one_line(folders, tmp_path):
    target, draft = folders
    settings = {
        "policy": {"name": "classifier", "classifier": str(tmp_path / "nothing")},
        "pair": {"target": str(target), "draft": str(draft)},
    }
    port = free_port()
    proc = _serve(folders, settings, port, tmp_path)
    try:
        assert not wait_ready(proc, port, timeout=180)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            stop_server(proc)
    assert proc.returncode != 0
    log = (tmp_path / "server.log").read_text()
    said = f"disco: the proposer's classifier {tmp_path / 'nothing'} is not an artifact (no manifest.json): check"
    lines = [line for line in log.splitlines() if line.startswith(said)]
    assert len(lines) == 1, log[-3000:]  # one line of disco's, before vLLM's "Engine core initialization failed"
    assert log.index(lines[0]) < log.index("Engine core initialization failed"), log[-3000:]


def test_generate_with_the_policy_inside_vllm(pair, ids, reference):
    results = list(
        runner_for(pair).decode(ids, PolicySpec("threshold", threshold=0.4), DecodeConfig(max_new_tokens=40))
    )
    assert [r.tokens for r in results] == reference
    assert sum(r.stats.drafted for r in results) > 0 and all(r.stats.wall_s > 0 for r in results)
    plain = list(runner_for(pair).decode(ids, PolicySpec("target"), DecodeConfig(max_new_tokens=40)))
    assert [r.tokens for r in plain] == reference and all(r.stats.drafted == 0 for r in plain)


def test_session_says_where_vllm_runs(pair):
    """The vLLM target has no sessions (engines.base.EngineBase): what needs one (disco's loop) says where vLLM runs."""
    assert not hasattr(pair.target_engine, "session")
    with pytest.raises(DiscoError, match="vLLM runs its own decoding loop"):
        target_generate(pair.target, [1, 2], DecodeConfig(max_new_tokens=4))
