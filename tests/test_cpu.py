"""CPU backends (disco/engines/torch/cpu_backends.py): every backend keeps greedy speculative decoding lossless relative
to its own target-only decoding; the float32 backends keep eager's numbers (up to rounding)."""

import copy
import gc
import json
import os
import weakref

import pytest
import torch
from tiny import EOS, char_tokenizer, save_tiny, tiny_pair, tiny_qwen
from torch import nn

from disco.base.defaults import CPU_BACKEND_HELP, CPU_BACKENDS, DEFAULT_CPU_BACKEND
from disco.base.errors import DiscoError
from disco.base.machine import draft_threads, machine_text, this_machine
from disco.base.options import PairOptions
from disco.core.load_profiles import SIDE_ENGINE, VLLM_DRAFT, LoadProfiles, profile_machine_warning
from disco.engines.torch.cpu_backends import FLOAT32_EXACT, apply_cpu_backend, cpu_backend_of, linear_weight_bytes
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.loop.pair import load_pair
from disco.policies.policy import ConstantPolicy, HeuristicPolicy, ThresholdPolicy

PROMPTS = [[5, 6, 7], [10, 20, 30, 40, 50], [3]]


@pytest.fixture(scope="module")
def eager_pair():
    return tiny_pair(noise=0.3, dtype=torch.float32)


@pytest.fixture(scope="module", params=CPU_BACKENDS)
def backend_pair(request, eager_pair):
    target, draft = (apply_cpu_backend(copy.deepcopy(m), request.param) for m in eager_pair)
    return request.param, target, draft


def test_registry_is_consistent():
    assert DEFAULT_CPU_BACKEND in CPU_BACKENDS and DEFAULT_CPU_BACKEND in FLOAT32_EXACT
    assert set(CPU_BACKEND_HELP) == set(CPU_BACKENDS)
    assert all("\n" not in text for text in CPU_BACKEND_HELP.values())  # one line each
    assert set(FLOAT32_EXACT) <= set(CPU_BACKENDS)


def test_every_linear_is_swapped(backend_pair):
    backend, target, _ = backend_pair
    plain = sum(type(m) is nn.Linear for m in target.modules())
    assert plain == (15 if backend == "eager" else 0)  # 2 layers x 7 projections + the LM head
    assert cpu_backend_of(target) == backend


@pytest.mark.parametrize(
    "policy", [lambda: ConstantPolicy(4), lambda: HeuristicPolicy(3), lambda: ThresholdPolicy(0.5)]
)
def test_greedy_speculative_equals_own_target_only(backend_pair, policy):
    backend, target, draft = backend_pair
    config = DecodeConfig(max_new_tokens=40, max_window=8)
    for prompt in PROMPTS:
        want = target_generate(target, prompt, config, {EOS}).tokens
        got = speculative_generate(target, draft, prompt, policy(), config, {EOS})
        assert got.tokens == want, backend
        assert got.stats.drafted > 0


def test_float32_backends_keep_eager_logits(backend_pair, eager_pair):
    backend, target, _ = backend_pair
    ids = torch.tensor([[4, 8, 15, 16, 23, 42, 7, 9, 11, 30, 31, 60]])
    with torch.inference_mode():
        want = eager_pair[0](ids).logits
        got = target(ids).logits
    assert got.shape == want.shape and torch.isfinite(got).all()
    if backend in FLOAT32_EXACT:
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    else:  # int8: another model, but close to the float32 one
        assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_transformers_generate_runs_on_every_backend(backend_pair):
    """transformers' own generate() (disco compare's baseline) works on a swapped model too."""
    backend, target, _ = backend_pair
    prompt = PROMPTS[1]
    config = DecodeConfig(max_new_tokens=10)
    ours = target_generate(target, prompt, config).tokens
    with torch.inference_mode():
        hf = target.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert hf[0, len(prompt) :].tolist() == ours, backend


