"""The target's own greedy answers to the first turn of two-turn prompts (`mt-bench-2`), made once and cached.

A second-turn prompt is the conversation [user: turn 1, assistant: the target's answer, user: turn 2]:
MT-Bench's own protocol, and the multi-turn case Spec-Bench reports apart. The answer is the target's
greedy decoding of turn 1 with the run's chat setting and token budget (Spec-Bench decodes both turns
under one budget), on this pair and engine: greedy output is the engine's own (docs/architecture.md,
"Engines"), so another engine, dtype or CPU backend answers again.

Cache: one JSON file per (Pair.describe(), chat, budget) under the cache root (embedded.cache_root:
~/.cache/disco or $DISCO_CACHE), `turn1-answers/KEY.json`, holding {prompt id: {question, answer}}:
collect, compare and generate of the same pair share it. It is rewritten atomically after every answer,
so an interrupted run resumes with the answers it had; a lock makes concurrent runs (torchrun ranks, two
shells) answer each question once; an entry whose question text differs (another question file) is
answered again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from disco.base.errors import DiscoError
from disco.base.files import atomic_write_json, file_lock
from disco.formats.prompts import Prompt
from disco.jobs.runner import runner_for
from disco.loop.decode import DecodeConfig
from disco.loop.pair import Pair
from disco.policies.policy_registry import PolicySpec
from disco.sources.embedded import cache_root

ANSWERS_FORMAT = "disco-turn1-answers/1"
ANSWERS_DIR = "turn1-answers"  # under the cache root
TARGET_ONLY = PolicySpec("target")  # the answers are the target's own greedy decoding


def answers_record(pair: Pair, chat: bool, max_new_tokens: int) -> dict:
    """What the answers depend on: it names the cache file (its hash) and heads it."""
    return {"format": ANSWERS_FORMAT, "pair": pair.describe(), "chat": chat, "max_new_tokens": max_new_tokens}


def answers_path(record: dict) -> Path:
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / ANSWERS_DIR / f"{key}.json"


def _read(path: Path, record: dict) -> dict[str, dict]:
    """The cached answers of `record`; none when the file is absent, unreadable or of other settings
    (a cache: whatever is wrong with it is answered again, never trusted)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("record") != record or not isinstance(doc.get("answers"), dict):
        return {}
    return {k: v for k, v in doc["answers"].items() if isinstance(v, dict) and isinstance(v.get("answer"), str)}


def answer_first_turns(
    pair: Pair, prompts: Sequence[Prompt], max_new_tokens: int, chat: bool | None = None, progress: bool = True
) -> list[Prompt]:
    """`prompts` with every second turn still waiting (Prompt.follow_up) made the whole conversation,
    its first turn answered by the target (cached, see the module docstring); other prompts as they are."""
    pending = [p for p in prompts if p.follow_up is not None]
    if not pending:
        return list(prompts)
    chat = pair.has_chat_template if chat is None else chat
    record = answers_record(pair, chat, max_new_tokens)
    path = answers_path(record)
    with file_lock(path.with_suffix(".lock"), "waiting for another process answering the same first turns", progress):
        answers = _read(path, record)
        todo = [p for p in pending if answers.get(p.id, {}).get("question") != p.prompt]
        if todo:
            _answer(pair, todo, answers, record, path, max_new_tokens, chat, progress)
    return [p.answered(answers[p.id]["answer"]) if p.follow_up is not None else p for p in prompts]


def _answer(
    pair: Pair,
    todo: list[Prompt],
    answers: dict[str, dict],
    record: dict,
    path: Path,
    max_new_tokens: int,
    chat: bool,
    progress: bool,
) -> None:
    from tqdm import tqdm

    config = DecodeConfig(max_new_tokens=max_new_tokens)  # greedy: the target's one answer
    if progress:
        print(f"disco: answering {len(todo)} first turns with the target (cached in {path})", file=sys.stderr)
    encoded = [_encode(pair, p, max_new_tokens, chat) for p in todo]  # every check before the first answer
    # the pair's runner (disco's loop one prompt at a time; vLLM several requests at once, its own greedy output)
    runner = runner_for(pair)
    bar = tqdm(total=len(todo), desc="turn 1", unit="prompt", disable=not progress, file=sys.stderr)
    for start in range(0, len(todo), runner.group):
        chunk = range(start, min(start + runner.group, len(todo)))
        outs = runner.decode([encoded[i] for i in chunk], TARGET_ONLY, config)
        for i, res in zip(chunk, outs):
            p = todo[i]
            answers[p.id] = {"question": p.prompt, "answer": pair.decode(res.tokens).strip(), "tokens": len(res.tokens)}
        # after each group: a kill loses at most one group
        atomic_write_json(path, {"record": record, "answers": answers})
        bar.update(len(chunk))
    bar.close()


def _encode(pair: Pair, p: Prompt, max_new_tokens: int, chat: bool) -> list[int]:
    try:
        ids = pair.encode(p.prompt, chat)
    except DiscoError as e:
        raise DiscoError(f"prompt {p.id!r}: {e}") from e
    if len(ids) + max_new_tokens > pair.context_length:
        raise DiscoError(
            f"prompt {p.id!r}: its first turn ({len(ids)} tokens) plus --max-new-tokens {max_new_tokens} "
            f"exceeds the models' context of {pair.context_length} tokens: lower --max-new-tokens"
        )
    return ids
