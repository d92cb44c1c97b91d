"""The GPU probe (issue 25): the CUDA path measured on random-weight models of real shapes (`measure`,
its models in `shapes`), and the simulated speedups under the profiles it writes (`speedups`). Run from a
checkout by bench/gpu_probe.py (bench/gpu_probe.sh) and bench/gpu_simulate.py; imports nothing by itself."""
