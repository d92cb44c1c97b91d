"""disco's policy on vLLM's own batched draft (disco/vllm/draft.py), on tiny float32 Qwen2 models in vLLM:
lossless for every batched policy, a window per request (masked in the batch, keyed by vLLM's request id, freed
with the request), the batched decisions equal the per-request ones, the batch-aware cost rule drafts less
under load, `vllm serve` runs it through disco's vLLM plugin, and bad input fails in one line."""

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
from tiny import EOS
from vllm_pair import (  # noqa: F401 -- pytest fixtures
    K_MAX,
    folders,
    ids,
    logistic_artifact,
    pair,
    reference,
    spec,
    vllm_budgets,
    vllm_generate,
)

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TOKEN_FEATURES
from disco.policies.artifact import DenseModel
from disco.policies.batch_policy import Batch, BatchClassifier, RequestState
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import PolicySpec
from disco.vllm import config as vllm_config_checks
from disco.vllm import settings as vllm_settings
from disco.vllm.engine import SpecConfig


def _consistent(stats, out: list[int]) -> None:
    """A request's counts add up to its own output: 1 token from the prefill, then accepted + 1 per step, the
    last step cut at the budget or EOS (by at most the window and the target's token)."""
    made = 1 + stats.accepted + stats.target_forwards
    assert made - (K_MAX + 1) < len(out) <= made
    assert sum(stats.windows) == stats.drafted and 0 <= stats.accepted <= stats.drafted


@pytest.mark.parametrize(
    "policy",
    [PolicySpec("constant", k=3), PolicySpec("threshold", threshold=0.4), "classifier-token", "classifier-cost"],
    ids=lambda p: p if isinstance(p, str) else p.name,
)
def test_lossless_with_requests_of_different_lengths(pair, ids, spec, reference, policy, tmp_path):
    """Requests submitted together with budgets of 8..40 tokens end at different steps; every batched policy
    gives vLLM target-only's output, and each request's counts add up to its own output."""
    if isinstance(policy, str):
        rule = policy.split("-")[1]
        policy = PolicySpec("classifier", classifier=str(logistic_artifact(tmp_path / "clf", pair, rule, 0.5)))
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(policy)
    outs, rids = vllm_budgets(pair, spec, ids)
    assert outs == reference
    drafted = 0
    for out, rid, prompt in zip(outs, rids, ids):
        stats = proposer.stats_for(prompt, rid)
        _consistent(stats, out)
        drafted += stats.drafted
    assert drafted > 0  # it did speculate


class _StopAt:
    """A stub batched policy: request i of the batch (by its id's position in `order`) stops after stops[i]
    tokens, every window."""

    name = "stop-at"
    reads_features = False

    def __init__(self, stops: dict[str, int]) -> None:
        self.stops_of = stops

    def drafts(self, batch: Batch) -> torch.Tensor:
        self.rows = torch.tensor([self.stops_of[s.request_id.split("-")[0]] for s in batch.states])
        return self.rows > 0

    def start(self, batch, device) -> None:
        pass

    def stops(self, pos, feats, p_chosen, live):
        return self.rows <= pos

    def update(self, state, drafted, accepted) -> None:
        pass


