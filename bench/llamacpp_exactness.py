"""Does a batched llama.cpp forward round like one-token decoding? (bench/results/llamacpp.md, "Exactness")

The target's greedy continuation of a code prompt (96 tokens) is decoded one token at a time; the
same tokens are then fed in batches of k after the same context, and the logits compared (max
absolute difference, argmax flips), with llama.cpp's weight repacking on (its default) and off.
Also times one-token decode and verify(k)/decode(1) for each setting. Run it alone (2 cores):

    .venv/bin/python bench/llamacpp_exactness.py
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disco.engines.llamacpp.llamacpp import LlamaCppEngine  # noqa: E402
from disco.sources import embedded  # noqa: E402
from disco.sources.hub import encode_prompt, load_tokenizer  # noqa: E402

N = 96
PROMPT = "Write a Python function that merges two sorted lists, with a docstring and tests."


def main() -> None:
    target, draft, tok_dir = embedded.prepare_gguf_pair()
    ids = encode_prompt(load_tokenizer(str(tok_dir)), PROMPT, chat=True)
    for repack in (True, False):
        eng = LlamaCppEngine(target, threads=2, repack=repack, verify="fast")
        s = eng.session(torch.tensor(ids))
        s.prefill()
        ref, y, cur = [], [], ids[-1]
        for _ in range(N):
            logits = s.forward(torch.tensor([cur]), 1)
            ref.append(logits[0])
            cur = int(logits[0].argmax())
            y.append(cur)
        ref = torch.stack(ref)
        seq = [ids[-1]] + y
        diffs = {}
        for k in (2, 3, 4, 5, 6, 8, 16):
            s = eng.session(torch.tensor(ids))
            s.prefill()
            worst, flips, pos = 0.0, 0, 0
            while pos + k <= N:
                logits = s.forward(torch.tensor(seq[pos : pos + k]), k)
                worst = max(worst, float((logits - ref[pos : pos + k]).abs().max()))
                flips += int((logits.argmax(-1) != ref[pos : pos + k].argmax(-1)).sum())
                pos += k
            diffs[k] = (round(worst, 4), flips)
        s = eng.session(torch.tensor(ids))
        s.prefill()
        times = {}
        for k in (1, 2, 3, 4, 8, 16):
            ts = []
            for _ in range(12):
                t0 = time.perf_counter()
                s.forward(torch.tensor(y[:k]), k)
                ts.append(time.perf_counter() - t0)
                s.truncate(len(ids) - 1)
            times[k] = statistics.median(ts[3:])
        print(
            f"repack={repack}: decode {times[1] * 1e3:.1f} ms; verify(k)/decode(1) "
            f"{ {k: round(t / times[1], 2) for k, t in times.items()} }; (max |dlogit|, argmax flips / {N}) by k {diffs}",
            flush=True,
        )
        eng.close()


if __name__ == "__main__":
    main()
