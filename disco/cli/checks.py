"""Early, complete checks of a command's options: everything that can be refused before a model
loads is refused here, so no one waits minutes for an error a look at the options could give.

Each CLI command calls `check_options(command, locals())` first. Checked here:
- every numeric option's range (settings.RANGES, under its flag: FLAGS), with one wording for all commands;
- options that do not apply: an engine's option on the other engine (--verify, --draft-quant,
  --threads are llama.cpp's; --cache, --compile, --cpu-backend, --dtype are torch's;
  --tensor-parallel-size, compare's --concurrency and collect's and profile's --max-batch vLLM's) and --top-p
  under greedy decoding are REFUSED, in both directions alike (a silently ignored option is a
  silently wrong run: the user believes it took effect);
- outputs (disco/base/files.py): the destination can be written and is the right kind of thing;
- inputs that load cheaply: the classifier artifacts (whole: disco/policies/artifact.py), user GGUF files
  (a truncated one is named as such, not as a tokenizer error);
- compare's --policies selecting at least one row that can run here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from disco.base.errors import DiscoError
from disco.base.settings import WINDOW, SettingError, check_setting

# option (as the command's parameter is named) -> (its flag, the setting whose range it takes: settings.RANGES)
FLAGS: dict[str, tuple[str, str]] = {
    "k": ("--k", "k"),
    "threshold": ("--threshold", "threshold"),
    "lam": ("--lambda", "lam"),
    "h": ("--svip-h", "h"),
    "classifier_setting": ("--classifier-setting", "classifier_setting"),
    "max_window": ("--max-window", "max_window"),
    "max_new_tokens": ("--max-new-tokens", "max_new_tokens"),
    "temperature": ("--temperature", "temperature"),
    "top_p": ("--top-p", "top_p"),
    "limit": ("--limit", "limit"),
    "threads": ("--threads", "threads"),
    "shard_prompts": ("--shard-prompts", "shard_prompts"),
    "seeds": ("--seeds", "seeds"),
    "tuned_k": ("--tuned-k", "k"),
    "tuned_threshold": ("--tuned-threshold", "threshold"),
    "server_p_min": ("--server-p-min", "server_p_min"),
    "server_n_max": ("--server-n-max", "server_n_max"),
    "val_fraction": ("--val-fraction", "val_fraction"),
    "context": ("--context", "context"),
    "repeats": ("--repeats", "repeats"),
    "warmup": ("--warmup", "warmup"),
    "per_task": ("--per-task", "per_task"),
    "max_batch": ("--max-batch", "max_batch"),
    "tensor_parallel_size": ("--tensor-parallel-size", "tensor_parallel_size"),
}
# train and profile measure or simulate windows: one draft token at least
_WINDOWED = {"train", "profile"}


def flag_message(err: SettingError) -> str:
    """A library's SettingError, worded with the CLI flag that sets it (the setting's own name if none does)."""
    flag = next((f for f, setting in FLAGS.values() if setting == err.setting), err.setting)
    return err.worded(flag)


def check_options(command: str, options: dict[str, Any]) -> None:
    """Refuse, with one line naming the option and the fix, whatever `command` cannot run with.
    options: the command's parameters (its locals), the shared PairOptions and DecodeConfig among them."""
    o = dict(options)
    for shared in (o.pop("options", None), o.pop("config", None)):  # cli_options.pair_options / decode_options
        if shared is not None:
            o.update(vars(shared))
    spec = o.pop("spec", None)  # cli_options.policy_options: a PolicySpec (its own policy's knobs already checked)
    if spec is not None:
        o.update(vars(spec), policy=spec.name)
    check_ranges(command, o)
    if command == "compare":  # a mistyped list fails before the pair loads
        int_list(o["concurrency"], "--concurrency")
        int_list(o["fixed_k"], "--fixed-k")
    engine = check_engine_options(o) if "engine" in o else None
    if engine is not None:
        check_batching(command, o, engine)
    if o.get("temperature", None) == 0 and o.get("top_p", 1.0) != 1.0:
        raise DiscoError(
            f"--top-p {o['top_p']:g} applies to sampling only and this run decodes greedily: drop --top-p, "
            "or add --temperature above 0"
        )
    for traces in o.get("traces") or []:  # inputs first: a mistyped --traces is the likelier mistake
        if not Path(traces).exists():
            raise DiscoError(f"no trace folder or .parquet file at {traces} (make traces with: disco collect)")
    check_outputs(command, o)
    given = o.get("classifier") or []
    for path in [given] if isinstance(given, str) else given:  # generate gives one, compare a list
        _check_artifact(path, o.get("trust_pickle", False))
    if command == "generate" and o.get("policy") == "classifier" and not o.get("classifier"):
        raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
    if command == "compare" and o.get("policies"):
        check_compare_rows(o, engine)


