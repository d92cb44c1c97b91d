"""Every model family of the published pairs: OPT, CodeGen, GPT-NeoX (Pythia), Llama, GPTBigCode
(StarCoder), Qwen2 and T5 (encoder-decoder). Per family, a tiny random-weight target and a draft
(the target's weights plus noise) built in-process from the family's config class, sharing the
character tokenizer's vocabulary: the loop equals transformers' greedy generate, every policy is
lossless, the teacher-forced trace equals the live oracle loop, and collect -> train -> generate
with the trained classifier round-trips. Plus the pair files (configs/pairs/*.yaml), `--pair`,
and the refusals (different tokenizers, decoder-only mixed with encoder-decoder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf
from helpers import RecordingOracle, cli, cli_args
from tiny import CHARS, EOS, SPECIALS, VOCAB, char_tokenizer, perturbed, save_tiny

from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.core.features import FEATURES, token_class_table
from disco.engines.torch.torch_engine import (
    AssistedGeneration,
    CapturedSteps,
    TorchEngine,
    model_kind,
    resolve_cache,
)
from disco.engines.torch.torch_engine_cache import past_recording_works
from disco.formats.prompts import Prompt
from disco.hf import disco_generate
from disco.jobs.collect import collect, teacher_forced_trace
from disco.jobs.compare import default_entries, run_compare
from disco.loop.decode import DecodeConfig, generate, speculative_generate, target_generate
from disco.loop.engine_registry import teacher_forced
from disco.loop.pair import load_pair, load_pair_config, pair_from_models
from disco.policies.policy_registry import PolicySpec, make_policy
from disco.sources.hub import check_same_tokenizer
from disco.training.train import TrainConfig, train
from disco.training.tuning import RULE_GRIDS

ROOT = Path(__file__).resolve().parent.parent
_COMMON = dict(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)

# family -> (config class, model class, the config's size arguments: 2 layers, width 32)
FAMILIES = {
    "opt": (
        tf.OPTConfig,
        tf.OPTForCausalLM,
        dict(
            hidden_size=32,
            ffn_dim=64,
            word_embed_proj_dim=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
        ),
    ),
    "codegen": (
        tf.CodeGenConfig,
        tf.CodeGenForCausalLM,
        dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, rotary_dim=4, n_positions=256, n_ctx=256),
    ),
    "gpt_neox": (
        tf.GPTNeoXConfig,
        tf.GPTNeoXForCausalLM,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            rotary_pct=0.25,
            max_position_embeddings=256,
        ),
    ),
    "llama": (
        tf.LlamaConfig,
        tf.LlamaForCausalLM,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
    ),
    "gpt_bigcode": (
        tf.GPTBigCodeConfig,
        tf.GPTBigCodeForCausalLM,
        dict(  # StarCoder: multi-query attention
            n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=256, multi_query=True
        ),
    ),
    "qwen2": (
        tf.Qwen2Config,
        tf.Qwen2ForCausalLM,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
    ),
    "t5": (
        tf.T5Config,
        tf.T5ForConditionalGeneration,
        dict(  # flan-t5: gated-gelu, untied head
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            feed_forward_proj="gated-gelu",
            decoder_start_token_id=0,
        ),
    ),
}
DRAFT_NOISE = {"t5": 0.1}  # the draft's weight noise: enough agreement to exercise the accept path
PROMPTS = [[(7 * i + 3 * j) % 90 + 3 for j in range(1 + i % 7)] for i in range(12)]


def _redraw_in_name_order(model: torch.nn.Module, seed: int) -> None:
    """Draw the random weights again, in parameter-name order. transformers draws them in the order a version
    registers its modules (CodeGen's attention registers qkv_proj before out_proj in 5.19, after it in 5.24), so
    the same seed gave another tiny pair on each; the checks that depend on the pair (a classifier trained on its
    traces drafts) need one pair on every version."""
    cfg = model.config
    std = getattr(cfg, "initializer_range", None) or getattr(cfg, "init_std", None)
    if std is None:
        return  # T5: a per-module init scale (no single std to draw with); its order has not changed
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, module in sorted(model.named_modules(), key=lambda item: item[0]):
            for _, p in sorted(module.named_parameters(recurse=False), key=lambda item: item[0]):
                if p.dim() >= 2:  # matrices are drawn; vectors (norm weights, biases) are constants
                    p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
            if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()  # as transformers' init leaves it


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    config_cls, model_cls, size = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**size, **_COMMON)).to(dtype).eval()
    _redraw_in_name_order(model, seed)
    head = model.get_output_embeddings()
    with torch.no_grad():
        if head.weight is model.get_input_embeddings().weight:
            # T5 ties its head to the input embeddings (transformers 5 forces it); a random tied head
            # makes the decoder repeat its input token forever, whatever the prompt. Give the head its
            # own weights, as flan-t5 checkpoints have.
            head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, dtype=dtype))
        head.weight.mul_(20.0)  # random init gives near-uniform logits: sharpen them so greedy is far from ties
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models spend their time in per-op overhead: more threads only contend (2-20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_PAIRS: dict[str, tuple] = {}


def tiny_family_pair(family: str):
    """(target, draft) for a family: built once per test session."""
    if family not in _PAIRS:
        target = tiny_model(family)
        _PAIRS[family] = (target, perturbed(target, DRAFT_NOISE.get(family, 0.3), by_name=True))
    return _PAIRS[family]


def _generated(model, out: torch.Tensor, n_prompt: int) -> list[int]:
    """transformers' generate returns prompt + output (decoder-only) or start token + output (T5)."""
    return out[0, 1 if model.config.is_encoder_decoder else n_prompt :].tolist()


# --- the loop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_target_loop_matches_transformers_generate(family):
    target, _ = tiny_family_pair(family)
    assert model_kind(target).encoder_decoder == (family == "t5")
    for prompt in PROMPTS[:4]:
        ours = target_generate(target, prompt, DecodeConfig(max_new_tokens=12)).tokens
        ref = target.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert ours == _generated(target, ref, len(prompt)), prompt


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_lossless_every_policy(family):
    target, draft = tiny_family_pair(family)
    refs = {}
    for i, prompt in enumerate(PROMPTS):
        max_new = [1, 2, 7, 16, 24][i % 5]
        refs[i] = target_generate(target, prompt, DecodeConfig(max_new_tokens=max_new)).tokens
    for name in ("constant", "heuristic", "threshold", "adaptive", "oracle"):
        accepted = 0
        for i, prompt in enumerate(PROMPTS):
            config = DecodeConfig(max_new_tokens=len(refs[i]), max_window=6)
            policy = make_policy(
                "threshold" if name == "adaptive" else name, adaptive=name == "adaptive", k=3, target_tokens=refs[i]
            )
            res = speculative_generate(target, draft, prompt, policy, config)
            assert res.tokens == refs[i], (family, name, prompt)
            assert res.stats.recomputed_tokens == 0  # every family's cache is cropped, never re-run
            accepted += res.stats.accepted
        assert accepted > 0, name  # the draft does agree sometimes: the accept path runs
    # sampling runs too (its distribution is tested on stubs in test_decode)
    res = speculative_generate(
        target,
        draft,
        PROMPTS[3],
        make_policy("constant", k=3),
        DecodeConfig(max_new_tokens=12, max_window=4, temperature=1.0, seed=1),
    )
    assert len(res.tokens) == 12 and res.stats.drafted > 0


DECODER_ONLY = [f for f in FAMILIES if f != "t5"]


@pytest.fixture
def static_caches():
    """Run the given models' decodes on static caches (TorchEngine.set_cache), dynamic again after."""
    engines = []

    def use(*models):
        for m in models:
            engines.append(TorchEngine.of(m).set_cache("static"))

    yield use
    for engine in engines:
        engine.set_cache("auto").set_compile(False)


@pytest.mark.parametrize("family", DECODER_ONLY)
def test_static_cache_lossless_every_policy(family, static_caches):
    """On preallocated, position-indexed caches (rollback moves a length) the loop's greedy output
    equals the dynamic loop's and target-only's, for every policy, with no token re-run."""
    target, draft = tiny_family_pair(family)
    configs = [DecodeConfig(max_new_tokens=[2, 7, 16, 24][i % 4], max_window=6) for i in range(len(PROMPTS))]
    refs = [target_generate(target, p, c).tokens for p, c in zip(PROMPTS, configs)]
    dynamic = {
        name: [
            speculative_generate(target, draft, p, make_policy(name, k=3, target_tokens=r), c).tokens
            for p, c, r in zip(PROMPTS, configs, refs)
        ]
        for name in ("constant", "threshold", "oracle")
    }
    static_caches(target, draft)
    assert isinstance(TorchEngine.of(target).session(torch.tensor(PROMPTS[0]), capacity=20).cache, tf.StaticCache)
    assert [target_generate(target, p, c).tokens for p, c in zip(PROMPTS, configs)] == refs
    for name in ("constant", "heuristic", "threshold", "adaptive", "oracle"):
        accepted = drafted = 0
        for i, (prompt, config, ref) in enumerate(zip(PROMPTS, configs, refs)):
            policy = make_policy(
                "threshold" if name == "adaptive" else name, adaptive=name == "adaptive", k=3, target_tokens=ref
            )
            res = speculative_generate(target, draft, prompt, policy, config)
            assert res.tokens == ref, (family, name, prompt)
            assert name not in dynamic or res.tokens == dynamic[name][i]
            assert res.stats.recomputed_tokens == 0
            accepted, drafted = accepted + res.stats.accepted, drafted + res.stats.drafted
        assert accepted > 0 and (drafted > accepted or name == "oracle")  # rollback after partial acceptance ran


def _static_layer_classes():
    from transformers import cache_utils

    return [c for c in vars(cache_utils).values() if isinstance(c, type) and issubclass(c, cache_utils.StaticLayer)]


@pytest.fixture(params=["crop", "counters"])
def static_rollback(request, monkeypatch):
    """Both ways a static cache rolls back: transformers' StaticLayer.crop (5.24 on), and the engine moving the
    layers' counters itself (`rewind`, what transformers before 5.24 needs: here with crop taken away)."""
    has_crop = [c for c in _static_layer_classes() if "crop" in vars(c)]
    if request.param == "crop" and not has_crop:
        pytest.skip(f"transformers {tf.__version__} has no StaticLayer.crop")
    for cls in has_crop if request.param == "counters" else ():
        monkeypatch.delattr(cls, "crop")
    return request.param


@pytest.mark.parametrize("family", ["llama", "gpt_bigcode"])
def test_static_rollback_keeps_exactly_the_committed_prefix(family, static_caches, static_rollback):
    """After a rejected window, the static cache's valid length is the committed prefix, and the next
    forward sees that prefix only (stale entries past it are overwritten or masked)."""
    target, _ = tiny_family_pair(family)
    static_caches(target)
    seq = torch.tensor([5, 9, 14, 20, 7, 3, 11, 30, 2, 8])
    session = TorchEngine.of(target).session(seq[:4], capacity=16)
    session.prefill()
    session.forward(seq[3:9], 1)  # the pending token and 5 more: 9 positions
    assert session.length == 9 and int(session.cache.get_seq_length()) == 9
    session.truncate(6)  # keep prompt + 2 output tokens
    assert session.length == 6 and int(session.cache.get_seq_length()) == 6
    other = torch.tensor([40, 41, 42])  # not what the stale entries at 6.. held
    assert session.unseen(torch.cat([seq[:6], other])).tolist() == other.tolist()
    got = session.forward(other, 3)
    ref, _ = teacher_forced(target, torch.cat([seq[:6], other, seq[:1]]), 7)  # uncached logits at positions 6..8
    assert torch.allclose(got, ref, atol=1e-9, rtol=0)
    assert session.length == 9


def test_padded_verify_equals_unpadded(static_caches):
    """Captured steps pad a feed up to its bucket: the real positions' logits equal an unpadded
    forward's, the filler's cache entries are rolled back, and the loop stays lossless."""
    target, draft = tiny_family_pair("llama")
    static_caches(target, draft)
    seq = torch.tensor([5, 9, 14, 20, 7, 3, 11, 30, 2, 8, 40, 41])
    plain = TorchEngine.of(target).session(seq[:3], capacity=16)
    plain.prefill()
    TorchEngine.of(target).steps = CapturedSteps(target, (1, 2, 4, 8), compiled=False)
    padded = TorchEngine.of(target).session(seq[:3], capacity=16)
    padded.prefill()
    assert padded.steps is not None and plain.steps is None
    for feed, keep in ((seq[2:5], 3), (seq[5:10], 5), (seq[10:11], 1)):  # widths 3, 5, 1 -> buckets 4, 8, 1
        assert torch.allclose(padded.forward(feed, keep), plain.forward(feed, keep), atol=1e-9, rtol=0)
        assert padded.length == plain.length == int(padded.cache.get_seq_length())
    assert padded.padded == 1 + 3
    padded.truncate(6)
    plain.truncate(6)
    assert torch.allclose(padded.forward(seq[6:8], 2), plain.forward(seq[6:8], 2), atol=1e-9, rtol=0)

    TorchEngine.of(draft).steps = CapturedSteps(draft, (1, 2, 4, 8), compiled=False)
    config = DecodeConfig(max_new_tokens=16, max_window=6)  # verify widths up to 7: padded to 8
    padded_runs = 0
    for prompt in PROMPTS[:6]:
        ref = target_generate(target, prompt, config).tokens
        for name in ("constant", "threshold"):
            res = speculative_generate(target, draft, prompt, make_policy(name, k=3), config)
            assert res.tokens == ref
            # (a run whose feeds all happen to be bucket-wide, e.g. constant k=3's verify of 4, pads nothing)
            padded_runs += res.stats.padded_tokens > 0
    assert padded_runs >= 6


def test_compiled_steps_equal_eager(static_caches):
    """torch.compile on the CPU (no CUDA graphs here): the compiled steps decode exactly as eager,
    compiled once by warm_up, before any decode."""
    target = tiny_model("qwen2", dtype=torch.float32)
    draft = perturbed(target, 0.3, by_name=True)
    config = DecodeConfig(max_new_tokens=12, max_window=3)
    refs = [target_generate(target, p, config).tokens for p in PROMPTS[:3]]
    spec = [speculative_generate(target, draft, p, make_policy("constant", k=3), config).tokens for p in PROMPTS[:3]]
    static_caches(target, draft)
    for m in (target, draft):
        TorchEngine.of(m).set_compile(True, buckets=(1, 2, 4))
    assert TorchEngine.of(target).warm_up(32) > 0 and TorchEngine.of(draft).warm_up(32) > 0
    for prompt, ref, sp in zip(PROMPTS[:3], refs, spec):
        assert target_generate(target, prompt, config).tokens == ref
        res = speculative_generate(target, draft, prompt, make_policy("constant", k=3), config)
        assert res.tokens == sp == ref and res.stats.padded_tokens > 0  # width 3 -> bucket 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_cuda_graphs_equal_eager(static_caches):
    target = tiny_model("qwen2", dtype=torch.float32).cuda()
    draft = perturbed(target, 0.3, by_name=True).cuda()
    config = DecodeConfig(max_new_tokens=24, max_window=6)
    eager = [speculative_generate(target, draft, p, make_policy("threshold"), config).tokens for p in PROMPTS[:4]]
    static_caches(target, draft)
    for m in (target, draft):
        assert resolve_cache(m, "auto") == "static"
        TorchEngine.of(m).set_compile(None)  # auto: captured on CUDA
        assert TorchEngine.of(m).steps is not None and TorchEngine.of(m).warm_up(64) > 0
    for prompt, ref in zip(PROMPTS[:4], eager):
        assert speculative_generate(target, draft, prompt, make_policy("threshold"), config).tokens == ref


def test_static_cache_refused_where_it_does_not_apply():
    t5, _ = tiny_family_pair("t5")
    with pytest.raises(DiscoError, match="encoder-decoder, whose cache stays dynamic"):
        TorchEngine.of(t5).set_cache("static")
    with pytest.raises(DiscoError, match="unknown --cache 'big'"):
        TorchEngine.of(t5).set_cache("big")
    with pytest.raises(DiscoError, match="--compile needs static caches"):
        TorchEngine.of(t5).set_compile(True)
    assert resolve_cache(t5, "auto") == "dynamic" == resolve_cache(tiny_family_pair("llama")[0], "auto")  # CPU


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_cache_that_cannot_be_cropped_falls_back_to_recompute(family, monkeypatch):
    target, draft = tiny_family_pair(family)
    config = DecodeConfig(max_new_tokens=16, max_window=5)
    refs = [target_generate(target, p, config).tokens for p in PROMPTS[:3]]

    def no_crop(self, n):
        raise NotImplementedError("this cache cannot be cropped")

    monkeypatch.setattr(tf.DynamicCache, "crop", no_crop)
    for prompt, ref in zip(PROMPTS[:3], refs):
        res = speculative_generate(target, draft, prompt, make_policy("constant", k=3), config)
        assert res.tokens == ref
        assert res.stats.recomputed_tokens > 0 and res.stats.to_dict()["cache_rollback"] == "recompute"
        assert "re-run" in res.stats.summary()


def test_sliding_window_cache_rolls_back_without_recompute():
    """Mistral with a 6-token window over 30+ tokens: its sliding-window cache layers are cropped
    too (they record the past, as in transformers' assisted generation), never re-run. (Where recording
    is broken, transformers 5.16 and 5.17, they do without it: past the window a rollback re-runs.)"""
    torch.manual_seed(0)
    config = tf.MistralConfig(**FAMILIES["llama"][2] | {"sliding_window": 6}, **_COMMON)
    target = tf.MistralForCausalLM(config).double().eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(20.0)
    draft = perturbed(target, 0.3)
    accepted = 0
    for prompt in PROMPTS[:4]:
        ref = target_generate(target, prompt, DecodeConfig(max_new_tokens=24)).tokens
        hf = target.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert ref == _generated(target, hf, len(prompt))
        res = speculative_generate(target, draft, prompt, make_policy("constant", k=4), DecodeConfig(24, 6))
        assert res.tokens == ref and (res.stats.recomputed_tokens == 0 or not past_recording_works())
        accepted += res.stats.accepted
    assert accepted > 0


def test_static_sliding_window_cache_stays_lossless(static_caches, static_rollback):
    """Mistral on static caches: within its window a sliding-window layer rolls back like any static layer (no
    token re-run); past it (a 6-token window) its oldest entries are gone, so no length move can put it back, and
    the kept tokens are re-run (transformers 5.24's own crop would move the counters anyway: wrong tokens)."""
    for window, rerun in ((64, False), (6, True)):
        torch.manual_seed(0)
        config = tf.MistralConfig(**FAMILIES["llama"][2] | {"sliding_window": window}, **_COMMON)
        target = tf.MistralForCausalLM(config).double().eval()
        with torch.no_grad():
            target.lm_head.weight.mul_(20.0)
        draft = perturbed(target, 0.3)
        refs = [target_generate(target, p, DecodeConfig(max_new_tokens=24)).tokens for p in PROMPTS[:3]]
        static_caches(target, draft)
        layer = TorchEngine.of(target).session(torch.tensor(PROMPTS[0]), capacity=30).cache.layers[0]
        assert isinstance(layer, tf.cache_utils.StaticSlidingWindowLayer)
        accepted = 0
        for prompt, ref in zip(PROMPTS[:3], refs):
            res = speculative_generate(target, draft, prompt, make_policy("constant", k=4), DecodeConfig(24, 6))
            assert res.tokens == ref, (window, prompt)
            assert (res.stats.recomputed_tokens > 0) == rerun
            accepted += res.stats.accepted
        assert accepted > 0


def test_mixed_pairs_are_refused():
    t5, _ = tiny_family_pair("t5")
    llama, _ = tiny_family_pair("llama")
    with pytest.raises(DiscoError, match="encoder-decoder .* decoder-only"):
        speculative_generate(t5, llama, PROMPTS[0], make_policy("constant", k=2), DecodeConfig(max_new_tokens=4))
    other = tiny_model("t5", seed=3)
    other.generation_config.decoder_start_token_id = 5
    with pytest.raises(DiscoError, match="start their decoders with different tokens"):
        speculative_generate(t5, other, PROMPTS[0], make_policy("constant", k=2), DecodeConfig(max_new_tokens=4))


# --- the collector and the round trip -------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_trace_equals_live_oracle_loop(family):
    target, draft = tiny_family_pair(family)
    pair = pair_from_models(target, draft, char_tokenizer(), family)
    classes = token_class_table(pair.tokenizer, VOCAB)
    drafted = 0
    for prompt, (max_new, window) in zip(PROMPTS[:4], [(20, 20), (16, 3), (20, 6), (7, 20)]):
        config = DecodeConfig(max_new_tokens=max_new, max_window=window)
        y = target_generate(target, prompt, config, pair.eos_token_ids).tokens
        policy = RecordingOracle(y, classes)
        live = speculative_generate(target, draft, prompt, policy, config, pair.eos_token_ids)
        assert live.tokens == y
        df = teacher_forced_trace(pair, prompt, y, config, classes, "p", "t").to_pandas()
        ours = df[df["oracle_drafted"]]
        rows = policy.rows
        assert ours["gen_pos"].tolist() == [r["gen_pos"] for r in rows]
        assert ours["draft_token"].tolist() == [r["draft_token"] for r in rows]
        assert live.stats.windows == ours.groupby("window_id").size().tolist()
        live_feats = np.stack([r["features"] for r in rows]) if rows else np.zeros((0, len(FEATURES)))
        np.testing.assert_allclose(ours[list(FEATURES)].to_numpy(np.float64), live_feats, rtol=1e-5, atol=1e-6)
        drafted += len(rows)
    assert drafted > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_collect_train_generate_round_trip(family, tmp_path):
    """disco collect -> disco train -> generate with the trained classifier: lossless, and drafting."""
    target, draft = tiny_family_pair(family)
    pair = pair_from_models(target, draft, char_tokenizer(), family)
    prompts = [Prompt(f"q{i}", "code", f"def f{i}(x): return x * {i} +") for i in range(12)]
    config = DecodeConfig(max_new_tokens=16, max_window=6)
    stats = collect(pair, prompts, tmp_path / "traces", config, progress=False)
    assert stats.prompts_traced == 12 and stats.manifest["status"]["complete"]
    report = train(
        TrainConfig(
            [tmp_path / "traces"], tmp_path / "clf", model="logistic", max_window=6, val_fraction=0.25, progress=False
        )
    )
    assert report.setting in RULE_GRIDS[report.choice.get("rule", "token")] or report.choice["policy"] == "threshold"
    spec = PolicySpec("classifier", classifier=str(tmp_path / "clf"))
    drafted = 0
    for i in range(4):
        prompt = f"print({i} + x) #"
        ref = generate(pair, prompt, PolicySpec("target"), config)
        res = generate(pair, prompt, spec, config)
        assert res.tokens == ref.tokens, (family, prompt)
        drafted += res.stats.drafted
    assert drafted > 0

    # the transformers drop-in: target.generate(custom_generate=...) with the trained classifier
    custom = disco_generate(draft, tmp_path / "clf", pair.tokenizer)
    ids = torch.tensor([pair.encode("x = y +")])
    if model_kind(target).encoder_decoder:
        with pytest.raises(DiscoError, match="decoder-only"):
            target.generate(ids, max_new_tokens=8, custom_generate=custom)
        return
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16, pad_token_id=0)
    ref = target.generate(ids, **kwargs)
    assert target.generate(ids, **kwargs, custom_generate=custom).tolist() == ref.tolist()
    assert custom.last_stats.drafted > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_compare_transformers_row_equals_target(family):
    target, draft = tiny_family_pair(family)
    pair = pair_from_models(target, draft, char_tokenizer(), family)
    for i in range(2):
        ids = pair.encode(f"def f{i}(x): return")
        ref = target_generate(target, ids, DecodeConfig(max_new_tokens=12), pair.eos_token_ids)
        assert (
            AssistedGeneration(pair).generate(ids, DecodeConfig(max_new_tokens=12), pair.eos_token_ids).tokens
            == ref.tokens
        )


