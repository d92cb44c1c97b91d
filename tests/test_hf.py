"""The classifier policy live and the transformers drop-in, on a tiny pair with a tiny trained artifact."""

import numpy as np
import pytest
import torch
from tiny import char_tokenizer, tiny_pair

from disco.base.errors import DiscoError
from disco.formats.prompts import Prompt
from disco.hf import disco_generate
from disco.jobs.collect import collect
from disco.loop.decode import DecodeConfig, generate, speculative_generate, target_generate
from disco.loop.pair import pair_from_models
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import PolicySpec
from disco.training.train import TrainConfig, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    pair = pair_from_models(target, draft, tok, "tiny")
    prompts = [Prompt(f"q{i}", "code", f"def g{i}(y): return y - {i} *") for i in range(12)]
    collect(pair, prompts, root / "traces", DecodeConfig(max_new_tokens=20), progress=False)
    train(TrainConfig([root / "traces"], root / "clf", model="lightgbm", val_fraction=0.25, progress=False))
    return pair, root / "clf"


class Recording(ClassifierPolicy):
    def stops(self, p_accept):  # the live decision, as the round (rounds.draft_window) takes it
        stop = super().stops(p_accept)
        self.seen.append((self.window_features_last.numpy().copy(), stop))
        return stop

    def features(self, tok_feats, window_pos, hidden=None):
        self.window_features_last = super().features(tok_feats, window_pos, hidden)
        return self.window_features_last


def test_live_decisions_match_offline_predictions(setup):
    pair, clf = setup
    base = ClassifierPolicy.for_pair(clf, pair, rule="token")  # P(accept) < t, whatever train chose
    policy = Recording(base.model, base.setting, base.token_classes)
    policy.seen = []
    for i in range(6):
        ids = pair.encode(f"x = {i} + y *")
        ref = target_generate(pair.target, ids, DecodeConfig(max_new_tokens=24), pair.eos_token_ids)
        res = speculative_generate(
            pair.target, pair.draft, ids, policy, DecodeConfig(max_new_tokens=24), pair.eos_token_ids
        )
        assert res.tokens == ref.tokens
    X = np.stack([x for x, _ in policy.seen])
    offline = base.model.predict_proba(X) < base.setting
    assert offline.tolist() == [stop for _, stop in policy.seen]
    assert 0 < sum(offline) < len(offline) or len(offline) > 0


def test_generate_with_classifier_spec_is_lossless(setup):
    pair, clf = setup
    spec = PolicySpec("classifier", classifier=str(clf))
    for i in range(5):
        prompt = f"def h{i}(): return"
        ref = generate(pair, prompt, PolicySpec("target"), DecodeConfig(max_new_tokens=16))
        res = generate(pair, prompt, spec, DecodeConfig(max_new_tokens=16))
        assert res.tokens == ref.tokens and res.stats.drafted > 0


def test_drop_in_reproduces_greedy_generate(setup):
    pair, clf = setup
    tok = pair.tokenizer
    custom = disco_generate(pair.draft, clf, tok)
    for i in range(5):
        inputs = tok(f"print({i} +", return_tensors="pt")
        ref = pair.target.generate(**inputs, do_sample=False, max_new_tokens=14, pad_token_id=0)
        out = pair.target.generate(**inputs, do_sample=False, max_new_tokens=14, pad_token_id=0, custom_generate=custom)
        assert out.tolist() == ref.tolist()
        assert custom.last_stats.drafted > 0 and custom.last_stats.new_tokens == 14


def test_missing_or_mismatched_artifact(setup, tmp_path):
    pair, clf = setup
    with pytest.raises(DiscoError):
        generate(pair, "x", PolicySpec("classifier", classifier=str(tmp_path / "none")), DecodeConfig(max_new_tokens=4))
    with pytest.raises(DiscoError, match="needs a trained artifact"):
        generate(pair, "x", PolicySpec("classifier"), DecodeConfig(max_new_tokens=4))
    other = pair_from_models(pair.target, pair.draft, char_tokenizer(), "tiny")
    other.tokenizer.add_special_tokens({"bos_token": "<s>"})
    with pytest.raises(DiscoError, match="another tokenizer"):
        generate(other, "x", PolicySpec("classifier", classifier=str(clf)), DecodeConfig(max_new_tokens=4))
    with pytest.raises(DiscoError, match="tokenizer"):
        disco_generate(pair.draft, clf)
