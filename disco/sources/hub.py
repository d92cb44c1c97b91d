"""Loading models and tokenizers from a Hugging Face id, a local folder or a GGUF file, and the tokenizer
facts a pair must share (docs/architecture.md, "Engines"). Engine-neutral: each engine's pair loader
(engines/torch/torch_engine.py, engines/llamacpp/llamacpp.py) builds on these."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from disco.base.defaults import DEVICES
from disco.base.errors import DiscoError

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise DiscoError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DiscoError("--device cuda was asked for but no CUDA GPU is visible: use --device cpu or auto")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype not in DTYPES:
        raise DiscoError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if dtype == "auto":
        # bf16 halves the bytes a GPU decode step reads; CPUs without bf16 units are faster in fp32.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def _looks_like_path(source: str) -> bool:
    return source.startswith((".", "/", "~")) or source.endswith(".gguf") or Path(source).exists()


def _from_pretrained_args(source: str) -> tuple[str, dict]:
    """(name_or_path, extra kwargs) for from_pretrained: a folder, a GGUF file, or a hub id."""
    if _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise DiscoError(f"no such model folder or GGUF file: {source} (check the path)")
        if path.is_file():
            if path.suffix != ".gguf":
                raise DiscoError(f"{source} is a file but not a .gguf model: give a model folder or a GGUF file")
            return str(path.parent), {"gguf_file": path.name}
        if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
            raise DiscoError(f"{source} has no config.json: it is not a transformers model folder")
        return str(path), {}
    return source, {}  # a hub model id: transformers downloads it (users have the network)


def _first_line(e: Exception) -> str:
    """What a loader's error says, in one line (transformers' messages run to paragraphs)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_config(source: str):
    """The model's transformers config (small: read before any weights)."""
    from transformers import AutoConfig

    name, extra = _from_pretrained_args(source)
    try:
        return AutoConfig.from_pretrained(name, **extra)
    except (OSError, ValueError) as e:
        raise DiscoError(f"could not load the config of model {source!r}: {_first_line(e)}") from e


def load_model(source: str, device: torch.device, dtype: torch.dtype, config=None) -> torch.nn.Module:
    """A causal LM, or a sequence-to-sequence LM (T5) when the config says encoder-decoder."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    name, extra = _from_pretrained_args(source)
    config = config if config is not None else load_config(source)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(name, config=config, dtype=dtype, **extra)
    except (OSError, ValueError) as e:
        raise DiscoError(f"could not load model {source!r}: {_first_line(e)}") from e
    return model.to(device).eval()


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    name, extra = _from_pretrained_args(source)
    try:
        return AutoTokenizer.from_pretrained(name, **extra)
    except (OSError, ValueError) as e:
        raise DiscoError(f"could not load the tokenizer of {source!r}: {_first_line(e)}") from e


def _special_tokens(tok) -> dict:
    return {k: getattr(tok, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a pair whose tokenizers differ: token ids would mean different text to each model."""
    problems = []
    if target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append(f"vocabularies differ ({len(target_tok)} vs {len(draft_tok)} tokens)")
    if _special_tokens(target_tok) != _special_tokens(draft_tok):
        problems.append(f"special tokens differ ({_special_tokens(target_tok)} vs {_special_tokens(draft_tok)})")
    if problems:
        raise DiscoError(
            f"target {target_name} and draft {draft_name} do not share a tokenizer: {'; '.join(problems)}. "
            "Pick a draft from the target's model family, or use transformers' universal assisted "
            "generation (generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...)) for such pairs"
        )


def tokenizer_hash(tok) -> str:
    """A short fingerprint of vocabulary + special tokens, recorded in traces and artifacts."""
    payload = json.dumps([sorted(tok.get_vocab().items()), _special_tokens(tok)])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool) -> list[int]:
    if isinstance(prompt, str) and not prompt.strip():
        raise DiscoError("the prompt is empty: give some text")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise DiscoError("--chat needs a tokenizer with a chat template: use --no-chat for this model")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding here; 4.x a plain list
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if not isinstance(prompt, str):
        prompt = "\n".join(m["content"] for m in prompt)
    return list(tokenizer(prompt)["input_ids"])


def eos_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return frozenset(ids)


def gguf_tokenizer(path: Path):
    """The transformers tokenizer of a GGUF file, converted once (it can take ~25 s) and cached
    under the cache root, keyed by the file's path, size and modification time."""
    from disco.base.files import atomic_dir, file_key
    from disco.sources.embedded import cache_root

    folder = cache_root() / "tokenizers" / f"{path.stem}-{file_key(path)}"
    if not (folder / "tokenizer_config.json").is_file():
        tok = load_tokenizer(str(path))
        with atomic_dir(folder) as tmp:
            tok.save_pretrained(tmp)
        return tok
    return load_tokenizer(str(folder))
