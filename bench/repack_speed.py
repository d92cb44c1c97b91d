"""Weight repacking on and off on this CPU (issue 30): the embedded pair on llama.cpp loaded twice, once with
repacking and once without, target-only decoding and the shipped policy on each, interleaved prompt by
prompt in one process (so drift on the machine hits both alike); greedy, exact verification.
Prints each row's tokens/s (pooled), the on/off ratio and whether every row equals target-only decoding.

Run: python bench/repack_speed.py [--prompts code-test,explain-test,write-test] [--limit 2] [--max-new-tokens 96]
"""

import argparse
import time

from disco.base.options import PairOptions
from disco.formats.prompts import load_prompt_sources
from disco.loop.decode import DecodeConfig, generate, target_generate
from disco.loop.pair import load_pair
from disco.policies.policy_registry import PolicySpec

ARTIFACT = "models/embedded-qwen2.5-coder-llamacpp"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="code-test,explain-test,write-test")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args()
    prompts = load_prompt_sources(a.prompts.split(","), a.limit)
    pairs = {mode: load_pair(PairOptions(engine="llama.cpp", repack=mode)) for mode in ("on", "off")}
    config = DecodeConfig(max_new_tokens=a.max_new_tokens)
    spec = PolicySpec("classifier", classifier=ARTIFACT)
    totals: dict[tuple[str, str], list[float]] = {}
    same = True
    for p in prompts:
        for mode, pair in pairs.items():
            ids = pair.encode(p.prompt)
            t0 = time.perf_counter()
            ref = target_generate(pair.target, ids, config, pair.eos_token_ids)
            t1 = time.perf_counter()
            res = generate(pair, p.prompt, spec, config)
            t2 = time.perf_counter()
            same &= res.tokens == ref.tokens
            for row, (n, s) in (("target", (len(ref.tokens), t1 - t0)), ("classifier", (len(res.tokens), t2 - t1))):
                tok, sec = totals.setdefault((row, mode), [0.0, 0.0])
                totals[row, mode] = [tok + n, sec + s]
            print(
                f"{p.id} repack {mode}: target {len(ref.tokens) / (t1 - t0):.2f} tok/s, classifier "
                f"{len(res.tokens) / (t2 - t1):.2f} tok/s, = target {res.tokens == ref.tokens}",
                flush=True,
            )
    print(f"\n{len(prompts)} prompts x {a.max_new_tokens} tokens; every classifier row = target: {same}")
    print("| row | repack on tok/s | repack off tok/s | on/off |\n|---|---|---|---|")
    for row in ("target", "classifier"):
        on, off = (totals[row, m][0] / totals[row, m][1] for m in ("on", "off"))
        print(f"| {row} | {on:.2f} | {off:.2f} | {on / off:.2f}x |")
    for mode, pair in pairs.items():
        print(f"repack {mode}: {pair.describe()['engine']['repack_reason']}")


if __name__ == "__main__":
    main()