def test_each_request_gets_its_own_window(pair, ids, spec, reference):
    """Each request stops at its own fixed position: every window handed to vLLM at every step has exactly that
    length (the batch drafts to the longest, the others masked), and vLLM verifies exactly that many."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("target"))
    first = int(vllm_generate(pair, spec, [ids[0]], 1)[1][0]) + 1
    want = {str(first + n): n + 1 for n in range(len(ids))}  # vLLM numbers requests in submission order
    proposer.policy = _StopAt(want)
    seen: list[dict[str, int]] = []
    begin = proposer._begin

    def spy(*args, **kwargs):
        step = begin(*args, **kwargs)
        windows = step.windows

        def recorded():
            out = windows()
            seen.append({s.request_id.split("-")[0]: len(w) for s, w in zip(step.states, out)})
            return out

        step.windows = recorded
        return step

    proposer._begin = spy
    try:
        outs, rids = vllm_budgets(pair, spec, ids)
    finally:
        del proposer._begin
    assert outs == reference
    assert [set(s.values()) for s in seen[1:4]] == [set(range(1, len(ids) + 1))] * 3  # all five, ragged
    for step in seen:
        assert all(length == want[rid] for rid, length in step.items())
    for out, rid, prompt in zip(outs, rids, ids):
        stats = proposer.stats_for(prompt, rid)
        assert set(stats.windows) == {want[rid]}  # verified at its own length, every window
        _consistent(stats, out)


def _draft_forwards(proposer) -> list[int]:
    """A counter of the draft model's forwards in vLLM (its catch-up pass included)."""
    calls = [0]
    proposer.model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_policy_that_never_drafts_is_target_only(pair, ids, spec, reference, tmp_path):
    """The target policy, and a cost rule under a load profile where no window pays even when every draft token
    is accepted (a compute-bound CPU: a step costs ~ its tokens), never draft: target-only counts, and vLLM's
    draft never runs, not even its catch-up pass (a threshold policy, which drafts, runs it)."""
    proposer = pair.target_engine.proposer(spec)
    calls = _draft_forwards(proposer)
    compute_bound = CostModel(0.75, (1.0, 1.8), "stub", tuple(0.9 * t for t in range(1, 80)), (0.75, 1.3, 1.9, 2.5))
    artifact = logistic_artifact(tmp_path / "clf", pair, "cost", 1.0)
    for policy, load in (
        (PolicySpec("target"), None),
        (PolicySpec("classifier", classifier=str(artifact)), compute_bound),
    ):
        proposer.set_policy(policy, load)
        assert proposer.never_drafts
        outs, rids = vllm_budgets(pair, spec, ids)
        assert outs == reference
        for out, rid, prompt in zip(outs, rids, ids):
            stats = proposer.stats_for(prompt, rid)
            assert stats.drafted == 0 and stats.draft_forwards == 0 and stats.windows == []
            assert stats.target_forwards == len(out) - 1  # one target step per token after the prefill's
        assert calls[0] == 0
    proposer.set_policy(PolicySpec("threshold", threshold=0.4))
    assert not proposer.never_drafts
    vllm_budgets(pair, spec, ids)
    assert calls[0] > 0


def test_same_prompt_sampled_and_a_second_turn_keep_their_own_state(pair, ids, spec):
    """Four requests with one prompt at temperature 0.8 (different seeds) run together, then a second turn whose
    prompt extends a finished first turn: each request's windows and counts are its own (keyed by vLLM's id)."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("threshold", threshold=0.4))
    prompt = ids[1]
    outs, rids = vllm_generate(pair, spec, [prompt] * 4, 30, temperature=0.8, seeds=[1, 2, 3, 4])
    assert len(set(map(tuple, outs))) > 1  # they did sample differently
    for out, rid in zip(outs, rids):
        _consistent(proposer.stats_for(prompt, rid), out)
    turn2 = prompt + outs[0] + ids[2]
    (out2,), (rid2,) = vllm_generate(pair, spec, [turn2], 20)
    stats2 = proposer.stats_for(turn2, rid2)
    _consistent(stats2, out2)
    assert proposer.requests == {} or all(s.stats.target_forwards < 30 for s in proposer.requests.values())


def test_nothing_is_kept_per_finished_request(pair, ids, spec):
    """500 requests served one after another in groups: the proposer holds no state for finished ones (it
    holds the same after 500 as after 50)."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("threshold", threshold=0.4))
    proposer.settings.keep_stats = False  # as under `vllm serve`
    proposer.finished.clear()  # (earlier tests' counts, never asked for)
    try:
        sizes = []
        for group in range(50):
            vllm_generate(pair, spec, [ids[(group + j) % len(ids)] for j in range(10)], 4)
            if group in (4, 49):
                sizes.append((len(proposer.requests), len(proposer.finished)))
    finally:
        proposer.settings.keep_stats = True
    assert sizes[0] == sizes[1] and sizes[1][1] == 0 and sizes[1][0] <= 10


