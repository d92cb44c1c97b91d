"""The GPU probe and its simulator (issue 25), on the CPU: disco.gpu_probe.measure's tiny run is lossless on
every path a CPU runs and writes profiles CostModel.load reads, without pulling the heavy packages the
GPU machine lacks; disco.gpu_probe.speedups' numbers are disco's own simulator's. Also the two fixes to
the captured path the probe needed (torch_engine: warm-up mode, dynamo's recompile limit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import char_tokenizer, tiny_pair, tiny_qwen

from disco.core.cost import CostModel
from disco.core.features import FEATURES
from disco.engines.torch.torch_engine import CapturedSteps, TorchEngine
from disco.formats.prompts import Prompt
from disco.gpu_probe import measure, speedups
from disco.gpu_probe import shapes as shapes_mod
from disco.jobs.collect import collect
from disco.loop.decode import DecodeConfig
from disco.loop.pair import pair_from_models
from disco.policies.artifact import DenseModel, load_artifact, save_artifact
from disco.training.simulate import replay_policy, simulate
from disco.training.train_data import load_trace_data, traces_for
from disco.training.tuning import policy_table

ROOT = Path(__file__).resolve().parents[1]
PROBE = "disco.gpu_probe.measure"
# not on the GPU machine (lightgbm, gguf, llama_cpp), or not wanted on the probe's path at all
BLOCKED = ("pandas", "pyarrow", "sklearn", "lightgbm", "typer", "gguf", "llama_cpp", "datasets", "matplotlib", "scipy")
CPU_PATHS = ("dynamic", "static", "static-padded")


@pytest.fixture(scope="module")
def probe_out(tmp_path_factory):
    """One tiny CPU run of the probe, in a fresh interpreter where the blocked packages cannot be imported."""
    out = tmp_path_factory.mktemp("probe")
    blocker = (
        f"import sys, runpy\nfor m in {BLOCKED!r}: sys.modules[m] = None\n"
        f"sys.argv = [{PROBE!r}] + sys.argv[1:]\nrunpy.run_module({PROBE!r}, run_name='__main__')\n"
    )
    args = [
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(out),
        "--shapes",
        str(ROOT / "configs/shapes/embedded-qwen2.5-coder.json"),
        "--prompts",
        "1",
        "--max-new-tokens",
        "16",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--context",
        "24",
    ]
    run = subprocess.run(
        [sys.executable, "-c", blocker, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


def test_tiny_probe_is_lossless_on_every_cpu_path_and_writes_profiles(probe_out):
    summary = json.loads((probe_out / "summary.json").read_text())
    assert summary["tiny"] and summary["device"] == "cpu"
    assert "static-compiled" not in summary["paths"]  # not a CPU default (CUDA graphs: next test)
    assert set(summary["lossless"]) == set(CPU_PATHS)
    for path, verdicts in summary["lossless"].items():
        policies = {k.split("/", 1)[1] for k in verdicts if k.startswith("noise/")}
        assert {
            "constant",
            "heuristic",
            "threshold",
            "adaedl",
            "svip",
            "oracle",
            "classifier-stub",
            "classifier-stub-cost-adaptive",
        } <= policies, path
        assert all(v is True for v in verdicts.values()), (path, verdicts)
        phase = summary["paths"][path]["embedded-qwen2.5-coder"]
        assert phase["status"] == "ok"
        noise = phase["lossless_noise_pair"]
        # the check is not vacuous: some drafted tokens accepted, some rejected
        assert (
            0
            < sum(e["accepted"] for k, e in noise.items() if k != "target-only")
            < sum(e["drafted"] for k, e in noise.items() if k != "target-only")
        )
        cost = CostModel.load(probe_out / phase["profile"])  # what disco train --profile reads
        assert len(cost.c_t) == 21 and cost.c_d > 0
    # the classifier's runtime needs of the blocked packages are skipped and say why
    assert "lightgbm" in summary["skipped"]["classifier-shipped"]
    assert "scikit-learn" in summary["skipped"]["threshold-adaptive"]
    assert (
        summary["paths"]["static-padded"]["embedded-qwen2.5-coder"]["lossless_noise_pair"]["constant"]["padded_tokens"]
        > 0
    )


def test_compiled_path_is_skipped_on_a_cpu_not_imitated(tmp_path):
    summary = measure.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(tmp_path),
            "--paths",
            "static-compiled",
            "--shapes",
            str(ROOT / "configs/shapes/llama-3.1-8b__llama-3.2-1b.json"),
        ]
    )
    phase = summary["paths"]["static-compiled"]["llama-3.1-8b__llama-3.2-1b"]
    assert phase["status"].startswith("skipped: needs CUDA") and "profile" not in phase
    assert not list(tmp_path.glob("profile-*.json")) and "no captured profile" in summary["goals"]["status"]


def test_shape_files_build_their_families():
    for name in ("embedded-qwen2.5-coder", "llama-3.1-8b__llama-3.2-1b"):
        shapes = shapes_mod.load_shapes(ROOT / "configs" / "shapes" / f"{name}.json")
        for role, tiny in (("target", shapes_mod.TINY), ("draft", shapes_mod.TINY_DRAFT)):
            model = shapes_mod.build_model(shapes[role]["config"], torch.device("cpu"), torch.float32, 0, tiny)
            assert model.config.model_type == shapes[role]["config"]["model_type"]
            assert model.config.num_hidden_layers == tiny["num_hidden_layers"]
    full = shapes_mod.load_shapes(ROOT / "configs/shapes/embedded-qwen2.5-coder.json")
    assert (full["target"]["config"]["num_hidden_layers"], full["draft"]["config"]["hidden_size"]) == (28, 896)


# --- gpu_simulate ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_traces_and_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    pair = pair_from_models(*tiny_pair(noise=0.3, dtype=torch.float32), char_tokenizer())
    prompts = [Prompt(f"code-{i:03d}", "code", f"def f{i}(x):\n    return x * {i}") for i in range(6)]
    collect(pair, prompts, root / "traces", DecodeConfig(max_new_tokens=24, max_window=20), progress=False)
    W = np.zeros((len(FEATURES), 1))
    W[FEATURES.index("p_chosen"), 0] = 6.0
    model = DenseModel("logistic", np.zeros(len(FEATURES)), np.ones(len(FEATURES)), [(W, np.array([-3.0]))])
    save_artifact(root / "clf", model, {"setting": 0.5, "rule": "token", "pair": pair.describe()})
    return root / "traces", root / "clf"


def test_gpu_simulate_gives_disco_simulators_numbers(probe_out, tiny_traces_and_artifact, tmp_path):
    traces, clf = tiny_traces_and_artifact
    report = speedups.main(
        [
            "--profiles",
            str(probe_out),
            "--traces",
            str(traces),
            "--classifier",
            str(clf),
            "--out",
            str(tmp_path / "table.md"),
            "--json",
            str(tmp_path / "sim.json"),
        ]
    )
    assert set(report["results"]) == set(CPU_PATHS)
    artifact = load_artifact(clf)
    data = load_trace_data([traces])
    prompts = traces_for(data, np.ones(len(data.rows), bool))
    for path, result in report["results"].items():
        cost = CostModel.load(probe_out / f"profile-embedded-qwen2.5-coder-{path}.json")
        assert result["ratios"]["c_d / c_t(1)"] == pytest.approx(cost.c_d / cost.c_t[0])
        table, _, _ = policy_table(prompts, {"shipped model": artifact}, cost, 20)  # what disco train reports
        rows = {(r["policy"], r["setting"]): r["speedup"] for r in result["rows"].values()}
        assert all(rows[(r["policy"], r["setting"])] == r["speedup"] for r in table)
        shipped = simulate(prompts, replay_policy("classifier", classifier_setting=0.5, model=artifact), 20)
        assert result["rows"][speedups.SHIPPED]["speedup"] == shipped.speedup(cost)
        k = int(result["rows"]["constant, k tuned"]["tuned_value"])
        assert result["rows"]["constant, k tuned"]["speedup"] == simulate(
            prompts, replay_policy("constant", k=k), 20
        ).speedup(cost)
    text = (tmp_path / "table.md").read_text()
    assert "| **shipped, as is** |" in text and "c_d / c_t(1)" in text and "static-padded" in text
    assert json.loads((tmp_path / "sim.json").read_text())["meta"]["prompts"] == 6


# --- the captured path's fixes ----------------------------------------------------------------------


def test_warm_up_runs_as_the_decodes_do_in_inference_mode():
    """A graph compiled with grad mode on is recompiled under the loop's inference mode (dynamo's global
    state guard), so a warm-up outside it compiled graphs no decode used."""
    model = tiny_qwen(dtype=torch.float32)
    engine = TorchEngine.of(model).set_cache("static")
    engine.steps = CapturedSteps(model, (1, 2), compiled=False)
    modes = []
    call = engine.steps.call

    def recording(*args, **kwargs):
        modes.append(torch.is_inference_mode_enabled())
        return call(*args, **kwargs)

    engine.steps.call = recording
    engine.warm_up(16)
    assert modes and all(modes)


def test_captured_models_raise_dynamos_recompile_limit():
    """Every captured forward is one code object to dynamo: its recompile limit must hold every bucket of
    every model (target + draft: 12 > the default 8), else the shapes past it run eagerly."""
    import torch._dynamo as dynamo

    name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
    before = getattr(dynamo.config, name)
    try:
        CapturedSteps(tiny_qwen(dtype=torch.float32), (1, 2, 4, 8, 16, 21))  # torch.compile is lazy: no compile here
        CapturedSteps(tiny_qwen(seed=1, dtype=torch.float32), (1, 2))
        CapturedSteps(tiny_qwen(dtype=torch.float32), (1, 2), compiled=False)
        assert getattr(dynamo.config, name) == before + 8
    finally:
        setattr(dynamo.config, name, before)


def test_captured_steps_static_cache_is_marked_static_for_cuda_graphs():
    """The engine's static cache gets its tensors from an eager forward: allocated inside the first traced
    step, transformers leaves them unmarked as static addresses, and CUDA graphs then skip every step (each
    mutates the cache). Traced here by dynamo's eager backend, as the captured path traces it."""
    model = tiny_qwen(dtype=torch.float32)
    engine = TorchEngine.of(model).set_cache("static")
    engine.steps = CapturedSteps(model, (1, 2), compiled=False)
    engine.steps.call = torch.compile(model.forward, backend="eager", dynamic=False)
    engine.warm_up(16)
    layer = engine._static.layers[0]
    assert getattr(layer.keys, "_dynamo_static_input_type", None) is not None
    assert getattr(layer.cumulative_length, "_dynamo_static_input_type", None) is not None
