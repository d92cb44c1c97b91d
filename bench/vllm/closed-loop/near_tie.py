"""Where two rows' outputs of one prompt part: the target's top logits at the first token they differ on, in float32
and bfloat16 (transformers, the same weights, the same prefix). An exact bf16 tie there says the step's shape broke
it (the engine's numerics), not a lost token. It reads a serve sweep's raw results, which stay out of git: run it
where the sweep ran.

    python bench/vllm/closed-loop/near_tie.py bench/vllm/closed-loop/mtbench-sweep17-raw \
        --prompts bench/vllm/closed-loop/mtbench-chat-8.jsonl --index 1 disco-closed-none-c1 target-only-c1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from disco.sources.embedded import EMBEDDED_TARGET, prepared_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, help="a sweep's raw folder (ROW-cN.json files with generated_texts)")
    ap.add_argument("a", help="one result's file stem, e.g. disco-closed-none-c1")
    ap.add_argument("b", help="the other's, e.g. target-only-c1")
    ap.add_argument("--prompts", type=Path, required=True, help="the sweep's prompts (.jsonl, a 'prompt' per line)")
    ap.add_argument("--index", type=int, required=True, help="the prompt's line (0-based)")
    ap.add_argument("--target", default=str(prepared_path(EMBEDDED_TARGET)), help="the target's folder")
    args = ap.parse_args()
    prompt = json.loads(args.prompts.read_text().splitlines()[args.index])["prompt"]
    texts = [json.loads((args.raw / f"{x}.json").read_text())["generated_texts"][args.index] for x in (args.a, args.b)]
    tok = AutoTokenizer.from_pretrained(args.target)
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(chat)
    a, b = (tok.encode(t) for t in texts)
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        raise SystemExit("the two outputs agree on every token they share")
    print(f"{len(ids)} prompt tokens; they part at output token {i}: {tok.decode(a[i])!r} against {tok.decode(b[i])!r}")
    prefix = torch.tensor([ids + a[:i]])
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype)
        with torch.no_grad():
            logits = model(prefix).logits[0, -1].float()
        top = [(tok.decode(int(t)), round(float(v), 4)) for v, t in zip(*logits.topk(3))]
        print(f"{dtype}: top 3 {top}; {args.a} {float(logits[a[i]]):.4f}, {args.b} {float(logits[b[i]]):.4f}")


if __name__ == "__main__":
    main()