def _rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(n, len(TOKEN_FEATURES), generator=g)
    return feats


@pytest.mark.parametrize("rule", ["token", "cumulative", "cost", "cost-adaptive"])
def test_batched_classifier_decides_as_the_per_request_one(rule):
    """Each row of BatchClassifier stops where ClassifierPolicy, run on that row alone, stops (same model, rule
    and setting, over several windows with their updates)."""
    cost = CostModel(0.15, tuple(1.0 + 0.08 * k for k in range(9)), "stub")
    setting = {"token": 0.55, "cumulative": 0.6, "cost": 1.3, "cost-adaptive": 1.0}[rule]
    cols = [FEATURES.index(f) for f in ("p_top1", "window_pos", "window_prob_prod", "prev_accepted")]
    W = np.array([[5.0], [-0.3], [1.0], [0.2]])
    model = DenseModel("logistic", np.zeros(4), np.ones(4), [(W, np.array([-2.5]))], "identity", cols)
    n = 6
    batch_policy = BatchClassifier(model.torch_predictor(torch.device("cpu")), rule, setting, cost)
    states = [RequestState(str(i)) for i in range(n)]
    singles = [ClassifierPolicy(model, setting, rule=rule, cost=cost) for _ in range(n)]
    for window in range(4):
        tok = [_rows(n, 10 * window + pos) for pos in range(8)]
        batch = Batch(states, cost)
        live = batch_policy.drafts(batch)
        batch_policy.start(batch, torch.device("cpu"))
        lengths = torch.zeros(n, dtype=torch.long)
        for pos in range(1, 9):
            stop = batch_policy.stops(pos, tok[pos - 1], tok[pos - 1][:, TOKEN_FEATURES.index("p_chosen")], live)
            lengths = torch.where(live, pos, lengths)
            live = live & ~stop
            if not live.any():
                break
        for i, single in enumerate(singles):
            k = 0
            if single.drafts():
                single.start()
                for pos in range(1, 9):
                    k = pos
                    if single.stops(single.p_accept(single.features(tok[pos - 1][i], pos))):
                        break
            assert k == int(lengths[i]), (window, i)
            accepted = k // 2
            single.update(k, accepted)
            batch_policy.update(states[i], k, accepted)


def test_batch_aware_cost_rule_drafts_less_as_concurrency_grows():
    """A memory-bound stub profile (steps of up to 8 tokens cost one token's time): with P(accept) 0.8 the cost
    rule's window shrinks as more requests share the step, to none at 8."""
    c_step = tuple(1.0 if t <= 8 else 1.0 + 0.125 * (t - 8) for t in range(1, 8 * 9 + 1))
    load = CostModel(0.05, c_step[:9], "stub", c_step)
    policy = BatchClassifier(lambda x: torch.full(x.shape[:1], 0.8), "cost", 1.0, load)
    windows = {}
    for b in (1, 2, 4, 8):
        batch = Batch([RequestState(str(i)) for i in range(b)], load.at_load(b, 8))
        live = policy.drafts(batch)
        policy.start(batch, torch.device("cpu"))
        n = 0
        while bool(live.any()) and n < 8:
            n += 1
            feats, p = torch.full((b, len(TOKEN_FEATURES)), 0.8), torch.full((b,), 0.8)
            live = live & ~policy.stops(n, feats, p, live)
        windows[b] = n
    assert windows == {1: 7, 2: 4, 4: 1, 8: 0}


# --- bad input -----------------------------------------------------------------------------------------------


def test_unsupported_vllm_version_in_one_line():
    with pytest.raises(DiscoError, match=r"support vLLM 0\.32 \(installed: 0\.33\.0\)"):
        vllm_settings.check_version("0.33.0")


