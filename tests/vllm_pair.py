"""The tiny vLLM pair the tests of disco's policy on vLLM's own draft run on (tests/test_vllm_draft.py,
tests/test_vllm_closed_loop.py): its folders, the pair loaded in vLLM, the prompts' ids, the draft's
speculative config and vLLM target-only's outputs as module fixtures (a test file imports them by name), and
vLLM runs of those prompts. Importing this module does not start vLLM; the fixtures do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny import EOS, perturbed, save_char_tiny, tiny_vllm_qwen

from disco.base.options import PairOptions
from disco.core.cost import CostModel
from disco.core.features import FEATURES
from disco.loop.pair import load_pair
from disco.policies.artifact import DenseModel, save_artifact
from disco.vllm.engine import DISCO_DRAFT, SpecConfig

PROMPTS = ["def add(a, b):\n    return", "Hello, world! The quick brown fox", "x = [1, 2, 3]", "ab", "zz top 12"]
K_MAX = 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-draft")
    target = tiny_vllm_qwen()
    return save_char_tiny(target, root / "target"), save_char_tiny(perturbed(target, 0.03), root / "draft")


@pytest.fixture(scope="module")
def pair(folders):
    target, draft = folders
    p = load_pair(PairOptions(target=str(target), draft=str(draft), engine="vllm", dtype="float32"))
    yield p
    p.target_engine.close()


@pytest.fixture(scope="module")
def ids(pair):
    return [pair.encode(p, False) for p in PROMPTS]


@pytest.fixture(scope="module")
def spec(folders):
    return SpecConfig(DISCO_DRAFT, K_MAX, str(folders[1]))


@pytest.fixture(scope="module")
def reference(pair, ids):
    """vLLM target-only's greedy outputs, budgets 8..40 tokens: requests finish at different steps."""
    return [vllm_generate(pair, SpecConfig(), [i], 8 + 8 * n)[0][0] for n, i in enumerate(ids)]


def vllm_generate(pair, spec, prompts, max_tokens, temperature=0.0, seeds=None):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = pair.target_engine.llm(spec)
    params = [
        SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_token_ids=[EOS], seed=s)
        for s in (seeds or [None] * len(prompts))
    ]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.request_id for o in outs]


def vllm_budgets(pair, spec, ids):
    """All prompts submitted together, each with its own budget (8..40 tokens)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = pair.target_engine.llm(spec)
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 8 * n, stop_token_ids=[EOS]) for n in range(len(ids))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.request_id for o in outs]


def logistic_artifact(folder: Path, pair, rule: str = "token", setting: float = 0.5) -> Path:
    """A hand-made logistic model over p_top1 and window_pos (P(accept) rises with the draft's confidence,
    falls along the window), saved as a real artifact for this pair."""
    cols = [FEATURES.index("p_top1"), FEATURES.index("window_pos")]
    model = DenseModel(
        "logistic", np.zeros(2), np.ones(2), [(np.array([[6.0], [-0.4]]), np.array([-2.0]))], "identity", cols
    )
    cost = CostModel(0.2, tuple(1.0 + 0.05 * k for k in range(K_MAX + 1)), "stub")
    manifest = {"setting": setting, "rule": rule, "pair": pair.describe(), "cost_model": cost.to_dict()}
    return save_artifact(folder, model, manifest)
