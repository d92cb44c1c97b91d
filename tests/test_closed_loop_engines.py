"""The closed loop in disco's own loop (closed_loop_policy.LoopStream / ClosedLoopPolicy, docs/architecture.md, "Closed
loop"), on the tiny torch pair and the tiny GGUF pair on llama.cpp: lossless (the output is target-only's), a wrong
seed (costs ×3 and ×⅓) corrected by the costs the run times, the governor falling back to drafting nothing where
the draft never agrees, and --closed-loop through the CLI. The modules' own bounds: tests/test_closed_loop.py; on
vLLM's draft: tests/test_vllm_closed_loop.py; on the side engine: tests/test_vllm_side_closed_loop.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from closed_loop_clock import matches, scaled, synthetic_clock
from helpers import cli, cli_args, one_error_line
from tiny import StubLM

from disco.base.defaults import CALIBRATION_REFIT, GOVERNOR_HOLD
from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import FEATURES
from disco.jobs.runner import check_closed_loop
from disco.loop.decode import DecodeConfig, generate_ids, speculative_generate, target_generate
from disco.policies.artifact import DenseModel, save_artifact
from disco.policies.closed_loop_policy import LoopStream
from disco.policies.policy import ConstantPolicy
from disco.policies.policy_registry import PolicySpec

PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "Hello, world! The quick brown fox",
    "x = [1, 2, 3]\nfor i in x:",
    "class Point:\n    def __init__(self",
    "SELECT name FROM users WHERE",
    "# sort a list\ndef sort(xs):",
]
MAX_WINDOW = 6
CONFIG = DecodeConfig(max_new_tokens=48, max_window=MAX_WINDOW)
# what the loop's clock reads in these tests (closed_loop_clock.synthetic_clock): a verification over t tokens
# costs 2 + 0.1 (t - 1) ms, a draft position 1 ms, whatever the load of the machine (so every decision, and with
# it every output, is the same run after run)
_C_T = tuple(2e-3 + 1e-4 * k for k in range(MAX_WINDOW + 1))
TRUTH = CostModel(1e-3, _C_T, "truth", _C_T, (1e-3,))


def _artifact(folder, pair, rule: str) -> str:
    """A hand-made logistic model over p_top1 and window_pos (P(accept) rises with the draft's confidence, falls
    along the window), saved as a real artifact for this pair, with a cost model for the cost rule."""
    cols = [FEATURES.index("p_top1"), FEATURES.index("window_pos")]
    model = DenseModel(
        "logistic", np.zeros(2), np.ones(2), [(np.array([[6.0], [-0.4]]), np.array([-2.0]))], "identity", cols
    )
    cost = CostModel(0.2, tuple(1.0 + 0.05 * k for k in range(MAX_WINDOW + 1)), "stub")
    setting = 1.0 if rule == "cost" else 0.5
    manifest = {"setting": setting, "rule": rule, "pair": pair.describe(), "cost_model": cost.to_dict()}
    return str(save_artifact(folder, model, manifest))


def _specs(pair, tmp_path) -> dict[str, PolicySpec]:
    return {
        "constant": PolicySpec("constant", k=3),
        "threshold": PolicySpec("threshold", threshold=0.4),
        "classifier-cost": PolicySpec("classifier", classifier=_artifact(tmp_path / "cost", pair, "cost")),
        "classifier-token": PolicySpec("classifier", classifier=_artifact(tmp_path / "token", pair, "token")),
    }


def _stream(pair, spec: PolicySpec, closed: LoopStream) -> list[list[int]]:
    """The prompts in turn, one stream under `closed`: each output."""
    return [generate_ids(pair, pair.encode(text, chat=False), spec, CONFIG, closed=closed).tokens for text in PROMPTS]


def _reference(pair) -> list[list[int]]:
    return [
        target_generate(pair.target, pair.encode(t, chat=False), CONFIG, pair.eos_token_ids).tokens for t in PROMPTS
    ]


@pytest.mark.parametrize("engine", ["torch", "llama.cpp"])
def test_lossless_with_the_closed_loop(engine, noisy_torch_pair, noisy_gguf_pair, tmp_path, monkeypatch):
    """Every policy under the closed loop, over a stream of 6 prompts (warm-up probes, then the policy or the
    governor's fixed lengths, the classifier's P(accept) through the calibration):
    each output is the engine's own target-only output, and the loop measured the run. The loop reads TRUTH's
    seconds: its windows, and the float32 verifications of those widths, are the same every run."""
    synthetic_clock(monkeypatch, TRUTH)
    pair = noisy_torch_pair if engine == "torch" else noisy_gguf_pair
    reference = _reference(pair)
    for name, spec in _specs(pair, tmp_path).items():
        closed = LoopStream()
        assert _stream(pair, spec, closed) == reference, name
        loop = closed.loop
        assert loop is not None and loop.costs.steps.observed > 0 and loop.costs.drafts.observed > 0, name
        assert loop.governor.steps > 0, name
        if name.startswith("classifier"):  # the model's P(accept) met verified outcomes, refitted every few
            calibration = loop.calibration
            assert calibration is not None and int(calibration.seen[1]) > 0, name
            assert calibration.refits == calibration.calls // CALIBRATION_REFIT, name


def test_the_cost_rule_reads_the_running_table(noisy_torch_pair, tmp_path):
    """The classifier's cost rule decides with the table measured in this run, not its artifact's model: after a
    stream the policy's cost model is the loop's (in seconds), where the artifact's is in units of c_t(1)."""
    spec = _specs(noisy_torch_pair, tmp_path)["classifier-cost"]
    closed = LoopStream()
    policy = closed.wrap(spec.build(None, noisy_torch_pair, MAX_WINDOW), MAX_WINDOW)
    assert policy.inner.cost.source == "stub" and closed.loop.costs.seed.source == "stub"  # the artifact seeds it
    speculative_generate(
        noisy_torch_pair.target, noisy_torch_pair.draft, noisy_torch_pair.encode(PROMPTS[0], chat=False), policy, CONFIG
    )
    # (the table's model as last handed out: the round's last outcomes may have made it due for a rebuild)
    assert policy.inner.cost is closed.loop.costs._model and policy.inner.cost.source.startswith("online")