def test_policy_without_a_batched_form(pair, spec):
    proposer = pair.target_engine.proposer(spec)
    with pytest.raises(DiscoError, match="heuristic policy has no batched form"):
        proposer.set_policy(PolicySpec("heuristic"))
    with pytest.raises(DiscoError, match="threshold policy with these settings has no batched form"):
        proposer.set_policy(PolicySpec("threshold", threshold=0.5, adaptive=True))  # transformers' ROC update
    proposer.set_policy(PolicySpec("target"))


def test_artifact_for_another_pair(pair, spec, tmp_path):
    folder = logistic_artifact(tmp_path / "clf", pair)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["pair"]["tokenizer_hash"] = "0000000000000000"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    proposer = pair.target_engine.proposer(spec)
    with pytest.raises(DiscoError, match="another tokenizer|modified"):
        proposer.set_policy(PolicySpec("classifier", classifier=str(folder)))


def test_a_draft_without_full_logits_is_refused():
    from types import SimpleNamespace as NS

    vllm_config_checks.check_drafter(NS(use_local_argmax_reduction=False))
    with pytest.raises(DiscoError, match="full logits"):
        vllm_config_checks.check_drafter(NS(use_local_argmax_reduction=True))


def test_missing_settings_file(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_settings.ENV, str(tmp_path / "nothing.json"))
    with pytest.raises(DiscoError, match="does not exist"):
        vllm_settings.settings_from_env()


# --- vllm serve -----------------------------------------------------------------------------------------------


def _serve(
    folders, settings: dict | None, port: int, tmp_path: Path, extra: list[str], settings_path: Path | None = None
) -> subprocess.Popen:
    target, draft = folders
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    settings_path = settings_path or tmp_path / "disco-vllm.json"
    if settings is not None:
        settings_path.write_text(json.dumps(settings))
    env[vllm_settings.ENV] = str(settings_path)
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": K_MAX})
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
        "--speculative-config", spec, *extra,
    ]  # fmt: skip
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)


def _served(folders, settings: dict, tmp_path: Path, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """Start `vllm serve` with disco's plugin and `settings`, send `prompts` at once through the openai client
    (greedy), stop the server; the answers."""
    from openai import OpenAI

    port = free_port()
    proc = _serve(folders, settings, port, tmp_path, ["--no-async-scheduling"])
    try:
        assert wait_ready(proc, port), (tmp_path / "server.log").read_text()[-3000:]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0)

        def ask(prompt_ids):
            r = client.completions.create(
                model=str(folders[0]), prompt=prompt_ids, max_tokens=max_tokens, temperature=0.0,
                extra_body={"stop_token_ids": [EOS]},
            )  # fmt: skip
            return r.choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(ask, prompts))
    finally:
        stop_server(proc)
    assert proc.poll() is not None
    return got


def test_vllm_serve_with_the_policy_on_vllms_draft(folders, pair, ids, tmp_path):
    """`vllm serve` with disco's plugin and settings: concurrent greedy requests through the openai client equal
    vLLM's target-only output; the server is stopped by the test."""
    got = _served(folders, {"policy": {"name": "threshold", "threshold": 0.4}}, tmp_path, ids, 24)
    log = (tmp_path / "server.log").read_text()
    assert "disco: the threshold policy decides on vLLM's draft, per request (vLLM's V1 model runner" in log  # in
    want, _ = pair.target_engine.generate_batch(SpecConfig(), ids, 24, pair.eos_token_ids, len(ids))
    assert got == [pair.tokenizer.decode(w, skip_special_tokens=True) for w in want]


def test_vllm_serve_with_a_policy_that_never_drafts(folders, pair, ids, tmp_path):
    """Under `vllm serve` a policy that never drafts answers as target-only and says, once, that this machine is
    better served without speculative decoding (vLLM's speculative path still runs every step)."""
    got = _served(folders, {"policy": {"name": "target"}}, tmp_path, ids[:2], 16)
    said = [line for line in (tmp_path / "server.log").read_text().splitlines() if line.startswith("disco: ")]
    assert len(said) == 1 and said[0].startswith(
        "disco: the target policy decides on vLLM's draft, per request (vLLM's V1"
    )
    assert "DiscoDraftProposer): it never drafts here" in said[0]
    assert "it never drafts here" in said[0] and "without --speculative-config" in said[0]
    want, _ = pair.target_engine.generate_batch(SpecConfig(), ids[:2], 16, pair.eos_token_ids, 2)
    assert got == [pair.tokenizer.decode(w, skip_special_tokens=True) for w in want]


