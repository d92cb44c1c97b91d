"""disco on vLLM's GPU defaults, checked without a GPU (docs/architecture.md, "vLLM on a GPU";
../shared/vllm-gpu-runner.md): vLLM's config built as `vllm serve` builds it, with Triton made to look present
(what makes vLLM 0.32 take its V2 runner on GPUs), yields the V1 runner and disco's proposer class, or a
one-line refusal; async scheduling is turned off by disco itself; data and pipeline parallelism and a padded
drafter batch switched off are refused in one line; an unsupported vLLM ends `vllm serve` in one line; under
tensor parallelism one rank speaks; in-process instances split a GPU's memory."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace as NS

import pytest
import torch
from tiny import perturbed, save_char_tiny, tiny_vllm_qwen

from disco.base.errors import DiscoError
from disco.vllm import config, plugin
from disco.vllm.config import ASYNC_OFF, V1_RUNNER_ENV, check_config, engine_args_defaults
from disco.vllm.draft import proposer_class
from disco.vllm.engine import DISCO_DRAFT, SpecConfig, VllmTarget
from disco.vllm.process import PROCESS, is_request, take_stats
from disco.vllm.settings import ENV, SUPPORTED_VLLM, check_version, supported

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-gpu-config")
    target = tiny_vllm_qwen()
    return save_char_tiny(target, root / "target"), save_char_tiny(perturbed(target, 0.03), root / "draft")


@pytest.fixture
def as_on_a_gpu(monkeypatch, tmp_path):
    """vLLM reading a fresh environment, with Triton present (as on a GPU machine), disco's settings given, and no
    runner chosen yet; what the test changes in vLLM's modules and this process's environment is put back."""
    import vllm.config.vllm as vllm_config_module
    from vllm import envs

    envs.disable_envs_cache()  # (an earlier in-process instance turned vLLM's cache of its environment on)
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    monkeypatch.delenv(V1_RUNNER_ENV, raising=False)
    settings = tmp_path / "disco-vllm.json"
    settings.write_text(json.dumps({"policy": {"name": "threshold", "threshold": 0.5}}))
    monkeypatch.setenv(ENV, str(settings))
    PROCESS.said.discard("async")
    yield
    envs.disable_envs_cache()


def _served_config(folders, *extra: str):
    """vLLM's config as `vllm serve` builds it from its command line (its own parser and AsyncEngineArgs)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    target, draft = folders
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
    argv = ["--model", str(target), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256"]
    argv += ["--speculative-config", json.dumps(spec), *extra]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    return AsyncEngineArgs.from_cli_args(args).create_engine_config()


def test_vllm_would_take_its_v2_runner_here_without_disco(folders, as_on_a_gpu, monkeypatch):
    """The check below can fail: with Triton present and disco's plugin not run, vLLM 0.32 takes V2 for
    draft_model (config/vllm.py, use_v2_model_runner), where disco's proposer never runs."""
    monkeypatch.delenv(ENV)
    assert _served_config(folders).use_v2_model_runner is True


def test_the_plugin_yields_the_v1_runner_and_discos_proposer(folders, as_on_a_gpu, capsys):
    import vllm.v1.worker.gpu_model_runner as runner

    plugin.register()  # what vLLM runs first in `vllm serve`'s API server (vllm.general_plugins)
    assert os.environ[V1_RUNNER_ENV] == "0"
    built = _served_config(folders)
    assert built.use_v2_model_runner is False
    assert runner.DraftModelProposer is proposer_class()  # the class the V1 runner builds for draft_model
    assert built.scheduler_config.async_scheduling is False  # (vLLM's CPU platform: nothing to say here)
    assert "async scheduling off" not in capsys.readouterr().err


def test_an_explicit_v2_runner_is_refused_in_one_line(as_on_a_gpu, monkeypatch, capsys):
    monkeypatch.setenv(V1_RUNNER_ENV, "1")
    with pytest.raises(SystemExit) as ended:
        plugin.register()
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"disco: {V1_RUNNER_ENV}=1 asks for vLLM's V2 model runner")


def test_a_config_that_still_takes_v2_is_refused(folders, as_on_a_gpu, monkeypatch):
    """Something that forces V2 after disco chose V1 (here: the V2 switch set between the plugin and the config)
    is refused as the config is built, never a server whose policy silently does nothing."""
    plugin.register()
    monkeypatch.setenv(V1_RUNNER_ENV, "1")
    with pytest.raises(DiscoError, match="V2 model runner, where disco's policy does not reach the draft"):
        _served_config(folders)


def test_a_padded_drafter_batch_switched_off_is_refused(folders, as_on_a_gpu, monkeypatch):
    from vllm.engine.arg_utils import AsyncEngineArgs

    plugin.register()
    target, draft = folders
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
    args = AsyncEngineArgs(
        model=str(target), dtype="float32", enforce_eager=True, max_model_len=256,
        speculative_config={**spec, "disable_padded_drafter_batch": True},
    )  # fmt: skip
    with pytest.raises(DiscoError, match="disable_padded_drafter_batch"):
        args.create_engine_config()