def check_ranges(command: str, o: dict[str, Any]) -> None:
    for name, (flag, setting) in FLAGS.items():
        try:
            check_setting(setting, o.get(name), WINDOW if name == "max_window" and command in _WINDOWED else None)
        except SettingError as e:
            raise DiscoError(e.worded(flag)) from None


def _refuse(flag: str, owner: str, engine: str) -> DiscoError:
    from disco.loop.engine_registry import ENGINE_KINDS

    fix = ENGINE_KINDS[owner].select_hint
    return DiscoError(
        f"{flag} applies to the {owner} engine only, and this run uses {engine}: drop {flag.split()[0]}, or add {fix}"
    )


def check_engine_options(o: dict[str, Any]) -> str:
    """The engine the run will use, refusing the other engines' options (given, i.e. not at their
    defaults: EngineKind.owned_options) and damaged GGUF files."""
    from disco.base.options import PairOptions
    from disco.loop.engine_registry import ENGINE_KINDS, resolve_engine
    from disco.sources.pair_files import apply_pair_file

    given = {k: v for k, v in o.items() if k in PairOptions.__dataclass_fields__}
    options, _ = apply_pair_file(PairOptions(**given), o.get("chat"))
    engine = resolve_engine(options.engine, options.target, options.draft, options.device)
    defaults = PairOptions()
    for owner, kind in ENGINE_KINDS.items():
        if owner == engine:
            continue
        for name, flag in kind.owned_options:
            if name in ENGINE_KINDS[engine].shares_options:
                continue
            value = given.get(name, getattr(defaults, name))  # as given (a pair file sets no engine option)
            if value != getattr(defaults, name):
                shown = (
                    (flag if value else flag.replace("--", "--no-", 1))
                    if isinstance(value, bool)
                    else f"{flag} {value}"
                )
                raise _refuse(shown, owner, engine)
    for role, path in (("target", options.target), ("draft", options.draft)):
        if path is not None and str(path).endswith(".gguf") and Path(path).expanduser().is_file():
            check_gguf(Path(path).expanduser(), role)
    return engine