@pytest.mark.parametrize("backend", ["onednn", "int8"])
def test_rows_are_computed_independently(backend):
    """A token's result must not depend on the other tokens in the forward (verify k == decode 1):
    int8 must not share one activation scale across the batch."""
    lin = nn.Linear(64, 48)
    model = apply_cpu_backend(nn.Sequential(copy.deepcopy(lin)), backend)
    x = torch.randn(9, 64) * torch.logspace(-2, 2, 9).unsqueeze(1)  # rows of very different ranges
    with torch.inference_mode():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(9)])
        ref = lin(x)
    if backend == "int8":
        assert torch.equal(together, alone)
    else:
        torch.testing.assert_close(together, alone)
    torch.testing.assert_close(
        together, ref, rtol=0.05 if backend == "int8" else 1e-5, atol=0.05 * ref.abs().max().item()
    )


def test_three_dimensional_input_and_bias():
    lin = nn.Linear(16, 8, bias=True)
    x = torch.randn(2, 3, 16)
    for backend in CPU_BACKENDS:
        model = apply_cpu_backend(nn.Sequential(copy.deepcopy(lin)), backend)
        with torch.inference_mode():
            y = model(x)
        assert y.shape == (2, 3, 8)
        torch.testing.assert_close(y, lin(x).detach(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("backend", ["onednn", "int8"])
def test_repacking_backends_drop_the_original_weights(backend):
    model = tiny_qwen(dtype=torch.float32)
    refs = [weakref.ref(m.weight) for m in model.modules() if type(m) is nn.Linear]
    apply_cpu_backend(model, backend)
    gc.collect()
    assert all(r() is None for r in refs)


def test_weight_bytes():
    eager = linear_weight_bytes(tiny_qwen(dtype=torch.float32))
    assert linear_weight_bytes(apply_cpu_backend(tiny_qwen(dtype=torch.float32), "onednn")) == eager
    int8 = linear_weight_bytes(apply_cpu_backend(tiny_qwen(dtype=torch.float32), "int8"))
    assert 0.2 * eager < int8 < 0.4 * eager


def test_bad_backend_and_bad_dtype_are_clear_errors():
    with pytest.raises(DiscoError, match="unknown CPU backend 'fast'"):
        apply_cpu_backend(tiny_qwen(dtype=torch.float32), "fast")
    model = tiny_qwen(dtype=torch.float64)
    with pytest.raises(DiscoError, match="float32"):
        apply_cpu_backend(model, "onednn")
    assert sum(type(m) is nn.Linear for m in model.modules()) == 15
    assert cpu_backend_of(apply_cpu_backend(model, "transposed")) == "transposed"  # any dtype
    assert apply_cpu_backend(model, "transposed") is model  # applying it again is a no-op
    with pytest.raises(DiscoError, match="already runs on CPU backend 'transposed'"):
        apply_cpu_backend(model, "int8")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu_pair")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    return save_tiny(target, tok, root / "target"), save_tiny(draft, tok, root / "draft")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_load_pair_applies_and_records_the_backend(folders, backend):
    t, d = folders
    pair = load_pair(PairOptions(str(t), str(d), device="cpu", cpu_backend=backend))
    assert pair.describe()["cpu_backend"] == backend
    assert cpu_backend_of(pair.target) == cpu_backend_of(pair.draft) == backend


def test_load_pair_default_backend_and_bad_name(folders):
    t, d = folders
    assert load_pair(PairOptions(str(t), str(d), device="cpu")).describe()["cpu_backend"] == DEFAULT_CPU_BACKEND
    with pytest.raises(DiscoError, match="unknown CPU backend"):
        load_pair(PairOptions(str(t), str(d), device="cpu", cpu_backend="nope"))


def test_cli_generate_cpu_backend(folders, tmp_path, capsys):
    from helpers import cli

    t, d = folders
    outs = {}
    for backend in ("eager", "int8"):
        for policy in ("target", "constant"):
            path = tmp_path / f"{backend}-{policy}.json"
            code, _, err = cli(
                capsys,
                "generate",
                "--target",
                t,
                "--draft",
                d,
                "--prompt",
                "def f(x):",
                "--policy",
                policy,
                "--max-new-tokens",
                12,
                "--device",
                "cpu",
                "--cpu-backend",
                backend,
                "--json",
                path,
            )
            assert code == 0, err
            data = json.loads(path.read_text())
            assert data["pair"]["cpu_backend"] == backend
            outs[backend, policy] = data["results"][0]["token_ids"]
        assert outs[backend, "target"] == outs[backend, "constant"]
    code, _, err = cli(
        capsys, "generate", "--target", t, "--draft", d, "--prompt", "x", "--device", "cpu", "--cpu-backend", "fastest"
    )
    assert code == 2 and "unknown CPU backend 'fastest'" in err and "Traceback" not in err


def test_int8_verify_is_bit_identical_to_decode_steps():
    """int8 quantises activations: a last-bit difference between a batched forward and one-token
    steps would flip quantisation steps and grow to whole logits. Per-token scales plus per-row
    attention make verify(k) exactly k decode steps."""
    from disco.engines.torch.torch_engine import _forward
    from disco.engines.torch.torch_engine_cache import new_cache

    model = apply_cpu_backend(tiny_qwen(dtype=torch.float32, layers=3), "int8")
    ids = torch.tensor([5, 9, 14, 3, 77, 41, 8, 8, 60, 23, 12, 90, 33, 2])
    with torch.inference_mode():
        batched_cache, step_cache = new_cache(model), new_cache(model)
        _forward(model, batched_cache, ids[:5], 1)
        _forward(model, step_cache, ids[:5], 1)
        batched = _forward(model, batched_cache, ids[5:], len(ids) - 5)
        steps = torch.cat([_forward(model, step_cache, ids[i : i + 1], 1) for i in range(5, len(ids))])
    assert torch.equal(batched, steps)
    for layer in range(3):
        assert torch.equal(batched_cache.layers[layer].keys, step_cache.layers[layer].keys)


def test_rowwise_attention_matches_sdpa_and_falls_back_for_padded_batches():
    eager = tiny_qwen(dtype=torch.float32)
    int8 = apply_cpu_backend(copy.deepcopy(eager), "int8")
    sdpa = copy.deepcopy(int8)
    sdpa.set_attn_implementation("sdpa")
    ids = torch.tensor([[4, 8, 15, 16, 23, 42, 7, 9], [0, 0, 0, 16, 23, 42, 7, 9]])
    mask = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        one = int8(ids[:1]).logits
        torch.testing.assert_close(one, sdpa(ids[:1]).logits, rtol=0.05, atol=0.05 * one.abs().max().item())
        padded = int8(ids, attention_mask=mask).logits  # batch 2 with padding: transformers' sdpa path
        torch.testing.assert_close(padded, sdpa(ids, attention_mask=mask).logits)


# --- threads and the machine ---------------------------------------------------------------------


def test_a_draft_gets_no_more_threads_than_the_process_has_cores(monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # vLLM's worker under `vllm serve`
    assert draft_threads(None) == 1 and draft_threads(1) == 1
    assert capsys.readouterr().err == ""
    assert draft_threads(4) == 1
    assert (
        capsys.readouterr().err
        == "disco: the draft gets 1 thread, not the 4 asked: this process may run on 1 core (its CPU affinity)\n"
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert draft_threads(None) == 3 and draft_threads(2) == 2


def test_a_load_profile_says_when_it_was_measured_elsewhere(tmp_path, capsys):
    """`disco profile --engine vllm` records the machine; a profile from another one, or from before that
    record, is used with one warning line."""
    here = this_machine()
    profile = {"c_d": 0.01, "c_t": [1.0, 1.1], "c_step": [1.0, 1.1, 1.2]}
    assert profile_machine_warning({**profile, "machine": here}, "p.json") is None
    worker = {**here, "usable_cores": 1}  # the proposer's worker under `vllm serve`: the same machine
    assert profile_machine_warning({**profile, "machine": worker}, "p.json") is None
    before_isa = {k: v for k, v in here.items() if k != "isa"}  # recorded before the vector extensions were
    assert profile_machine_warning({**profile, "machine": before_isa}, "p.json") is None
    generation = {**here, "isa": "avx2 avx512f avx512_bf16" if here["isa"] != "avx2 avx512f avx512_bf16" else "avx2"}
    said = profile_machine_warning({**profile, "machine": generation}, "p.json")  # the same name, another ISA
    assert said is not None and f"({generation['isa']})" in said
    other = {**here, "cpu": "Some Other CPU", "cores": 64}
    said = profile_machine_warning({**profile, "machine": other}, "p.json")
    assert said is not None and f"p.json was measured on {machine_text(other)};" in said and "Some Other CPU" in said
    assert "re-run `disco profile --engine vllm`" in said
    old = profile_machine_warning(profile, "bench/vllm/profile.json")
    assert old is not None and "does not say which machine" in old
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**profile, "machine": other}))
    assert LoadProfiles(path).choose(VLLM_DRAFT).c_step == (1.0, 1.1, 1.2)
    err = capsys.readouterr().err
    assert err.startswith("disco: the load profile") and err.count("\n") == 1


def test_of_several_load_profiles_the_one_measured_here_is_used(tmp_path, capsys):
    """One profile per machine (--load-profile repeated, or a list in the proposer's settings): this machine's is
    chosen wherever it is in the list, silently; with none from here, the first, with one line saying so."""
    here, other = this_machine(), {**this_machine(), "cpu": "Some Other CPU"}
    paths = []
    for name, machine, c_d in (("xeon", other, 0.5), ("here", here, 0.25)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"c_d": c_d, "c_t": [1.0, 1.1], "c_step": [1.0, 1.1], "machine": machine}))
    assert LoadProfiles(paths).choose(VLLM_DRAFT).c_d == 0.25
    assert LoadProfiles([str(p) for p in reversed(paths)]).choose(VLLM_DRAFT).c_d == 0.25
    assert capsys.readouterr().err == ""
    assert LoadProfiles([paths[0], paths[0]]).choose(VLLM_DRAFT).c_d == 0.5
    err = capsys.readouterr().err
    assert err.startswith("disco: none of the 2 load profiles was measured on this machine; using the first")
    assert err.count("\n") == 1
    with pytest.raises(DiscoError, match="profile not found: .*missing.json"):  # every file checked
        LoadProfiles([paths[1], tmp_path / "missing.json"])


