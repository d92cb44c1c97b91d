"""The tests run in a worker process (pyproject.toml's addopts: `-n 1`, pytest-xdist): a test that crashes
in native code (llama.cpp, torch) fails alone, its worker is replaced, and the suite goes on to its summary
line. These hooks name the signal that killed the worker, and stop a worker that crashes while collecting
(its replacements would crash the same way, one after another).

It also marks the files that start vLLM (`vllm`), and holds the fixtures several test files use; the helpers they
share are in tests/helpers.py, the tiny models in tests/tiny.py and tests/tiny_gguf.py (a test file imports from
those, never from another test file)."""

import os
import signal

import pytest

# vLLM in this process, not in a child: the tests read the counts its proposer keeps (disco/vllm/engine.py sets
# the same for disco's own instances; set here, before any test file imports vLLM)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

_collected: set[str] = set()  # the workers that got through collection


def _killed_by(node) -> str | None:
    """'SIGSEGV (Segmentation fault)' when the worker process died by a signal; None otherwise or unknown."""
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)  # execnet's worker process
    try:
        code = popen.wait(timeout=10)
    except Exception:  # another kind of gateway, or a worker that hangs on
        return None
    return f"{signal.Signals(-code).name} ({signal.strsignal(-code)})" if code is not None and code < 0 else None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    how = _killed_by(report.node)
    if how:
        report.longrepr = f"killed by {how}: {report.longrepr}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _collected.add(node.gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if error is not None and node.gateway.id not in _collected:
        how = _killed_by(node) or error
        pytest.exit(f"the test worker crashed while collecting the tests ({how}): its output is above", 3)


def is_vllm_file(name: str) -> bool:
    """The test files that start vLLM (in-process instances, `vllm serve`) are named test_vllm*.py or test_*_vllm.py:
    marked `vllm`, left out of `make test-fast`. (test_0_host_sync_vllm_draft.py runs a stand-in, not vLLM.)"""
    return name.startswith("test_vllm") or name.endswith("_vllm.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_vllm_file(item.path.name):
            item.add_marker(pytest.mark.vllm)


# --- fixtures the test files share (a file's own fixture of the same name takes its place there) ---------------
# (they import what they use: the hooks above also run alone, in the folder test_crash.py copies this file to)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Tiny float32 model folders: (target, draft, the draft with another tokenizer: one more special token)."""
    import torch
    from tiny import char_tokenizer, save_tiny, tiny_pair

    root = tmp_path_factory.mktemp("pair")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    t = save_tiny(target, tok, root / "target")
    d = save_tiny(draft, tok, root / "draft")
    other = char_tokenizer()
    other.add_special_tokens({"bos_token": "<s>"})  # a different tokenizer: one more special token
    o = save_tiny(draft, other, root / "other")
    return t, d, o


@pytest.fixture(scope="module")
def pair32():
    """A tiny float32 pair in memory (noise 0.1), for the collector (with helpers.CONFIG and make_prompts)."""
    import torch
    from tiny import char_tokenizer, tiny_pair

    from disco.loop.pair import pair_from_models

    return pair_from_models(*tiny_pair(noise=0.1, dtype=torch.float32), char_tokenizer())


@pytest.fixture(scope="module")
def noisy_torch_pair():
    """The tiny float32 pair in memory, on the torch engine (noise 0.3: drafts agree often, not always)."""
    import torch
    from tiny import char_tokenizer, tiny_pair

    from disco.loop.pair import pair_from_models

    return pair_from_models(*tiny_pair(noise=0.3, dtype=torch.float32), char_tokenizer())


@pytest.fixture(scope="module")
def noisy_gguf_pair(tmp_path_factory):
    """The same pair written as GGUF, loaded on llama.cpp (one thread, exact verification)."""
    import torch
    from tiny import char_tokenizer, tiny_pair
    from tiny_gguf import write_tiny_gguf

    from disco.base.options import PairOptions
    from disco.loop.pair import load_pair

    root = tmp_path_factory.mktemp("gguf")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    t, d = write_tiny_gguf(target, tok, root / "target.gguf"), write_tiny_gguf(draft, tok, root / "draft.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(root / "cache"))
        return load_pair(PairOptions(str(t), str(d), engine="llama.cpp", threads=1, verify="exact"))