@pytest.mark.parametrize("family", ["opt", "t5"])
def test_compare_policies_lossless(family, tmp_path):
    target, draft = tiny_family_pair(family)
    pair = pair_from_models(target, draft, char_tokenizer(), family)
    prompts = [Prompt(f"p{i}", "t", f"def f{i}(x): return") for i in range(2)]
    # transformers' own assisted generation is a separate row (torch_engine.AssistedGeneration)
    entries = default_entries(tuned_k=3, pair=pair, include_anchor=False)
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=12), tmp_path, progress=False, plots=False)
    assert all(s["lossless"] for s in result["summary"].values()), result["summary"]


# --- tokenizers -----------------------------------------------------------------------------------


def other_tokenizer():
    """A tokenizer with another vocabulary (as a Qwen draft's is to a Llama target's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + sorted(CHARS, reverse=True))}  # same tokens, other ids
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_different_tokenizers_are_refused(tmp_path):
    with pytest.raises(DiscoError, match="universal assisted generation"):
        check_same_tokenizer(char_tokenizer(), other_tokenizer(), "llama-target", "qwen-draft")
    # through load_pair: refused from the tokenizers, before any weights load
    llama = save_tiny(tiny_model("llama", dtype=torch.float32), char_tokenizer(), tmp_path / "llama")
    qwen = save_tiny(tiny_model("qwen2", dtype=torch.float32), other_tokenizer(), tmp_path / "qwen")
    with pytest.raises(DiscoError, match="do not share a tokenizer.*assistant_tokenizer"):
        load_pair(PairOptions(str(llama), str(qwen), device="cpu"))
    t5 = save_tiny(tiny_model("t5", dtype=torch.float32), char_tokenizer(), tmp_path / "t5")
    with pytest.raises(DiscoError, match="is an encoder-decoder but draft .* is decoder-only"):
        load_pair(PairOptions(str(t5), str(llama), device="cpu"))


# --- pair files and --pair ------------------------------------------------------------------------

PAIR_FILES = sorted((ROOT / "configs" / "pairs").glob("*.yaml"))


def test_pair_files_name_every_published_pair():
    pairs = {p.stem: load_pair_config(p) for p in PAIR_FILES}
    expected = {
        "opt": ("facebook/opt-6.7b", "facebook/opt-125m"),
        "codegen": ("Salesforce/codegen-6B-mono", "Salesforce/codegen-350M-mono"),
        "flan-t5": ("google/flan-t5-xl", "google/flan-t5-small"),
        "llama": ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B"),
        "pythia": ("EleutherAI/pythia-1.4b-deduped", "EleutherAI/pythia-160m-deduped"),
    }
    for name, (target, draft) in expected.items():
        assert (pairs[name]["target"], pairs[name]["draft"]) == (target, draft)
    families = {p["family"] for p in pairs.values()}
    assert {
        "OPTForCausalLM",
        "CodeGenForCausalLM",
        "T5ForConditionalGeneration",
        "LlamaForCausalLM",
        "GPTNeoXForCausalLM",
        "GPTBigCodeForCausalLM",
    } <= families
    for p in pairs.values():
        assert p["dtype"] in ("auto", "bfloat16", "float32") and isinstance(p["chat"], bool)


def test_pair_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    for text, message in [
        ("target: a\n", "draft: must name a model"),
        ("target: a\ndraft: b\ntagret: c\n", "unknown key"),
        ("target: a\ndraft: b\ndtype: fp8\n", "dtype 'fp8'"),
        ("- a\n", "YAML mapping"),
        ("target: a\ndraft: b\nchat: maybe\n", "chat must be true or false"),
    ]:
        bad.write_text(text)
        with pytest.raises(DiscoError, match=message):
            load_pair_config(bad)
    with pytest.raises(DiscoError, match="no pair file"):
        load_pair_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("family", ["t5", "gpt_bigcode"])
def test_cli_pair_option(family, tmp_path, capsys):
    target = tiny_model(family, dtype=torch.float32)
    tok = char_tokenizer()
    t = save_tiny(target, tok, tmp_path / "target")
    d = save_tiny(perturbed(target, DRAFT_NOISE.get(family, 0.3), by_name=True), tok, tmp_path / "draft")
    pair_file = tmp_path / "pair.yaml"
    pair_file.write_text(f"name: tiny-{family}\ntarget: {t}\ndraft: {d}\ndtype: float32\nchat: false\n")
    if family == "t5":  # T5 reads its Linear layers' weights, which the int8 CPU backend packs away
        code, _, err = cli(
            capsys, "generate", "--pair", pair_file, "--prompt", "x", "--device", "cpu", "--cpu-backend", "int8"
        )
        assert code == 2 and "int8 does not support encoder-decoder" in err
    outs = {}
    for policy in ("target", "constant", "threshold"):
        code, _, err = cli(
            capsys,
            "generate",
            "--pair",
            pair_file,
            "--prompt",
            "def f(x):",
            "--policy",
            policy,
            "--max-new-tokens",
            10,
            "--device",
            "cpu",
            "--json",
            tmp_path / f"{policy}.json",
        )
        assert code == 0, err
        data = json.loads((tmp_path / f"{policy}.json").read_text())
        assert data["pair"]["target"] == str(t) and data["pair"]["dtype"] == "float32"
        assert data["pair"]["cpu_backend"] == ("transposed" if family == "t5" else "onednn")
        outs[policy] = data["results"][0]["token_ids"]
    assert outs["constant"] == outs["target"] == outs["threshold"] and len(outs["target"]) == 10
    static = [
        "generate",
        "--pair",
        pair_file,
        "--prompt",
        "def f(x):",
        "--policy",
        "constant",
        "--max-new-tokens",
        10,
        "--device",
        "cpu",
        "--cache",
        "static",
        "--json",
        tmp_path / "static.json",
    ]
    code, _, err = cli(capsys, *static)
    if family == "t5":
        assert code == 2 and "encoder-decoder, whose cache stays dynamic" in err
    else:
        assert code == 0, err
        data = json.loads((tmp_path / "static.json").read_text())
        assert data["pair"]["engine"]["cache"] == "static" and data["results"][0]["token_ids"] == outs["target"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "task": "t", "prompt": f"x = {i} +"}) + "\n" for i in range(3))
    )
    code, _, err = cli(
        capsys,
        *cli_args("collect", pair=pair_file, prompts=prompts, out=tmp_path / "tr", max_new_tokens=8, device="cpu"),
    )
    assert code == 0, err
    manifest = json.loads((tmp_path / "tr" / "manifest.json").read_text())
    assert manifest["status"]["complete"] and manifest["pair"]["draft"] == str(d)
    # an explicit --draft wins over the file's
    code, _, err = cli(
        capsys, "generate", "--pair", pair_file, "--draft", tmp_path / "nope", "--prompt", "x", "--device", "cpu"
    )
    assert code == 2 and "nope" in err
