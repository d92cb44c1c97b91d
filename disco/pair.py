"""A draft/target pair: two causal LMs sharing one tokenizer, on one device and dtype.

Models load from a Hugging Face model id, a local folder, or a GGUF file. With no model
given, the embedded Qwen2.5-Coder pair is prepared (once) and loaded from the local cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from disco.cpu import apply_cpu_backend, check_cpu_backend, cpu_backend_of
from disco.defaults import (DEFAULT_CACHE, DEFAULT_CPU_BACKEND, DEFAULT_DRAFT_QUANT, DEFAULT_ENGINE, DEFAULT_VERIFY,
                            DEVICES, ENGINES)
from disco.engines.base import as_engine
from disco.engines.torch_engine import TorchEngine, check_cache
from disco.errors import DiscoError
from disco.options import PairOptions

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EMBEDDED_NAME = "embedded"  # what the CLI and manifests call the default pair
# llama.cpp: the embedded draft runs re-quantized to Q4_0 (1.8x faster, same top-1 agreement;
# engines/llamacpp.py DRAFT_QUANTS). The target is never re-quantized: it defines the output.
EMBEDDED_DRAFT_QUANT = "q4_0"
# T5's feed-forward reads its Linear layers' .weight (a dtype check), which the packed CPU backends
# (oneDNN, int8) do not keep: encoder-decoders on the CPU use the transposed backend instead of
# oneDNN (the same float32 math on the original weights; Pair.describe() records it).
_PACKED_CPU_BACKENDS = ("onednn", "int8")
ENCODER_DECODER_CPU_BACKEND = "transposed"


@dataclass
class Pair:
    target: Any  # a torch.nn.Module (torch engine) or an engine object (disco/engines, e.g. llama.cpp)
    draft: Any
    tokenizer: Any  # the shared tokenizer (the target's)
    target_name: str  # model id, folder or GGUF path as given ("embedded:…" for the default pair)
    draft_name: str
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int]  # generation stops after any of these

    def token_classes(self) -> torch.Tensor:
        """(vocab,) class index of every token (features.token_class_table), on the device; built once."""
        if getattr(self, "_token_classes", None) is None:
            from disco.features import token_class_table

            self._token_classes = token_class_table(self.tokenizer, self.vocab_size).to(self.device)
        return self._token_classes

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def context_length(self) -> int:
        return min(as_engine(self.target).context_length, as_engine(self.draft).context_length)

    @property
    def vocab_size(self) -> int:
        """Width of the draft's logits (heads may be padded past the tokenizer's length)."""
        return as_engine(self.draft).vocab_size or len(self.tokenizer)

    @property
    def draft_hidden_size(self) -> int:
        """Width of the draft's last hidden state (a policy's `needs_hidden` input)."""
        return as_engine(self.draft).hidden_size

    @property
    def engine(self) -> str:
        return as_engine(self.target).name

    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: the chat template for instruct models (default when the
        tokenizer has one), else `tokenizer(prompt)` exactly as the tokenizer does by default."""
        return encode_prompt(self.tokenizer, prompt, self.has_chat_template if chat is None else chat)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def warm_up(self, capacity: int) -> float:
        """Compile (and capture) both models' steps before anything is timed (torch --compile), for decodes
        reaching `capacity` positions: the seconds it took, 0 when there is nothing to compile."""
        return sum(as_engine(m).warm_up(capacity) for m in (self.target, self.draft))

    def describe(self) -> dict:
        return {
            "target": self.target_name,
            "draft": self.draft_name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "tokenizer_hash": tokenizer_hash(self.tokenizer),
            # how the CPU computes the Linear layers (disco/cpu.py); int8 changes the numbers
            "cpu_backend": cpu_backend_of(self.target) if self.engine == "torch" and self.device.type == "cpu" else None,
            # torch or llama.cpp, its version, and (llama.cpp) threads, quantization, verification mode
            "engine": self._engine_info(),
        }

    def _engine_info(self) -> dict:
        info = as_engine(self.target).describe()
        if info["name"] == "llama.cpp":  # the draft's file may be re-quantized: its numbers are its own
            info["draft_quantization"] = as_engine(self.draft).description  # (describe() would probe its exact width)
        return info


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


def load_config(source: str):
    """The model's transformers config (small: read before any weights)."""
    from transformers import AutoConfig

    name, extra = _from_pretrained_args(source)
    try:
        return AutoConfig.from_pretrained(name, **extra)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DiscoError(f"could not load the config of model {source!r}: {first}") from e


