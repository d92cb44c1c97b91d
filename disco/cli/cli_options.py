"""The CLI's option groups: sets of options a command receives as one value (`PairOptions`, `DecodeConfig`,
`PolicySpec`), and the option objects several commands share.

Light like disco.cli.cli: typer, the standard library and disco.base.defaults / disco.base.options only; the stage modules
behind a group's value (torch, the policies) are imported when a command runs.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from disco.base.defaults import (
    ADAEDL_LAMBDA,
    CPU_BACKEND_HELP,
    CPU_BACKENDS,
    DEFAULT_CACHE,
    DEFAULT_CPU_BACKEND,
    DEFAULT_DEVICE,
    DEFAULT_DRAFT_QUANT,
    DEFAULT_DTYPE,
    DEFAULT_ENGINE,
    DEFAULT_K,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_WINDOW,
    DEFAULT_POLICY,
    DEFAULT_REPACK,
    DEFAULT_SEED,
    DEFAULT_TEMPERATURE,
    DEFAULT_THRESHOLD,
    DEFAULT_TOP_P,
    DEFAULT_VERIFY,
    MT_BENCH_CATEGORIES,
    MT_BENCH_NAMES,
    MT_BENCH_SPLITS,
    POLICY_NAMES,
    RULES,
    SVIP_H,
)
from disco.base.options import PairOptions

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


# --classifier and --pair: a path of the user's that exists, else a shipped artifact or pair file by name or by its
# checkout path (models/embedded-qwen2.5-coder, configs/pairs/opt.yaml), from any folder (disco/base/shipped.py)
def shipped_classifier(value: Any) -> Any:
    from disco.base import shipped

    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [str(shipped.find_classifier(v)) for v in value]
    return str(shipped.find_classifier(value))


def shipped_pair_file(value: Path | None) -> Path | None:
    from disco.base import shipped

    return None if value is None else shipped.find_pair_file(value)


# the MT-Bench prompt sets (prompts.load_mt_bench_prompts), in every command's --prompts help
MT_BENCH_HELP = (
    f"{MT_BENCH_NAMES[0]}[:CATEGORY+…][:{'|'.join(MT_BENCH_SPLITS)}] (MT-Bench's first turns; CATEGORY: "
    f"{', '.join(MT_BENCH_CATEGORIES)}; e.g. mt-bench:coding+math:test; {MT_BENCH_NAMES[1]}…: the second turns, "
    "after the target's own answer to the first, made once and cached)"
)
CHAT_OPTION = typer.Option(
    None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."
)
CLOSED_LOOP_OPTION = typer.Option(
    False,
    "--closed-loop/--no-closed-loop",
    help="disco's loop (torch, llama.cpp): the costs the cost rules read are timed in this run (the artifact's or "
    "profile's only seed them), the classifier's P(accept) is recalibrated from verified windows, and a governor "
    "falls back to a fixed draft length where the policy loses to one. compare: each policy row also runs so, as "
    "'ROW (closed loop)'.",
)
ENGINE_OPTION = typer.Option(
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
            callback=shipped_pair_file,
            help="A pair file, e.g. configs/pairs/opt.yaml, or a shipped one by name (opt) (target, draft, dtype, "
            "chat); --target, --draft, --dtype other than auto and --chat/--no-chat override it.",
        ),
    ),
    "device": (str, typer.Option(DEFAULT_DEVICE, help="auto (cuda if available, else cpu), cpu or cuda.")),
    "dtype": (
        str,
        typer.Option(DEFAULT_DTYPE, help="auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16."),
    ),
    "engine": (str, ENGINE_OPTION),
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
    from disco.loop.decode import DecodeConfig  # torch: only once a command runs

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
        typer.Option(
            None,
            callback=shipped_classifier,
            help="classifier: the trained artifact folder (disco train --out), or a shipped one by name "
            "(embedded-qwen2.5-coder).",
        ),
    ),
    "classifier_setting": (
        Optional[float],
        typer.Option(
            None,
            help="classifier: override the tuned setting of its rule (token, cumulative: a probability; the cost "
            "rules: a rate).",
        ),
    ),
    # the setting's old flag, still read (hidden): one name, --classifier-setting, is shown and named in errors
    "classifier_threshold": (Optional[float], typer.Option(None, hidden=True)),
    "classifier_rule": (
        Optional[str],
        typer.Option(
            None,
            help=f"classifier: run this rule ({', '.join(RULES)}) at its tuned setting instead of the one disco "
            "train chose.",
        ),
    ),
    "trust_pickle": (
        bool,
        typer.Option(False, help="classifier: allow a joblib/pickle artifact (it can run code)."),
    ),
}


def _policy_spec(classifier_threshold: float | None = None, **fields: Any):
    from disco.base.errors import DiscoError
    from disco.policies.policy_registry import PolicySpec  # the policies: only once a command runs

    if classifier_threshold is not None:  # the deprecated name of --classifier-setting
        if fields["classifier_setting"] is not None:
            raise DiscoError("--classifier-threshold is the old name of --classifier-setting: give only the latter")
        warnings.warn("--classifier-threshold is deprecated: use --classifier-setting", FutureWarning, stacklevel=2)
        fields["classifier_setting"] = classifier_threshold
    return PolicySpec(**fields)


def policy_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's policy options (--policy --k … --trust-pickle), received as `spec: PolicySpec`."""
    return _option_group("spec", _POLICY_OPTIONS, _policy_spec)(fn)