def int_list(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive whole numbers (compare's --concurrency, --fixed-k)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise DiscoError(f"{flag} {text!r}: give positive whole numbers, comma-separated (e.g. 1,8)")
    return values


def check_batching(command: str, o: dict[str, Any], engine: str) -> None:
    """The options that size batches of requests run together apply only to an engine that decodes by itself
    (EngineKind.serving: vLLM); disco's loop decodes one request at a time, so on the other engines they are
    refused: compare's --concurrency (but its default, whose levels are vLLM's, and 1, which is what disco's loop
    runs), collect's and profile's --max-batch (but their defaults)."""
    from disco.base.defaults import DEFAULT_COLLECT_MAX_BATCH, DEFAULT_CONCURRENCY, DEFAULT_VLLM_MAX_SEQS
    from disco.loop.engine_registry import ENGINE_KINDS

    if ENGINE_KINDS[engine].serving:
        return
    if command == "compare":
        levels = int_list(o["concurrency"], "--concurrency")
        given = levels not in (int_list(DEFAULT_CONCURRENCY, "--concurrency"), [1])
        shown = f"--concurrency {o['concurrency']}"
    elif command in ("collect", "profile"):
        default = DEFAULT_COLLECT_MAX_BATCH if command == "collect" else DEFAULT_VLLM_MAX_SEQS
        given = o.get("max_batch", default) != default
        shown = f"--max-batch {o.get('max_batch')}"
    else:
        return
    if given:
        owner = next(name for name, kind in ENGINE_KINDS.items() if kind.serving)
        raise _refuse(shown, owner, engine)


def check_gguf(path: Path, role: str = "model") -> None:
    """A GGUF file whose header parses and whose tensors all lie inside it (a copy cut short
    otherwise fails deep inside a tokenizer or model loader with an unrelated message)."""
    from gguf import GGUFReader

    from disco.engines.llamacpp.llamacpp_lib import is_gguf

    if not is_gguf(path):
        raise DiscoError(
            f"the {role} {path} is not a GGUF file (no GGUF header): give a GGUF file, or a transformers model folder"
        )
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # any parse failure means the same to the user: the file is not whole
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DiscoError(
            f"the {role} {path} is damaged or truncated (not a readable GGUF file: {first}): copy or download it again"
        ) from None
    if end > size:
        raise DiscoError(f"the {role} {path} is truncated ({size} of at least {end} bytes): copy or download it again")


def check_outputs(command: str, o: dict[str, Any]) -> None:
    from disco.base.files import check_out_dir, check_out_file

    if command == "generate" and o.get("json_out") is not None:
        check_out_file(o["json_out"], "--json")
    elif command == "profile" and o.get("out") is not None:
        check_out_file(o["out"], "--out")
    elif command == "compare":
        check_out_dir(o["out"], "--out", o.get("overwrite", False), "comparison")
    elif command == "train":
        out = Path(o["out"]).resolve()
        for traces in o.get("traces") or []:
            t = Path(traces).resolve()
            if out == t or t in out.parents or out in t.parents:
                raise DiscoError(
                    f"--out {o['out']} and --traces {traces} overlap: writing the artifact there would "
                    "replace the traces; choose another --out, e.g. models/NAME"
                )
        check_out_dir(o["out"], "--out", o.get("overwrite", False), "artifact")
    elif command == "collect":
        from disco.base.files import probe_writable
        from disco.formats.trace import check_trace_out
        from disco.jobs.launch import probe_lock

        out = Path(o["out"])
        check_trace_out(out)
        probe_writable(out if out.is_dir() else out.parent, "--out", out)
        if int(os.environ.get("RANK", "0")) == 0:  # the other ranks of a launch find rank 0 holding it
            probe_lock(out)


def _check_artifact(path: str, trust_pickle: bool) -> None:
    from disco.policies.artifact import load_artifact

    load_artifact(path, trust_pickle=trust_pickle)  # the pair is checked once it is loaded


def check_compare_rows(o: dict[str, Any], engine: str | None) -> None:
    """--policies must leave at least one row beside target-only on this engine and decoding."""
    from disco.jobs.compare import RULES_NAME, default_entries, select_entries, tuned_from_artifact
    from disco.loop.engine_registry import ENGINE_KINDS

    classifiers = o.get("classifier") or []
    tuned = tuned_from_artifact(classifiers[0]) if classifiers else {}
    sampling = o.get("temperature", 0) > 0
    entries = default_entries(
        classifiers[0] if classifiers else None,
        o.get("tuned_k") or tuned.get("k"),
        o.get("tuned_threshold") or tuned.get("threshold"),
        tuned=tuned,
        sampling=sampling,
        more_classifiers=classifiers[1:],
    )
    here = ENGINE_KINDS[engine].anchor_names if engine is not None else ()
    if select_entries(entries, o["policies"]) or (o.get("anchor", True) and set(here) & set(_names(o["policies"]))):
        return
    why = []
    for name in _names(o["policies"]):
        owner = next((e for e, kind in ENGINE_KINDS.items() if name in kind.anchor_names), None)
        if name in ("classifier", RULES_NAME) and not classifiers:
            why.append(f"{name} needs --classifier models/NAME")
        elif name == RULES_NAME:
            why.append("the artifact records no tuned setting of other rules")
        elif owner is not None and not o.get("anchor", True):
            why.append(f"{name} is an anchor, which --no-anchor leaves out")
        elif owner is not None:
            why.append(f"{name} runs on the {owner} engine, this run on {engine}")
        elif name == "oracle" and sampling:
            why.append("oracle is defined for greedy decoding only (--temperature 0)")
        elif name == "target":
            why.append("target-only runs anyway")
    raise DiscoError(
        f"--policies {o['policies']} selects no row to run beside target-only ({'; '.join(why) or 'none applies'}): "
        "choose other rows, or drop --policies for all of them"
    )


def _names(policies: str) -> list[str]:
    return [n.strip() for n in policies.split(",") if n.strip()]