def load_model(source: str, device: torch.device, dtype: torch.dtype, config=None) -> torch.nn.Module:
    """A causal LM, or a sequence-to-sequence LM (T5) when the config says encoder-decoder."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    name, extra = _from_pretrained_args(source)
    config = config if config is not None else load_config(source)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(name, config=config, dtype=dtype, **extra)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DiscoError(f"could not load model {source!r}: {first}") from e
    return model.to(device).eval()


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    name, extra = _from_pretrained_args(source)
    try:
        return AutoTokenizer.from_pretrained(name, **extra)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DiscoError(f"could not load the tokenizer of {source!r}: {first}") from e


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


def resolve_engine(engine: str, target: str | None, draft: str | None, device: str) -> str:
    """The engine a pair runs on. auto: llama.cpp for GGUF files (the embedded pair included) on the
    CPU, torch for everything else (HF ids, folders) and for every CUDA run."""
    if engine not in ENGINES:
        raise DiscoError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine == "llama.cpp" and device == "cuda":
        raise DiscoError("--engine llama.cpp runs on the CPU (llama-cpp-python is built for it here): "
                         "use --engine torch for --device cuda")
    if engine != "auto":
        return engine
    gguf = target is None or all(str(s).endswith(".gguf") for s in (target, draft) if s is not None)
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return "llama.cpp" if gguf and not cuda else "torch"


def load_pair(options: PairOptions = PairOptions()) -> Pair:
    """Load the pair `options` describe; with neither model given, the embedded Qwen2.5-Coder pair.

    engine: torch (transformers; on the CPU both models' Linear layers use `cpu_backend`,
    disco/cpu.py; `cache`: their KV caches, torch_engine.CACHES; `compile`: captured steps, on, off or
    None = auto, TorchEngine.set_compile), llama.cpp (GGUF files; `threads`,
    `verify`, `draft_quant`: load_llamacpp_pair), or auto (resolve_engine). A pair file's target,
    draft and dtype apply where the options leave them unset (apply_pair_file)."""
    options, _ = apply_pair_file(options, None)
    target, draft, device, dtype, cpu_backend, engine = (options.target, options.draft, options.device, options.dtype,
                                                         options.cpu_backend, options.engine)
    threads, verify, draft_quant, cache, compile = (options.threads, options.verify, options.draft_quant,
                                                    options.cache, options.compile)
    if (target is None) != (draft is None):
        raise DiscoError("give both --target and --draft, or neither (the embedded default pair)")
    check_cache(cache)
    engine = resolve_engine(engine, target, draft, device)
    if engine == "llama.cpp":
        if cache != DEFAULT_CACHE or compile:
            flag = f"--cache {cache}" if cache != DEFAULT_CACHE else "--compile"
            raise DiscoError(f"{flag} is for the torch engine: llama.cpp keeps its own KV cache and kernels (drop "
                             f"{flag.split()[0]}, or add --engine torch)")
        return load_llamacpp_pair(target, draft, threads, verify, draft_quant)
    check_cpu_backend(cpu_backend)
    if target is None:
        from disco import embedded

        target_dir, draft_dir = embedded.prepare_pair()
        target, draft = str(target_dir), str(draft_dir)
        names = (f"{EMBEDDED_NAME}:{embedded.EMBEDDED_TARGET.name}", f"{EMBEDDED_NAME}:{embedded.EMBEDDED_DRAFT.name}")
    else:
        names = (target, draft)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    target_tok = load_tokenizer(target)
    check_same_tokenizer(target_tok, load_tokenizer(draft), *names)
    configs = load_config(target), load_config(draft)
    kinds = [bool(getattr(c, "is_encoder_decoder", False)) for c in configs]
    if kinds[0] != kinds[1]:  # refuse before loading any weights
        role = lambda enc: "an encoder-decoder" if enc else "decoder-only"  # noqa: E731
        raise DiscoError(f"target {names[0]} is {role(kinds[0])} but draft {names[1]} is {role(kinds[1])}: "
                         "pick a draft of the target's family")
    check_cache(cache, kinds[0], names[0])  # before any weights load
    if kinds[0] and dev.type == "cpu" and cpu_backend in _PACKED_CPU_BACKENDS:
        if cpu_backend == "int8":
            raise DiscoError("--cpu-backend int8 does not support encoder-decoder models (T5): use transposed or eager")
        cpu_backend = ENCODER_DECODER_CPU_BACKEND
    target_model = load_model(target, dev, dt, configs[0])
    draft_model = load_model(draft, dev, dt, configs[1])
    if dev.type == "cpu":
        apply_cpu_backend(target_model, cpu_backend)
        apply_cpu_backend(draft_model, cpu_backend)
    for model in (target_model, draft_model):
        TorchEngine.of(model).set_cache(cache).set_compile(compile)
    return Pair(target_model, draft_model, target_tok, names[0], names[1], dev, dt, eos_ids(target_model, target_tok))


def load_llamacpp_pair(target: str | None, draft: str | None, threads: int | None = None,
                       verify: str = DEFAULT_VERIFY, draft_quant: str = DEFAULT_DRAFT_QUANT) -> Pair:
    """Two GGUF files on the llama.cpp engine; with neither given, the embedded pair's GGUFs.
    Token ids come from the transformers tokenizer read from the GGUF (cached), as on torch.
    draft_quant: run the draft re-quantized (engines.llamacpp.DRAFT_QUANTS), "none" as it is, or
    "auto": the embedded draft in EMBEDDED_DRAFT_QUANT, any other draft as it is."""
    from disco.engines.llamacpp import DRAFT_QUANTS, LlamaCppEngine, is_gguf, llama_cpp_module, requantized

    if draft_quant not in ("auto", "none", *DRAFT_QUANTS):
        raise DiscoError(f"unknown --draft-quant {draft_quant!r}: choose auto, none or {', '.join(DRAFT_QUANTS)}")

    llama_cpp_module()  # a missing install fails here, before any file work
    if target is None:
        from disco import embedded

        target_path, draft_path, tok_dir = embedded.prepare_gguf_pair()
        names = (f"{EMBEDDED_NAME}:{embedded.EMBEDDED_TARGET.name}", f"{EMBEDDED_NAME}:{embedded.EMBEDDED_DRAFT.name}")
        target_tok = draft_tok = load_tokenizer(str(tok_dir))
    else:
        names = (target, draft)
        target_path, draft_path = Path(target).expanduser(), Path(draft).expanduser()
        for role, path in (("target", target_path), ("draft", draft_path)):
            if not path.is_file():
                raise DiscoError(f"--engine llama.cpp needs GGUF files: the {role} {path} is not a file")
            if not is_gguf(path):
                raise DiscoError(f"the {role} {path} is not a GGUF file (no GGUF header): the llama.cpp engine "
                                 "runs GGUF models; use --engine torch for transformers models")
        target_tok, draft_tok = gguf_tokenizer(target_path), gguf_tokenizer(draft_path)
    check_same_tokenizer(target_tok, draft_tok, *names)
    if draft_quant == "auto":
        draft_quant = EMBEDDED_DRAFT_QUANT if target is None else "none"
    if draft_quant != "none":
        draft_path = requantized(draft_path, draft_quant)
    t_engine = LlamaCppEngine(target_path, threads, verify)
    d_engine = LlamaCppEngine(draft_path, threads, verify)
    if t_engine.vocab_size != d_engine.vocab_size:
        raise DiscoError(f"target {names[0]} has {t_engine.vocab_size} tokens but draft {names[1]} has "
                         f"{d_engine.vocab_size}: pick a draft from the target's model family")
    # What llama.cpp ends generation on (EOS, EOT, <|im_end|>, ...) plus the tokenizer's EOS:
    # target-only decoding, every policy and llama-server then stop at the same tokens.
    eos = t_engine.eog_ids() | ({target_tok.eos_token_id} if target_tok.eos_token_id is not None else set())
    return Pair(t_engine, d_engine, target_tok, names[0], names[1], t_engine.device, torch.float32, frozenset(eos))


def gguf_tokenizer(path: Path):
    """The transformers tokenizer of a GGUF file, converted once (it can take ~25 s) and cached
    under the cache root, keyed by the file's path, size and modification time."""
    from disco.embedded import cache_root
    from disco.files import atomic_dir, file_key

    folder = cache_root() / "tokenizers" / f"{path.stem}-{file_key(path)}"
    if not (folder / "tokenizer_config.json").is_file():
        tok = load_tokenizer(str(path))
        with atomic_dir(folder) as tmp:
            tok.save_pretrained(tmp)
        return tok
    return load_tokenizer(str(folder))


