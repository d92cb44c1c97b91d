"""Pair files (configs/pairs/*.yaml): a pair named once, with its dtype and chat setting."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from disco.base import shipped
from disco.base.defaults import DEFAULT_DTYPE, DTYPE_NAMES
from disco.base.errors import DiscoError
from disco.base.options import PairOptions

PAIR_CONFIG_KEYS = {
    "target": "target model: HF model id, local folder or .gguf file (required)",
    "draft": "draft model sharing the target's tokenizer (required)",
    "dtype": f"one of {', '.join(DTYPE_NAMES)} (default {DEFAULT_DTYPE})",
    "chat": "apply the tokenizer's chat template: true, false, or absent for the tokenizer's default",
    "name": "a short name for the pair",
    "family": "the model family (documentation only)",
    "source": "where the pair was published (documentation only)",
    "notes": "free text (documentation only)",
}


def load_pair_config(path: str | Path) -> dict:
    """A pair file (`disco generate --pair configs/pairs/opt.yaml`): {target, draft, dtype, chat, ...}.

    Only target and draft are required; dtype defaults to "auto" and chat to None (the
    tokenizer's default). Unknown keys are refused, so a typo cannot pass silently."""
    import yaml

    path = shipped.find_pair_file(path)  # the user's file, else a shipped one by name or checkout path
    if not path.is_file():
        names = ", ".join(shipped.pair_file_names())
        raise DiscoError(f"no pair file at {path} (the published pairs, by name or in configs/pairs/: {names})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise DiscoError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(data, dict):
        raise DiscoError(f"{path} must be a YAML mapping with at least target: and draft:")
    unknown = sorted(set(data) - set(PAIR_CONFIG_KEYS))
    if unknown:
        raise DiscoError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(PAIR_CONFIG_KEYS)}")
    for key in ("target", "draft"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise DiscoError(f"{path}: {key}: must name a model (HF model id, folder or .gguf file)")
    data.setdefault("dtype", DEFAULT_DTYPE)
    if not isinstance(data["dtype"], str) or data["dtype"] not in DTYPE_NAMES:
        raise DiscoError(f"{path}: dtype {data['dtype']!r} is not one of {', '.join(DTYPE_NAMES)}")
    data.setdefault("chat", None)
    if data["chat"] is not None and not isinstance(data["chat"], bool):
        raise DiscoError(f"{path}: chat must be true or false (got {data['chat']!r})")
    return data


def apply_pair_file(options: PairOptions, chat: bool | None) -> tuple[PairOptions, bool | None]:
    """(options, chat) with the pair file `options.pair_file` applied: its target, draft, dtype and chat,
    except those given explicitly (a dtype other than "auto", a chat choice other than None)."""
    if options.pair_file is None:
        return options, chat
    cfg = load_pair_config(options.pair_file)
    resolved = replace(
        options,
        target=options.target or cfg["target"],
        draft=options.draft or cfg["draft"],
        dtype=cfg["dtype"] if options.dtype == "auto" else options.dtype,
        pair_file=None,
    )
    return resolved, cfg["chat"] if chat is None else chat
