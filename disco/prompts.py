"""Prompt sets: JSONL files of {"id", "task", "prompt"} (or "messages" instead of "prompt")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from disco.errors import DiscoError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"  # the prompt sets shipped in the checkout


@dataclass(frozen=True)
class Prompt:
    id: str
    task: str
    prompt: str | list[dict]  # plain text, or chat messages [{"role", "content"}, ...]


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Read a JSONL prompt file; every problem is a DiscoError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        shipped = sorted(p.name for p in DATA_DIR.glob("*.jsonl")) if DATA_DIR.is_dir() else []
        hint = f" (shipped sets: {', '.join(shipped)})" if shipped else ""
        raise DiscoError(f"prompt file not found: {path}{hint}")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DiscoError(f"{path}:{n}: not valid JSON ({e.msg}); each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise DiscoError(f"{path}:{n}: expected a JSON object with \"id\", \"task\" and \"prompt\"")
            text = row.get("prompt", row.get("messages"))
            missing = [k for k, v in (("id", row.get("id")), ("prompt", text)) if v in (None, "", [])]
            if missing:
                raise DiscoError(f"{path}:{n}: missing field {', '.join(missing)} (need \"id\" and \"prompt\" or \"messages\")")
            pid = str(row["id"])
            if pid in seen:
                raise DiscoError(f"{path}:{n}: duplicate id {pid!r}: ids must be unique")
            seen.add(pid)
            prompts.append(Prompt(pid, str(row.get("task", "default")), text))
            if limit is not None and len(prompts) >= limit:
                break
    if not prompts:
        raise DiscoError(f"{path} holds no prompts: write one JSON object per line")
    return prompts
