"""How disco takes effect in vLLM (docs/architecture.md, "vLLM on a GPU"): a supported vLLM, its V1 model runner,
disco's draft proposer in it, vLLM's configuration made and checked as it is built (process.PROCESS.install).

`register()` is the `vllm.general_plugins` entry point (pyproject.toml): vLLM runs it in each of its processes
(the API server while it reads its arguments, the engine core, every worker) before it builds its configuration
or model runner. With DISCO_VLLM_POLICY set, disco takes effect; without it, nothing. vLLM calls plugins without a
try/except (plugins/__init__.py), so a refusal there is said in one line and ends the process (exit status 2)
rather than reaching the user as vLLM's traceback. In-process (compare, profile, generate) the vLLM engine calls
`take_effect()` before it builds an instance.
"""

from __future__ import annotations

import os
import sys

from disco.base.errors import DiscoError
from disco.vllm.config import choose_v1_runner
from disco.vllm.draft import proposer_class
from disco.vllm.process import PROCESS
from disco.vllm.settings import ENV, check_version


def take_effect() -> None:
    """Check vLLM's release, choose its V1 runner (before vLLM reads its environment), install disco's proposer."""
    import vllm

    check_version(vllm.__version__)  # before anything of vLLM's is changed or configured
    choose_v1_runner()
    PROCESS.install(proposer_class())


def register() -> None:
    if not os.environ.get(ENV):
        return
    try:
        take_effect()
    except DiscoError as e:
        print(f"disco: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
