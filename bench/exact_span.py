"""Exact verification before and after EXACT_SPAN (issue 30): `disco compare` with the probed exact width at
every context length (the rule before: mismatches past 256 KV cells) or one token at a time past the first
256 cells (the rule now, engines/llamacpp/llamacpp.py). Everything else is the CLI as shipped.

Run: python bench/exact_span.py old|new COMPARE-ARGS...
e.g. python bench/exact_span.py old --prompts data/long-prompts.jsonl --policies target,threshold,oracle --out runs/old
"""

import sys

import disco.engines.llamacpp.llamacpp as llamacpp
from disco.cli.cli import main

if __name__ == "__main__":
    rule = sys.argv.pop(1)
    if rule not in ("old", "new"):
        sys.exit("usage: python bench/exact_span.py old|new COMPARE-ARGS...")
    if rule == "old":
        llamacpp.EXACT_SPAN = 1 << 30  # the probed width at every length
    sys.argv = ["disco", "compare", *sys.argv[1:]]
    main()
