"""Cost of one stopping decision per draft token (features + classifier), against a draft step.

Run: .venv/bin/python bench/decision_cost.py  (needs the prepared embedded pair's tokenizer and
models/embedded-qwen2.5-coder; no model weights are loaded)."""

import json
import statistics
import time

import torch
from transformers import AutoTokenizer

from disco.core.features import token_class_table
from disco.policies.artifact import load_artifact
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy import DraftStep, ThresholdPolicy
from disco.sources.embedded import EMBEDDED_TARGET, prepared_path

tok = AutoTokenizer.from_pretrained(prepared_path(EMBEDDED_TARGET))
art = load_artifact("models/embedded-qwen2.5-coder")
table = token_class_table(tok, 151936)
g = torch.Generator().manual_seed(0)
ctx = torch.randint(0, 150000, (150,), generator=g)


def time_policy(policy, n=300):
    ts = []
    policy.start()
    for i in range(n):
        logits = torch.randn(151936, generator=g) * 3
        probs = torch.softmax(logits, -1)
        step = DraftStep(logits, probs, probs.argmax(), 1 + i % 5, i, ctx, [])
        t0 = time.perf_counter()
        policy.should_stop(step)
        ts.append(time.perf_counter() - t0)
        if i % 5 == 4:
            policy.update(5, 3)
            policy.start()
    return statistics.median(ts)


c_d = json.load(open("bench/embedded/profile-cpu.json"))["c_d"]
clf = time_policy(ClassifierPolicy(art, art.setting, table))
thr = time_policy(ThresholdPolicy(0.4))
print(
    f"classifier decision {1e3 * clf:.3f} ms ({100 * clf / c_d:.2f} % of a {1e3 * c_d:.1f} ms draft step); "
    f"threshold decision {1e3 * thr:.3f} ms ({100 * thr / c_d:.3f} %)"
)
