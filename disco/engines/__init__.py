"""Engines: what runs a model for the loop, the collector and the profiler (docs/architecture.md, "Engines").

    base       the interface (Engine, Session, Anchor, EngineKind, PairParts): below every engine
    registry   name -> EngineKind; load_parts, resolve_engine, as_engine: the only module above the engines
    torch      transformers models (HF ids, folders, GGUF dequantised to float32); GPUs and CPUs
    llama.cpp  GGUF files run natively through llama-cpp-python; the default for GGUF on the CPU

Everything that drives a model goes through the interface (decode, collect, profile, compare); the
policies, features, the simulator, train and artifacts see logits tensors and token ids only.
"""
