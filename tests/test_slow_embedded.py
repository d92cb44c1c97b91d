"""The embedded Qwen2.5-Coder pair, end to end (slow: prepares the pair once, then minutes on CPU)."""

import pytest

from disco.decode import DecodeConfig, generate, target_generate
from disco.policies import PolicySpec

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that returns the square of x.", "Say hello in French."]


@pytest.fixture(scope="module")
def pair():
    from disco.options import PairOptions
    from disco.pair import load_pair

    return load_pair(PairOptions(engine="torch"))


def test_embedded_pair_is_lossless_for_every_policy(pair):
    config = DecodeConfig(max_new_tokens=12)
    assert pair.eos_token_ids >= {151645}
    for prompt in PROMPTS:
        ids = pair.encode(prompt)
        ref = target_generate(pair.target, ids, config, pair.eos_token_ids)
        assert ref.stats.new_tokens > 0
        for spec in (
            PolicySpec("constant", k=5),
            PolicySpec("heuristic"),
            PolicySpec("threshold"),
            PolicySpec("oracle"),
        ):
            res = generate(pair, prompt, spec, config, target_tokens=ref.tokens)
            assert res.tokens == ref.tokens, (spec.name, pair.decode(res.tokens), pair.decode(ref.tokens))
        assert pair.decode(ref.tokens).strip()


def test_embedded_pair_on_llamacpp_is_lossless_in_exact_verification():
    """The default engine for the embedded pair: llama.cpp, exact verification, draft in Q4_0."""
    from disco.options import PairOptions
    from disco.pair import load_pair

    pair = load_pair(PairOptions(engine="llama.cpp", verify="exact"))
    info = pair.describe()["engine"]
    assert info["name"] == "llama.cpp" and info["exact_width"] >= 2 and "Q4_0" in info["draft_quantization"]
    config = DecodeConfig(max_new_tokens=48)
    for prompt in PROMPTS:
        ids = pair.encode(prompt)
        ref = target_generate(pair.target, ids, config, pair.eos_token_ids)
        for spec in (PolicySpec("constant", k=5), PolicySpec("threshold", threshold=0.6), PolicySpec("oracle")):
            res = generate(pair, prompt, spec, config, target_tokens=ref.tokens)
            assert res.tokens == ref.tokens, (spec.name, pair.decode(res.tokens), pair.decode(ref.tokens))
