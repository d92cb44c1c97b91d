"""Proposer memory under `vllm serve` (bench/results/vllm-serving.md, "Held-out test prompts"): one OpenAI server with disco's
policy on vLLM's draft, driven by `vllm bench serve` (random prompts, short outputs) for 50 requests, then 450
more; the worker's resident memory after the warm-up, after 50 and after 500 requests. Flat: nothing is kept
per finished request. Rerun: python bench/serve_memory.py TARGET DRAFT SETTINGS.json OUT.json"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_sweep import BENCH_CODE, free_port, start_server, stop_server, wait_ready  # noqa: E402


def worker_rss_mib(server: subprocess.Popen) -> float:
    """Resident memory of the vLLM worker process (a descendant of the server named VLLM::Worker)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,rss,comm"], capture_output=True, text=True).stdout.splitlines()[1:]
    rows = [line.split(None, 3) for line in out]
    children: dict[int, list[tuple[int, int, str]]] = {}
    for pid, ppid, rss, comm in rows:
        children.setdefault(int(ppid), []).append((int(pid), int(rss), comm))
    todo, total = [server.pid], 0.0
    while todo:
        for pid, rss, comm in children.get(todo.pop(), []):
            todo.append(pid)
            if "Worker" in comm:
                total += rss / 1024
    return total


def bench(a, port: int, n: int) -> None:
    cmd = [
        sys.executable, "-c", BENCH_CODE, "--backend", "openai", "--host", "127.0.0.1", "--port", str(port),
        "--model", a.target, "--dataset-name", "random", "--random-input-len", "48", "--random-output-len", "8",
        "--num-prompts", str(n), "--max-concurrency", "8", "--request-rate", "inf", "--ignore-eos",
        "--temperature", "0", "--disable-tqdm",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=3600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("settings")
    p.add_argument("out")
    a = p.parse_args()
    spec = json.dumps({"method": "draft_model", "model": a.draft, "num_speculative_tokens": 8})
    server_args = argparse.Namespace(
        python=sys.executable, target=a.target, dtype="bfloat16", max_model_len=2048, server_args="",
        kv_cache_gib=2, env={},
    )  # fmt: skip
    config = {"args": ["--speculative-config", spec, "--no-async-scheduling"], "env": {"DISCO_VLLM_POLICY": a.settings}}
    port = free_port()
    log = Path(a.out).with_suffix(".server.log")
    server = start_server(server_args, config, port, log)
    try:
        if not wait_ready(server, port, 600):
            sys.exit(f"the server did not start: see {log}")
        bench(a, port, 8)  # warm-up
        rss = {"warm": worker_rss_mib(server)}
        t0 = time.time()
        bench(a, port, 50)
        rss["after 50"] = worker_rss_mib(server)
        bench(a, port, 450)
        rss["after 500"] = worker_rss_mib(server)
        result = {"worker_rss_mib": rss, "seconds": time.time() - t0, "settings": a.settings}
    finally:
        stop_server(server)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
