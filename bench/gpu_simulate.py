"""Simulated speedup of every policy under the GPU probe's profiles (issue 25): disco.gpu_probe.speedups,
run from a checkout. Options and outputs: that module's docstring.
Rerun: python bench/gpu_simulate.py --profiles OUT --traces TRACES... (OUT: what bench/gpu_probe.py wrote)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's disco

from disco.gpu_probe.speedups import main  # noqa: E402

if __name__ == "__main__":
    main()
