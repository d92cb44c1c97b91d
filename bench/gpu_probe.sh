#!/usr/bin/env bash
# The GPU probe (issue 25) with its GPU defaults: bash bench/gpu_probe.sh OUT [more bench/gpu_probe.py options]
cd "$(dirname "$0")/.." && exec "${PYTHON:-python3}" bench/gpu_probe.py --device cuda --out "${1:?usage: bash bench/gpu_probe.sh OUT [options]}" "${@:2}"
