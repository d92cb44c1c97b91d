"""Engines: what runs a model for the loop, the collector and the profiler (docs/architecture.md, "Engines").

    base       the interface (Engine, Session, Anchor, EngineKind, PairParts): below every engine
    torch/     transformers models (HF ids, folders, GGUF dequantised to float32); GPUs and CPUs
    llamacpp/  GGUF files run natively through llama-cpp-python; the default for GGUF on the CPU

The engines by name (loop/engine_registry.py) sit above vllm/, which runs on these engines.
Everything that drives a model goes through the interface (decode, collect, profile, compare); the
policies, features, the simulator, train and artifacts see logits tensors and token ids only.
"""
