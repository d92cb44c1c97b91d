"""Engines: what runs a model for the loop, the collector and the profiler (DESIGN.md §5b).

    torch      transformers models (HF ids, folders, GGUF dequantised to float32); GPUs and CPUs
    llama.cpp  GGUF files run natively through llama-cpp-python; the default for GGUF on the CPU

Everything above this package (policies, features, the simulator, train, artifacts) is
engine-agnostic: it sees logits tensors and token ids only.
"""

from disco.defaults import ENGINES
from disco.engines.base import Engine, Session, as_engine

__all__ = ["ENGINES", "Engine", "Session", "as_engine"]
