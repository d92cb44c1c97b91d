"""What vLLM's speculative path costs when disco's proposer proposes nothing (bench/results/vllm-avx2-cpu.md, "A proposer that never drafts"):
vLLM target-only against the draft_model instance with disco's never-drafting policy, in this process,
alternated, ms per decode step.
Usage: python bench/vllm_spec_path.py tiny [TOKENS [REPEATS]]      (tests/test_vllm.py's tiny float32 models)
       python bench/vllm_spec_path.py embedded [TOKENS [REPEATS]]  (the embedded pair, bf16)
Tiny: TOKENS tokens a run (default 400). Embedded: a step is (wall(TOKENS) - wall(8)) / (TOKENS - 8), so the
prefill cancels (default 40)."""

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from disco.base.options import PairOptions  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402
from disco.policies.policy_registry import PolicySpec  # noqa: E402
from disco.vllm.engine import DISCO_DRAFT, SpecConfig  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "tiny"
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else (400 if kind == "tiny" else 40)
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else (5 if kind == "tiny" else 3)
if kind == "tiny":
    from test_vllm import _save, tiny_vllm_qwen
    from tiny import perturbed

    root = Path("bench/out/spec-path")
    if not (root / "draft").exists():
        model = tiny_vllm_qwen()
        _save(model, root / "target"), _save(perturbed(model, 0.03), root / "draft")
    pair = load_pair(
        PairOptions(target=str(root / "target"), draft=str(root / "draft"), engine="vllm", dtype="float32")
    )
else:
    pair = load_pair(PairOptions(engine="vllm"))
target = pair.target_engine
ids = pair.encode("def add(a, b):\n    return", False)


def wall(spec: SpecConfig, n: int) -> float:
    llm = target.llm(spec, 1)
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    return time.perf_counter() - t0


def step_ms(spec: SpecConfig) -> float:
    if kind == "tiny":
        return wall(spec, tokens) / tokens * 1000
    return (wall(spec, tokens) - wall(spec, 8)) / (tokens - 8) * 1000


draft = SpecConfig(DISCO_DRAFT, 8, str(target.draft_folder))
target.proposer(draft, 1).set_policy(PolicySpec("target"))
assert target.proposer(draft, 1).never_drafts
times: dict[str, list[float]] = {"target-only": [], "disco, never drafts": []}
for _ in range(repeats):
    for label, spec in (("target-only", SpecConfig()), ("disco, never drafts", draft)):
        times[label].append(step_ms(spec))
for label, ms in times.items():
    print(f"{label}: {[round(x, 2) for x in ms]} ms a step, median {statistics.median(ms):.2f}")
ratio = statistics.median(times["disco, never drafts"]) / statistics.median(times["target-only"])
print(f"{kind}, {tokens} tokens, {repeats} alternations: never-drafting / target-only = {ratio:.3f}")
