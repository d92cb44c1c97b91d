"""The distribution features of B draft rows (bf16 logits of the embedded pair's 151,936-token vocabulary), timed alone
with the caches flushed before each call: from the probabilities (softmax, then top-k and p·log p: the definition)
against from the logits (features.batch_logit_distribution). bench/results/vllm-avx2-cpu.md, "A CPU where no window pays". Rerun:
python bench/logit_features.py"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from disco.core.features import batch_distribution, batch_logit_distribution

VOCAB = 151936
FLUSH = torch.empty((64 << 20) // 4)  # 64 MB written between calls: the caches as after a draft forward


def cold(f: Callable[[torch.Tensor, torch.Tensor], object], rows: int, calls: int = 300) -> float:
    """Median ms of f over `calls` calls on `rows` random rows, the caches flushed before each."""
    logits = (torch.randn(rows, VOCAB) * 3).bfloat16()
    tokens = logits.argmax(-1)
    times = []
    for _ in range(calls):
        FLUSH.add_(1.0)
        t = time.perf_counter()
        f(logits, tokens)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def from_probabilities(logits: torch.Tensor, tokens: torch.Tensor) -> object:
    return batch_distribution(logits.float().softmax(-1), tokens)


def softmax_only(logits: torch.Tensor, tokens: torch.Tensor) -> object:
    return logits.float().softmax(-1)


def main() -> None:
    torch.set_num_threads(2)
    ways = {
        "softmax alone": softmax_only,
        "from probabilities": from_probabilities,
        "from logits": batch_logit_distribution,
    }
    for _repeat in range(2):
        for rows in (1, 4, 8):
            print(rows, {name: round(cold(f, rows), 3) for name, f in ways.items()}, flush=True)
    logits = (torch.randn(8, VOCAB) * 3).bfloat16()
    tokens = logits.argmax(-1)
    a, b = from_probabilities(logits, tokens), batch_logit_distribution(logits, tokens)
    print("max |difference| (top, entropy, p_chosen):", [float((x - y).abs().max()) for x, y in zip(a, b)])


if __name__ == "__main__":
    main()
