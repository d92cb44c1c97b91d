"""Bring classifier artifacts to the current artifact format (2: an integrity sha256 over the
manifest fields the policy acts on, disco/policies/artifact.py INTEGRITY_FIELDS) without retraining, then
load each one to check it.

    python bench/rehash_artifacts.py models/*/

A model file that no longer matches the sha256 its manifest recorded is refused, not re-hashed."""

from __future__ import annotations

import sys

from disco.policies.artifact import load_artifact, rehash_artifact


def main(folders: list[str]) -> None:
    for folder in folders:
        rehash_artifact(folder)
        art = load_artifact(folder)
        print(f"{folder}: format {art.manifest['format']}, {art.kind}, {len(art.columns)} columns, loads")


if __name__ == "__main__":
    main(sys.argv[1:])
