"""What disco's decision costs on vLLM's own batched draft (bench/results/decision-cost.md, "The decision's cost on vLLM's draft"): the embedded pair
in vLLM in-process (bf16), disco's proposer on vLLM's draft with each policy, test prompts submitted in groups of
B = 1, 4, 8; per draft position, the policy's time for the whole batch (features, model, rule) against vLLM's
batched draft forward (the rest of the draft loop). Rerun: python bench/vllm_decision_cost.py [N_PROMPTS [TOKENS
[POLICIES]]] (POLICIES: comma-separated words of the labels below, e.g. "pooled,threshold"; default all)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from disco.base.options import PairOptions  # noqa: E402
from disco.core.load_profiles import VLLM_DRAFT, LoadProfiles  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402
from disco.policies.artifact import load_artifact  # noqa: E402
from disco.policies.policy_registry import PolicySpec  # noqa: E402
from disco.policies.tree_tensors import TreeTensors  # noqa: E402
from disco.vllm.engine import DISCO_DRAFT, SpecConfig  # noqa: E402

# the Xeon's, wherever it runs: the decision's work per position is the same, and a profile that makes the rule
# decline (another machine's) would leave few positions to time
PROFILE = "bench/vllm/serve/profile-draft.json"
CLASSIFIER = "models/embedded-qwen2.5-coder-vllm"
POLICIES = {
    "threshold 0.5": PolicySpec("threshold", threshold=0.5),
    "classifier (shipped vLLM artifact)": PolicySpec("classifier", classifier=CLASSIFIER),
    "classifier, token rule": PolicySpec("classifier", classifier=CLASSIFIER, classifier_rule="token"),
    "classifier, cost rule + load profile (pooled)": PolicySpec(
        "classifier", classifier=CLASSIFIER, classifier_rule="cost"
    ),
}
POLICIES["classifier, cost rule + load profile, trees as tensor ops"] = POLICIES[
    "classifier, cost rule + load profile (pooled)"
]
LOADED = {"classifier, cost rule + load profile (pooled)", "classifier, cost rule + load profile, trees as tensor ops"}
TREES = {"classifier, cost rule + load profile, trees as tensor ops"}  # what an accelerator runs, here on the CPU


def on_device_trees(proposer) -> None:
    """The policy's model as tree_tensors.TreeTensors on the CPU (LightGBMModel.torch_predictor keeps the host
    call there): the measurement behind that choice."""
    artifact = load_artifact(CLASSIFIER)
    trees = TreeTensors.from_booster(artifact.model.booster, artifact.model.columns)
    proposer.policy.predict = lambda x: artifact.calibration(trees(x))


def main(n_prompts: int = 8, tokens: int = 64, which: str = "") -> None:
    pair = load_pair(PairOptions(engine="vllm"))
    target = pair.target_engine
    spec = SpecConfig(DISCO_DRAFT, 8, str(target.draft_folder))
    proposer = target.proposer(spec, 8)
    prompts = load_prompt_sources(["code-test", "explain-test", "write-test"])
    ids = [pair.encode(p.prompt, None) for p in prompts][:n_prompts]
    print(
        "| policy | requests at once | draft positions | policy ms / position | draft forward ms / position | share |"
    )
    print("|---|---|---|---|---|---|")
    words = [w for w in which.split(",") if w]
    for label, policy in POLICIES.items():
        if words and not any(w in label for w in words):
            continue
        for b in (1, 4, 8):
            proposer.set_policy(policy, LoadProfiles(PROFILE).choose(VLLM_DRAFT) if label in LOADED else None)
            if label in TREES:
                on_device_trees(proposer)
            for start in range(0, len(ids), b):
                target.generate_batch(spec, ids[start : start + b], tokens, pair.eos_token_ids, b)
            n = max(proposer.n_positions, 1)
            decide, forward = 1000 * proposer.decide_s / n, 1000 * proposer.forward_s / n
            print(f"| {label} | {b} | {n} | {decide:.2f} | {forward:.1f} | {decide / forward:.1%} |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:2]), *args[2:3])
