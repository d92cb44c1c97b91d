"""The GPU probe (issue 25): disco.gpu_probe.measure, run from a checkout (disco not installed: the GPU
machine). Options and outputs: that module's docstring; GPU defaults: bash bench/gpu_probe.sh OUT."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's disco

from disco.gpu_probe.measure import main  # noqa: E402

if __name__ == "__main__":
    main()