def pair_from_models(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, name: str = "in-memory") -> Pair:
    """A Pair around models already in memory (tests, notebooks, the transformers drop-in)."""
    param = next(target.parameters())
    names = [getattr(m.config, "_name_or_path", "") or f"{name}:{role}" for m, role in ((target, "target"), (draft, "draft"))]
    return Pair(target, draft, tokenizer, names[0], names[1], param.device, param.dtype, eos_ids(target, tokenizer))


# --- pair files: configs/pairs/*.yaml -----------------------------------------------------------

PAIR_CONFIG_KEYS = {
    "target": "target model: HF model id, local folder or .gguf file (required)",
    "draft": "draft model sharing the target's tokenizer (required)",
    "dtype": f"one of {', '.join(DTYPES)} (default auto)",
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

    path = Path(path)
    if not path.is_file():
        raise DiscoError(f"no pair file at {path} (see configs/pairs/ for the published pairs)")
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
    data.setdefault("dtype", "auto")
    if not isinstance(data["dtype"], str) or data["dtype"] not in DTYPES:
        raise DiscoError(f"{path}: dtype {data['dtype']!r} is not one of {', '.join(DTYPES)}")
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
    resolved = replace(options, target=options.target or cfg["target"], draft=options.draft or cfg["draft"],
                       dtype=cfg["dtype"] if options.dtype == "auto" else options.dtype, pair_file=None)
    return resolved, cfg["chat"] if chat is None else chat