def test_vllm_serve_with_a_missing_settings_file_stops_in_one_line(folders, tmp_path):
    port = free_port()
    proc = _serve(folders, None, port, tmp_path, ["--no-async-scheduling"], settings_path=tmp_path / "nothing.json")
    try:
        assert not wait_ready(proc, port, timeout=180)
    finally:
        stop_server(proc)
    lines = (tmp_path / "server.log").read_text().splitlines()
    said = [line for line in lines if line.startswith("disco: ")]
    assert len(said) == 1 and "nothing.json, which does not exist" in said[0]


def test_at_load_shares_a_batched_draft_position():
    """On vLLM's own draft one position drafts every request at once: a request's share of it is c_draft(b) / b."""
    c_step = tuple(1.0 + 0.01 * t for t in range(1, 40))
    load = CostModel(0.3, c_step[:5], "stub", c_step, (0.3, 0.32, 0.34, 0.36))
    assert load.at_load(1, 4).c_d == 0.3
    assert load.at_load(4, 4).c_d == pytest.approx(0.36 / 4)
    assert load.at_load(8, 3).c_d == pytest.approx(0.36 / 8)  # past the profile: its widest batch's cost
    assert CostModel.from_dict(load.to_dict(), "again").c_draft == load.c_draft


def test_profile_times_vllms_batched_draft(pair, spec):
    """`disco profile --engine vllm` on a pair with a draft folder times vLLM's own draft by batch size."""
    from disco.vllm.stages import profile_load

    result = profile_load(pair, 3, 16, max_batch=2, steps=4, progress=False)
    assert result["proposer"] == "vllm draft"
    assert len(result["c_draft"]) == 2 and 0 < result["c_draft"][0] <= result["c_draft"][1]
    assert result["c_d"] == result["c_draft"][0] and len(result["c_step"]) == 2 * 4
    load = CostModel.from_dict(result, "profile")
    assert load.at_load(2, 3).c_d == pytest.approx(result["c_draft"][1] / 2)


def test_the_last_request_drafting_pays_the_whole_position():
    """On vLLM's draft a position costs one batched forward whatever the number of requests still drafting: with
    the position's cost given, a confident request drafts on while others share the position, and stops sooner
    once it alone would pay for it."""
    c_step = tuple(1.0 if t <= 16 else 1.0 + 0.05 * (t - 16) for t in range(1, 4 * 9 + 1))
    load = CostModel(0.1, c_step[:9], "stub", c_step, (0.4,) * 4)
    confident = torch.tensor([0.97, 0.97, 0.97, 0.97])

    def window(live_from_start: list[bool], position_cost: float | None) -> int:
        """The first request's window when the others stop at once (live_from_start[1:] False) or never."""
        policy = BatchClassifier(lambda x: confident.double(), "cost", 1.0, load)
        batch = Batch([RequestState(str(i)) for i in range(4)], load.at_load(4, 8), position_cost)
        live = policy.drafts(batch) & torch.tensor(live_from_start)
        policy.start(batch, torch.device("cpu"))
        n = 0
        while bool(live[0]) and n < 8:
            n += 1
            feats = torch.full((4, len(TOKEN_FEATURES)), 0.9)
            live = live & ~policy.stops(n, feats, torch.full((4,), 0.9), live)
        return n

    shared = window([True] * 4, 0.4)
    alone = window([True, False, False, False], 0.4)
    assert alone < shared  # alone it pays the whole 0.4 per position, sharing it 0.1
    assert window([True] * 4, None) == window([True, False, False, False], None)  # per-token c_d: no difference