def test_a_wrong_seed_is_corrected_by_the_costs_timed_in_the_run(noisy_torch_pair, monkeypatch):
    """The same stream seeded ×3 and ×⅓ (another machine's profile, an in-process one): after it both running
    tables hold the costs the run timed (TRUTH's, through the synthetic clock), every bucket exactly."""
    synthetic_clock(monkeypatch, TRUTH)
    for by in (3.0, 1 / 3):
        closed = LoopStream(scaled(TRUTH, by))
        _stream(noisy_torch_pair, PolicySpec("constant", k=3), closed)
        assert closed.loop is not None and closed.loop.costs.warm  # both kinds past ONLINE_COST_WARMUP
        model = closed.loop.cost_model()
        assert matches(model, TRUTH), (by, model)
        assert model.c_d == pytest.approx(TRUTH.c_d) and model.c_t == pytest.approx(TRUTH.c_t), (by, model)


def test_the_governor_falls_back_where_the_draft_never_agrees(capsys):
    """Stub models whose draft never proposes the target's token: a policy that always drafts 4 loses to drafting
    nothing; within the governor's bound (its probes, then GOVERNOR_WINDOW rounds) the loop runs k = 0 for a hold
    of GOVERNOR_HOLD rounds at least, says once that drafting does not pay, and the output stays target-only's."""
    target, draft = StubLM(lambda t, i: (t + 1) % 16), StubLM(lambda t, i: (t + 2) % 16)
    config = DecodeConfig(max_new_tokens=224, max_window=4)
    closed = LoopStream()
    res = speculative_generate(target, draft, [3, 5, 7], closed.wrap(ConstantPolicy(4), 4), config)
    ref = target_generate(target, [3, 5, 7], config)
    assert res.tokens == ref.tokens
    target_only_rounds = res.stats.target_forwards - len(res.stats.windows)
    gov = closed.loop.governor
    assert target_only_rounds >= GOVERNOR_HOLD, (target_only_rounds, gov.mode, gov.estimates, gov.policy_speedup)
    assert res.stats.accepted == 0
    assert "drafting does not pay" in capsys.readouterr().err


def test_the_cli_turns_the_closed_loop_on(capsys, folders):
    """`disco generate --closed-loop` says so, and prints what it prints without it (lossless); `disco compare
    --closed-loop` adds each policy row's twin under the closed loop."""
    target, draft, _ = folders
    args = cli_args(
        "generate", "--prompt", PROMPTS[0], target=target, draft=draft, policy="constant", k=3, max_new_tokens=24,
        no_chat=True,
    )  # fmt: skip
    rc, plain, _ = cli(capsys, *args)
    assert rc == 0
    rc, out, err = cli(capsys, *args, "--closed-loop")
    assert rc == 0, err
    assert out == plain and "runs under the closed loop" in err


def test_compare_runs_each_policy_row_under_the_closed_loop_too(capsys, folders, tmp_path):
    target, draft, _ = folders
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "task": "code", "prompt": t}) + "\n" for i, t in enumerate(PROMPTS[:2]))
    )
    args = cli_args(
        "compare", "--closed-loop", prompts=str(prompts), target=target, draft=draft, policies="constant",
        max_new_tokens=16, out=str(tmp_path / "out"), no_anchor=True, no_chat=True,
    )  # fmt: skip
    rc, out, err = cli(capsys, *args)
    assert rc == 0, err
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    runs = result["prompts"][0]["runs"]
    closed = [label for label in runs if label.endswith("(closed loop)")]
    assert closed and all(label.removesuffix(" (closed loop)") in runs for label in closed)
    assert all(r["lossless"] for p in result["prompts"] for r in p["runs"].values())


def test_engines_that_close_their_own_loop_refuse_the_flag():
    with pytest.raises(DiscoError) as e:
        check_closed_loop(SimpleNamespace(engine_name="vllm"))
    assert one_error_line(f"error: {e.value}").startswith("error: --closed-loop runs in disco's own loop")
    assert "DISCO_VLLM_POLICY" in str(e.value)
    check_closed_loop(SimpleNamespace(engine_name="torch"))  # (disco's loop: no refusal)


class _Budget(ConstantPolicy):
    """A constant window of 4 whose budget verifies its first 2 (a stand-in for loop_budget's policies)."""

    def trim(self, drafted: int) -> int:
        return min(drafted, 2)


def test_a_budget_policys_trim_passes_through_the_closed_loop_but_not_on_fixed_lengths():
    """Under the closed loop a window the policy decided is trimmed by the policy's budget; a window of a fixed
    length (a probe, the governor's) is verified whole."""
    policy = LoopStream(CostModel(1e-3, tuple(2e-3 for _ in range(9)), "seed")).wrap(_Budget(4), 8)
    policy.choose(None, None)  # the policy decides this window
    assert policy.trim(4) == 2 and policy.trim(1) == 1
    policy.choose(3, None)  # a fixed length of 3 (a probe)
    assert policy.trim(3) == 3
    plain = LoopStream().wrap(ConstantPolicy(4), 8)
    plain.choose(None, None)
    assert plain.trim(4) == 4  # a policy without a budget verifies what it drafted
