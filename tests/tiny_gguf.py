"""Write a tiny transformers Qwen2 model and its tokenizer as one GGUF file, for offline tests of the
llama.cpp engine (llama-cpp-python) and of transformers' GGUF loading.

The file is what llama.cpp's convert_hf_to_gguf.py would write for a Qwen2 checkpoint (Qwen2Model
there), cut down to what llama.cpp and transformers read: arch "qwen2", F32 tensors under llama.cpp's
names, and a byte-level BPE vocabulary ("gpt2" model, "qwen2" pre-tokenizer) with no merges, so that
every character is its own token, as in tests/tiny.py's char_tokenizer()."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

# transformers name (inside a layer, or whole) -> llama.cpp name; ".weight"/".bias" are kept as is.
# Unlike LlamaModel, convert_hf_to_gguf.py does not permute Q/K rows for Qwen2: llama.cpp runs qwen2
# with NEOX-style rope (rotate halves), which is the layout transformers' rotate_half already uses.
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


class _Writer(gguf.GGUFWriter):
    """GGUFWriter that can write an empty array.

    llama.cpp refuses a "gpt2" vocabulary without a tokenizer.ggml.merges key, and transformers
    builds its BPE from that key (a merge needs its result in the vocabulary, so no harmless
    placeholder merge exists). An empty array is valid GGUF and both readers take it, but
    GGUFWriter drops empty arrays in add_array and raises on them when packing."""

    def _pack_val(
        self, val: Any, vtype: gguf.GGUFValueType, add_vtype: bool, sub_type: gguf.GGUFValueType | None = None
    ) -> bytes:
        if vtype == gguf.GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _gguf_name(hf_name: str) -> str:
    stem, _, kind = hf_name.rpartition(".")  # kind: weight | bias
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    _, _, block, local = stem.split(".", 3)  # model.layers.N.<local>
    return f"blk.{block}.{_LAYER_NAMES[local]}.{kind}"


def _vocab(tokenizer: PreTrainedTokenizerBase, extra_tokens: Sequence[str], n_rows: int) -> tuple[list[str], list[int]]:
    """Tokens as a byte-level BPE vocabulary spells them, and their llama.cpp token types.

    The tokenizer's tokens are taken as raw text (char_tokenizer's are single characters), and
    spelled in GPT-2's byte-to-unicode alphabet (" " -> "Ġ", "\\n" -> "Ċ"), which is what both
    llama.cpp and transformers look up after byte-level pre-tokenization."""
    spell = bytes_to_unicode()
    special = set(tokenizer.all_special_ids)
    tokens: list[str] = []
    types: list[int] = []
    for i in range(len(tokenizer)):
        text = tokenizer.convert_ids_to_tokens(i)
        if i in special:  # control tokens are stored verbatim; both sides match them whole
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append("".join(spell[b] for b in text.encode("utf-8")))
            types.append(gguf.TokenType.NORMAL)
    # USER_DEFINED: llama.cpp and transformers both match these whole in the text, so the extra
    # tokens really get used (with no merges, NORMAL multi-character tokens would be unreachable).
    for text in extra_tokens:
        # llama.cpp matches user-defined tokens as raw text, transformers by their byte-level
        # spelling; the two agree only where the spelling is the text itself (printable ASCII).
        if "".join(spell[b] for b in text.encode("utf-8")) != text:
            raise ValueError(f"extra token {text!r}: use printable ASCII without spaces")
        tokens.append(text)
        types.append(gguf.TokenType.USER_DEFINED)
    # Model rows no token owns, as convert_hf_to_gguf.py writes them.
    for i in range(len(tokens), n_rows):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    if len(set(tokens)) != len(tokens):
        raise ValueError("extra_tokens repeat a token already in the vocabulary")
    return tokens, types


def write_tiny_gguf(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    path: Path,
    chat_template: str | None = None,
    extra_tokens: Sequence[str] = (),
) -> Path:
    """Write `model` (a transformers Qwen2ForCausalLM) and `tokenizer` to the GGUF file `path`.

    chat_template: stored as tokenizer.chat_template (default: the tokenizer's own, if any).
    extra_tokens: strings appended to the vocabulary as user-defined tokens, for a pair of files
    whose vocabularies differ; the model gets zero embedding and output rows for them (logit 0).
    """
    cfg = model.config
    tokens, types = _vocab(tokenizer, extra_tokens, cfg.vocab_size)
    n_vocab = len(tokens)

    path.parent.mkdir(parents=True, exist_ok=True)
    w = _Writer(path, "qwen2")
    w.add_name("tiny-qwen2")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    # transformers 5 keeps rope_theta in rope_parameters; older configs have it at the top level.
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")  # selects the Qwen2 split regex in llama.cpp and in transformers
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_key_value(gguf.Keys.Tokenizer.MERGES, [], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    w.add_eos_token_id(tokenizer.eos_token_id)
    # llama.cpp's "gpt2" vocabularies default BOS to id 11 (a letter here) when the key is missing;
    # Qwen2's own GGUFs set BOS = <|endoftext|> and never add it, so do the same with EOS.
    w.add_bos_token_id(tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    if tokenizer.pad_token_id is not None:
        w.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.unk_token_id is not None:
        w.add_unk_token_id(tokenizer.unk_token_id)
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        w.add_chat_template(template)

    for name, tensor in model.state_dict().items():
        data = tensor.detach().to(torch.float32).cpu().numpy()
        if name in ("model.embed_tokens.weight", "lm_head.weight") and data.shape[0] < n_vocab:
            data = np.concatenate([data, np.zeros((n_vocab - data.shape[0], data.shape[1]), np.float32)])
        # Same (rows, cols) order as torch: GGUF stores dims reversed, as llama.cpp's ggml expects.
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(data))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
