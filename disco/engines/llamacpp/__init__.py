"""The llama.cpp engine and llama.cpp's own speculative decoding (llama-server).

llamacpp (the engine), llamacpp_lib (the library, GGUF files), llamacpp_batch (batched drafts),
llamacpp_repack, llamacpp_cpu (the build flags; stdlib only: `make install` runs it first),
llamacpp_build and llamacpp_server (llama-server).
"""
