"""Write the vLLM benchmark's validation prompt file: the first PER_TASK validation prompts of each task
of the shipped llama.cpp classifier (its manifest's val_prompt_ids: the prompts every baseline was tuned
on; none is a test prompt), at most TOTAL of them. Usage: python bench/vllm_prompts.py OUT.jsonl [PER_TASK [TOTAL]]
(issue 23's tuning: 3 8, i.e. code 3, explain 3, write 2)."""

import json
import sys
from pathlib import Path

ARTIFACT = Path("models/embedded-qwen2.5-coder-llamacpp/manifest.json")

out, per_task = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4
total = int(sys.argv[3]) if len(sys.argv) > 3 else None
val = json.loads(ARTIFACT.read_text())["training"]["val_prompt_ids"]
rows = []
for task in ("code", "explain", "write"):
    wanted = [i for i in val if i.startswith(f"{task}-")][:per_task]
    by_id = {json.loads(line)["id"]: line for line in Path(f"data/{task}-train.jsonl").read_text().splitlines()}
    rows += [by_id[i] for i in wanted]
rows = rows[:total]
out.write_text("\n".join(rows) + "\n")
print(f"wrote {len(rows)} validation prompts to {out}")