def test_each_proposer_takes_the_profile_measured_with_it(tmp_path, capsys):
    """A settings file naming profiles of both proposers on this machine gives each its own, silently, asked as
    often as compare asks; a profile of the other proposer only is used for vLLM's step costs, not its draft
    costs (the side engine drafts on llama.cpp, not in vLLM's batched forward), with one line, once."""
    here = this_machine()
    files = {}
    for proposer, c_d, c_draft in ((VLLM_DRAFT, 0.5, [0.5, 0.6]), (SIDE_ENGINE, 0.1, [])):
        path = tmp_path / f"{proposer.replace(' ', '-')}.json"
        body = {"c_d": c_d, "c_t": [1.0, 1.1], "c_step": [1.0, 1.1, 1.2], "machine": here, "proposer": proposer}
        path.write_text(json.dumps({**body, "c_draft": c_draft} if c_draft else body))
        files[proposer] = path
    both = LoadProfiles([files[VLLM_DRAFT], files[SIDE_ENGINE]])
    for _ in range(2):
        assert both.choose(SIDE_ENGINE).c_d == 0.1 and both.choose(VLLM_DRAFT).c_draft == (0.5, 0.6)
    assert capsys.readouterr().err == ""
    only_vllm = LoadProfiles(files[VLLM_DRAFT])
    side = only_vllm.choose(SIDE_ENGINE)
    assert side.c_step == (1.0, 1.1, 1.2) and side.c_draft == () and side.at_load(1).c_d == 0.5
    only_vllm.choose(SIDE_ENGINE)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{files[VLLM_DRAFT]} was measured with the vllm draft proposer, not the side engine one" in err
    assert only_vllm.choose(VLLM_DRAFT).c_draft == (0.5, 0.6) and capsys.readouterr().err == ""
