"""The torch engine: transformers models, their KV caches, and the CPU's Linear backends.

torch_engine, torch_engine_cache, cpu_backends.
"""
