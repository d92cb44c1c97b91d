"""disco inside vLLM (docs/architecture.md, "vLLM"): one home for everything that touches vLLM.

Its modules, each importing only those below it (pyproject's import-linter contract "disco.vllm"):

    side      the side-engine proposer (vLLM's custom_class: a draft engine of disco's own, per request)
    stages    the runner (generate, compare, profile on vLLM), `disco profile --engine vllm`, `disco collect`
    engine    the target's vLLM instances (VllmTarget), loading a pair on this engine
    plugin    the `vllm.general_plugins` entry point: what `vllm serve` runs in every vLLM process
    draft     disco's policy on vLLM's own batched draft (DiscoDraftProposer)
    process   the one owner of this process's vLLM state: the patches, the armed settings, the proposers built,
              the runner asking for drafts, vLLM's request ids
    config    what disco needs of vLLM's configuration (runner, scheduling, parallelism), checked in one place
    proposer  the interface both proposers offer the runner (a typing.Protocol)
    settings  the DISCO_VLLM_POLICY settings and the vLLM releases disco supports

Importing this package imports no vLLM: each module imports it where it needs it.
"""
