"""This machine: its CPU (name, feature flags), the cores this process may use, how many threads a draft
engine beside another engine may start, and what identifies the machine in a record of costs measured on it.

Stdlib only, and importable before disco's dependencies are installed (engines/llamacpp/llamacpp_cpu.py, run by
`make install`, reads the CPU's flags from here)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, not the machine's count (vLLM's CPU worker under
    `vllm serve` is bound to one core of two; a container may be given fewer than the host has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover -- no affinity outside Linux


def draft_threads(threads: int | None) -> int:
    """The threads of a draft engine running beside another engine in this process (vLLM's proposer): all
    usable cores by default, and never more. More threads than cores spin against the other engine's: in
    vLLM's one-core worker a two-thread llama.cpp draft made a 128-token request take 220 s, not 34 s
    (../shared/vllm-cpu.md, "`vllm serve` on a 2-core machine"). An explicit count above them is lowered,
    with one line on stderr."""
    cores = usable_cores()
    if threads is None:
        return cores
    if threads > cores:
        print(
            f"disco: the draft gets {cores} thread{'s' if cores > 1 else ''}, not the {threads} asked: this process "
            f"may run on {cores} core{'s' if cores > 1 else ''} (its CPU affinity)",
            file=sys.stderr,
            flush=True,
        )
        return cores
    return threads


# What names a machine in a record of costs measured on it. The usable cores are recorded but not compared:
# under `vllm serve` the proposer runs in a worker bound to fewer cores than `disco profile` had, on the
# same machine. The vector extensions, because a VM's CPU name may be as bare as "AMD EPYC", and vLLM's bf16
# step over 8 tokens costs 1.21 s with AVX2 alone against 0.18 s with AVX-512 BF16
# (bench/results/vllm-avx2-cpu.md, "A CPU where no window pays"); a record without a key (made before it was recorded) is compared on the keys it has.
MACHINE_KEYS = ("cpu", "isa", "cores", "memory_gib")
# the CPU features that decide what a bf16/float32 matmul costs (in /proc/cpuinfo's spelling)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def this_machine() -> dict:
    """What identifies this machine in a measurement (a load profile): the CPU's model name and vector
    extensions (ISA_FLAGS), its logical cores, the cores this process may use, and the memory in whole GiB."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flags = cpu_flags()
    return {
        "cpu": cpu_name(),
        "isa": " ".join(f for f in ISA_FLAGS if f in flags),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_gib": round(memory / 2**30),
    }


def machine_text(machine: dict) -> str:
    """A machine of this_machine() in a few words: "CPU (avx2 avx512f), 2 cores (1 usable), 8 GiB"."""
    isa = f" ({machine['isa']})" if machine.get("isa") else ""
    return (
        f"{machine.get('cpu', '?')}{isa}, {machine.get('cores', '?')} cores ({machine.get('usable_cores', '?')} "
        f"usable), {machine.get('memory_gib', '?')} GiB"
    )
