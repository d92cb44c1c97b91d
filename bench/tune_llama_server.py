"""Tune llama.cpp's own speculative decoding (llama-server -md) on the classifier's validation prompts and
write the best setting beside the artifact: disco.jobs.server_tuning (what it measures, and the file `disco
compare` and `disco demo` read). Rerun:

    .venv/bin/python bench/tune_llama_server.py --classifier models/embedded-qwen2.5-coder-llamacpp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disco.base.defaults import SERVER_TUNING_N_MAX, SERVER_TUNING_P_MIN  # noqa: E402
from disco.jobs.server_tuning import TUNED_FILE, tune_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classifier", type=Path, required=True, help="artifact folder (its validation prompts)")
    ap.add_argument("--per-task", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--n-max", default=",".join(map(str, SERVER_TUNING_N_MAX)), help="comma list of --spec-draft-n-max values"
    )
    ap.add_argument(
        "--p-min", default=",".join(map(str, SERVER_TUNING_P_MIN)), help="comma list of --draft-p-min values"
    )
    args = ap.parse_args()
    best = tune_server(
        args.classifier,
        args.per_task,
        args.max_new_tokens,
        [int(x) for x in args.n_max.split(",")],
        [float(x) for x in args.p_min.split(",")],
    )
    row = next(r for r in best["grid"] if (r["n_max"], r["p_min"]) == (best["n_max"], best["p_min"]))
    print(
        f"best: n-max {best['n_max']}, p-min {best['p_min']} ({row['tok_s']:.2f} tok/s); "
        f"wrote {args.classifier / TUNED_FILE}"
    )


if __name__ == "__main__":
    main()
