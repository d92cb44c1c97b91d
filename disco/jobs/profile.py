"""`disco profile`: measure the cost model of a pair on this machine (docs/architecture.md, "Cost model").

    c_d     one draft forward of one token
    c_t(k)  one target forward over k tokens (a round that drafted k - 1 tokens), k = 1 .. max_window + 1

Each is the median of repeated timed forwards after warm-up, synchronised on CUDA, over a
realistic context (~100 prompt tokens in the KV cache). The cache is rolled back after
every timing, so every timing sees the same context — the same engine sessions (forward,
rollback) the decoding loop uses, on either engine.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import torch

from disco.base.defaults import DEFAULT_CONTEXT, DEFAULT_MAX_WINDOW, DEFAULT_REPEATS, DEFAULT_WARMUP
from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.engines.base import Session, sync
from disco.formats.prompts import context_ids
from disco.loop.engine_registry import loop_engine
from disco.loop.pair import Pair
from disco.sources.embedded import EMBEDDED_NAME


def _median_time(
    session: Session, feed: torch.Tensor, keep_len: int, repeats: int, warmup: int, device: torch.device
) -> float:
    """Median seconds of one forward of `feed` after `keep_len` cached tokens (cache restored each time)."""
    times = []
    for i in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        session.forward(feed, len(feed))
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        session.truncate(keep_len)
    return statistics.median(times)


@torch.inference_mode()
def profile_pair(
    pair: Pair,
    max_window: int = DEFAULT_MAX_WINDOW,
    context: int = DEFAULT_CONTEXT,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    progress: bool = True,
) -> dict:
    """Measure c_d and c_t(1 .. max_window + 1); return the profile (CostModel fields + metadata).

    Through the same sessions the loop uses: with captured steps (torch --compile) a verify of k
    tokens runs padded to its bucket, so c_t(k) is the bucket's cost, as a decode pays it."""
    from tqdm.auto import tqdm

    if max_window < 1 or context < 1 or repeats < 1 or warmup < 0:
        raise DiscoError("--max-window, --context and --repeats must be at least 1, --warmup at least 0")
    if context + max_window + 1 > pair.context_length:
        raise DiscoError(
            f"--context {context} + --max-window {max_window} exceeds the models' context of "
            f"{pair.context_length} tokens"
        )
    ids = torch.tensor(context_ids(pair.tokenizer, context + max_window + 1), device=pair.device)
    # The sessions see `context` tokens of prompt: prefill feeds all but the last, the first timed
    # forward's warm-up feeds the last; after that every timing starts from exactly `context`.
    compile_s = pair.warm_up(len(ids))  # captured steps: compiled before any timing
    sessions = {}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        sessions[role] = loop_engine(model).session(ids[:context], capacity=len(ids))
        sessions[role].prefill()
        sessions[role].forward(ids[context - 1 : context], 1)
    feed = ids[context:]
    c_d = _median_time(sessions["draft"], feed[:1], context, repeats, warmup, pair.device)
    c_t = []
    for k in tqdm(range(1, max_window + 2), desc="timing target forwards", disable=not progress):
        c_t.append(_median_time(sessions["target"], feed[:k], context, repeats, warmup, pair.device))
    cost = CostModel(c_d, tuple(c_t), "profile")
    return {
        **cost.to_dict(),
        "unit": "s",
        "c_d_ratio": c_d / c_t[0],  # c_d / c_t(1): what the speedup depends on
        "c_t_ratio": [c / c_t[0] for c in c_t],  # c_t(k) / c_t(1)
        "max_window": max_window,
        "context_tokens": context,
        "repeats": repeats,
        "warmup": warmup,
        "compile_s": compile_s,
        "pair": pair.describe(),
        "device_name": torch.cuda.get_device_name(pair.device) if pair.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def default_profile_path(pair: Pair) -> Path:
    """Under the cache root, keyed by pair and hardware: the costs hold for this device and dtype only."""
    from disco.sources.embedded import cache_root

    if pair.target_name.startswith(f"{EMBEDDED_NAME}:"):
        name = EMBEDDED_NAME
    else:
        name = f"{Path(pair.target_name).name}__{Path(pair.draft_name).name}"
    hw = pair.target_engine.hardware_key(pair.device)  # threads, verification, backend, cache: what the costs hang on
    key = f"{name}__{hw}__{str(pair.dtype).removeprefix('torch.')}"
    return cache_root() / "profiles" / (re.sub(r"[^A-Za-z0-9._-]+", "-", key) + ".json")


def format_profile(profile: dict) -> str:
    lines = [
        f"c_d = {profile['c_d'] * 1e3:.3f} ms ({profile['c_d_ratio']:.3f} c_t(1))",
        "k   c_t(k) ms   c_t(k)/c_t(1)",
    ]
    for k, (c, r) in enumerate(zip(profile["c_t"], profile["c_t_ratio"]), 1):
        lines.append(f"{k:<3} {c * 1e3:9.3f}   {r:.3f}")
    return "\n".join(lines)
