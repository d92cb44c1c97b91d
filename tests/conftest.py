"""The tests run in a worker process (pyproject.toml's addopts: `-n 1`, pytest-xdist): a test that crashes
in native code (llama.cpp, torch) fails alone, its worker is replaced, and the suite goes on to its summary
line. These hooks name the signal that killed the worker, and stop a worker that crashes while collecting
(its replacements would crash the same way, one after another)."""

import signal

import pytest

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


# the test files that start vLLM (in-process instances, `vllm serve`): marked `vllm`, left out of `make test-fast`
VLLM_FILES = ("test_vllm.py", "test_vllm_draft.py", "test_vllm_closed_loop.py", "test_vllm_gpu_config.py",
              "test_collect_vllm.py")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in VLLM_FILES:
            item.add_marker(pytest.mark.vllm)
