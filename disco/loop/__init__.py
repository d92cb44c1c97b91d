"""The live loop, the pair it drives, and the engines by name.

decode (speculative_generate), pair (load_pair), engine_registry (name -> EngineKind: the one module that
knows every engine, the vLLM wing's included, so it sits above disco/vllm/).
"""