def test_vllms_own_rows_are_left_as_vllm_makes_them(folders, as_on_a_gpu, monkeypatch):
    """Without disco's settings (vLLM's own rows in-process, or a server without DISCO_VLLM_POLICY), the wrapped
    config builder changes and checks nothing."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    plugin.register()
    monkeypatch.delenv(ENV)
    target, draft = folders
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
    args = AsyncEngineArgs(model=str(target), dtype="float32", enforce_eager=True, max_model_len=256)
    args.speculative_config = {**spec, "disable_padded_drafter_batch": True}
    args.create_engine_config()  # not refused: disco does not decide here
    assert args.async_scheduling is None


def test_async_scheduling_is_turned_off_by_disco_with_one_line():
    """On a GPU async scheduling is draft_model's default; disco needs synchronous scheduling (ragged drafts) and
    turns it off itself, saying so; an explicit --async-scheduling is left for check_config to refuse."""
    draft_model = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    args = NS(async_scheduling=None, speculative_config=draft_model)
    assert engine_args_defaults(args, on_cpu=False) == ASYNC_OFF and args.async_scheduling is False
    args = NS(async_scheduling=None, speculative_config=draft_model)
    assert engine_args_defaults(args, on_cpu=True) is None and args.async_scheduling is False
    args = NS(async_scheduling=True, speculative_config=draft_model)
    assert engine_args_defaults(args, on_cpu=False) is None and args.async_scheduling is True
    args = NS(async_scheduling=None, speculative_config={"method": "custom_class"})  # vLLM turns it off itself
    assert engine_args_defaults(args, on_cpu=False) is None and args.async_scheduling is None


def _config(**parallel) -> NS:
    return NS(
        use_v2_model_runner=False,
        scheduler_config=NS(async_scheduling=False),
        speculative_config=NS(method="draft_model", disable_padded_drafter_batch=False),
        parallel_config=NS(**{"data_parallel_size": 1, "pipeline_parallel_size": 1, **parallel}),
    )


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda c: setattr(c.scheduler_config, "async_scheduling", True), "drop --async-scheduling"),
        (lambda c: setattr(c.speculative_config, "disable_padded_drafter_batch", True), "disable_padded_drafter"),
        (lambda c: setattr(c.parallel_config, "data_parallel_size", 2), "--data-parallel-size 1"),
        (lambda c: setattr(c.parallel_config, "pipeline_parallel_size", 2), "--pipeline-parallel-size 1"),
        (lambda c: setattr(c, "use_v2_model_runner", True), "V2 model runner"),
    ],
    ids=["async", "padded", "data-parallel", "pipeline-parallel", "v2"],
)
def test_what_disco_cannot_run_under_is_refused_in_one_line(change, said):
    check_config(_config())  # tensor parallelism alone is fine
    check_config(_config(tensor_parallel_size=4))
    refused = _config()
    change(refused)
    with pytest.raises(DiscoError, match=said) as e:
        check_config(refused)
    assert "\n" not in str(e.value)


def test_an_unsupported_vllm_ends_serve_in_one_line(monkeypatch, tmp_path, capsys):
    """vLLM calls plugins without a try/except: the refusal is one line and exit status 2, before anything of
    vLLM's is changed."""
    import vllm
    import vllm.v1.worker.gpu_model_runner as runner

    monkeypatch.setenv(ENV, json.dumps({"policy": {"name": "target"}}))
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    before = runner.DraftModelProposer
    with pytest.raises(SystemExit) as ended:
        plugin.register()
    assert ended.value.code == 2 and runner.DraftModelProposer is before
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "support vLLM 0.32 (installed: 0.33.0)" in err
    assert supported("0.32.0") and not supported("0.33.0") and SUPPORTED_VLLM == ("0.32",)
    check_version("0.32.0")


def test_without_settings_the_plugin_does_nothing(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(V1_RUNNER_ENV, raising=False)
    plugin.register()
    assert V1_RUNNER_ENV not in os.environ


def test_under_tensor_parallelism_only_the_first_rank_speaks(monkeypatch):
    import vllm.distributed.parallel_state as ps

    monkeypatch.setattr(ps, "model_parallel_is_initialized", lambda: True)
    monkeypatch.setattr(ps, "get_tensor_model_parallel_rank", lambda: 1)
    assert config.first_rank() is False
    monkeypatch.setattr(ps, "get_tensor_model_parallel_rank", lambda: 0)
    assert config.first_rank() is True
    monkeypatch.setattr(ps, "model_parallel_is_initialized", lambda: False)
    assert config.first_rank() is True


def test_in_process_instances_split_a_gpus_memory(folders, monkeypatch):
    """Each vLLM instance takes 0.92 of a GPU by default, so a second in-process one could not start: the
    instances a compare plans share it evenly (nothing is passed on CPUs, where vLLM reserves host RAM)."""
    target = VllmTarget(folders[0], folders[1], "float32", 256)
    assert target._memory() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert target._memory() == {"gpu_memory_utilization": 0.9}
    rows = [SpecConfig(), SpecConfig("draft_model", 3, "d"), SpecConfig(DISCO_DRAFT, 8, "d"), SpecConfig()]
    target.plan(rows)
    assert target._memory() == {"gpu_memory_utilization": 0.3}


def test_one_request_id_rule():
    """vLLM's engine adds a suffix to the id its LLM returns; the rule is written once (process.is_request) and
    used by both proposers' counts and collect's continuations."""
    assert is_request("7-ab12", "7") and is_request("7", "7")
    assert not is_request("17-ab12", "7") and not is_request("7", "7-ab12")
    finished, running = {"3-x": "stats3"}, {"4-y": NS(stats="stats4")}
    assert take_stats("3", finished, running) == "stats3" and take_stats("3", finished, running) is None
    assert take_stats("4", finished, running) == "stats4" and running == {}
