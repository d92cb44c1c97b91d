"""The llama.cpp engine on tiny GGUF files written in the test (tests/tiny_gguf.py): batched
forwards against one-token steps, rollback, every policy lossless against the engine's own
target-only decoding, collect -> train -> generate, compare's llama.cpp rows, and bad input."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import RecordingOracle, cli, collect_args
from tiny import char_tokenizer, save_tiny, tiny_pair
from tiny_gguf import write_tiny_gguf

from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.engines.llamacpp.llamacpp import LlamaCppEngine, requantized
from disco.engines.llamacpp.llamacpp_server import SERVER_LABEL, SERVER_TARGET_LABEL
from disco.formats.prompts import Prompt
from disco.jobs.compare import default_entries, run_compare
from disco.loop.decode import DecodeConfig, generate, speculative_generate, target_generate
from disco.loop.engine_registry import resolve_engine
from disco.loop.pair import load_pair
from disco.policies.policy_registry import PolicySpec

PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "Hello, world! The quick brown fox",
    "x = [1, 2, 3]\nfor i in x:",
    "class Point:\n    def __init__(self",
    "SELECT name FROM users WHERE",
    "# sort a list\ndef sort(xs):",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(target.gguf, draft.gguf, other-vocabulary.gguf, a transformers folder, cache root)."""
    root = tmp_path_factory.mktemp("gguf")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    t = write_tiny_gguf(target, tok, root / "target.gguf")
    d = write_tiny_gguf(draft, tok, root / "draft.gguf")
    other = write_tiny_gguf(draft, tok, root / "other.gguf", extra_tokens=["<think>"])
    folder = save_tiny(target, tok, root / "hf-target")
    return t, d, other, folder, root / "cache"


@pytest.fixture(scope="module")
def pair(files):
    t, d, *_, cache = files
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(cache))  # the GGUF tokenizers are cached there (llama-server is not)
        return load_pair(PairOptions(str(t), str(d), engine="llama.cpp", threads=1, verify="exact"))


def _ids(pair, text: str) -> list[int]:
    return pair.encode(text, chat=False)


# --- the batched draft (vLLM's side-engine proposer: one sequence per request) -----------------------------


def test_batched_draft_rows_equal_a_sessions_logits(pair):
    """Three sequences of different lengths fed together (a catch-up of unequal lengths, then one token each
    per call, one of them left out of a call, one rolled back and one removed and reused): each sequence's
    logits equal a one-sequence session's on the same tokens within 1e-4 of the logits' scale (the batch's
    width changes llama.cpp's rounding, not the numbers), with the same argmax; at 2 sequences per context a
    second context opens for the third."""
    draft = pair.draft
    texts = [PROMPTS[0], PROMPTS[1][:7], PROMPTS[2]]
    seqs = {f"r{i}": _ids(pair, t) for i, t in enumerate(texts)}
    # n_batch 8: a catch-up longer than that is fed in chunks (a prompt's prefill)
    batch = LlamaCppEngine(draft.path, 1, "fast", n_batch=8, repack=draft.repack_choice).batched_draft(2)

    def reference(tokens: list[int], hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        s = draft.session(torch.tensor(tokens), hidden=hidden)
        logits = s.forward(torch.tensor(tokens), 1)[0]
        return logits, (s.hidden()[-1] if hidden else None)

    def check(rows: dict, hidden: bool = False) -> None:
        for key, (logits, state) in rows.items():
            want, want_state = reference(seqs[key], hidden)
            scale = float(want.abs().max())
            assert (logits - want).abs().max() <= 1e-4 * scale, key
            assert int(logits.argmax()) == int(want.argmax())
            if hidden:
                assert state is not None and (state - want_state).abs().max() <= 1e-4 * float(want_state.abs().max())

    check(batch.feed(seqs))
    assert [batch.length(k) for k in seqs] == [len(v) for v in seqs.values()] and len(batch._contexts) == 2
    for step in range(3):
        fed = {k: [int(5 + step + i)] for i, k in enumerate(seqs) if not (step == 1 and k == "r1")}
        for k, t in fed.items():
            seqs[k] = seqs[k] + t
        check(batch.feed(fed, hidden=step == 2), hidden=step == 2)
    batch.truncate("r0", len(seqs["r0"]) - 2)  # a rejected window
    seqs["r0"] = seqs["r0"][:-2] + [9]
    batch.remove("r2")  # the request left: its sequence is free for the next
    seqs["r3"] = _ids(pair, PROMPTS[3])
    del seqs["r2"]
    check(batch.feed({"r0": [9], "r3": seqs["r3"]}))
    assert len(batch) == 3 and len(batch._contexts) == 2
    for k in list(seqs):
        batch.remove(k)
    assert len(batch) == 0 and batch.length("r0") == 0


# --- the engine itself ---------------------------------------------------------------------------


def test_pair_records_the_engine(pair):
    info = pair.describe()["engine"]
    assert info["name"] == "llama.cpp" and info["verify"] == "exact" and info["threads"] == 1
    assert "F32" in info["quantization"] and info["exact_width"] == pair.target.exact_width
    assert pair.vocab_size == 99 and pair.context_length == 256  # tiny_qwen: 99 tokens, 256 positions
    assert 1 in pair.eos_token_ids  # tests/tiny.py EOS


def test_exact_forward_is_bit_identical_to_one_token_steps(pair):
    engine = pair.target
    ids = torch.tensor(_ids(pair, PROMPTS[0] + PROMPTS[1]))
    n0 = 8
    steps = engine.session(ids[:n0])
    steps.prefill()
    ref = torch.cat([steps.forward(ids[i : i + 1], 1) for i in range(n0 - 1, len(ids))])
    width = engine.exact_width  # found by the probe; on this F32 model's kernels batches of 2 already differ
    assert 1 <= width <= 4
    for k in (2, 3, 4, 8, len(ids) - n0 + 1):
        s = engine.session(ids[:n0])
        s.prefill()
        rows = []
        for i in range(n0 - 1, len(ids), k):
            chunk = ids[i : i + k]
            rows.append(s.forward(chunk, len(chunk)))
        assert torch.equal(torch.cat(rows), ref), k  # bit for bit, whatever the window


def test_fast_forward_agrees_in_argmax(pair):
    engine = pair.target
    ids = torch.tensor(_ids(pair, PROMPTS[2] + PROMPTS[3]))
    s = engine.session(ids[:4])
    s.prefill()
    ref = torch.cat([s.forward(ids[i : i + 1], 1) for i in range(3, len(ids))])
    engine.verify = "fast"
    try:
        s = engine.session(ids[:4])
        s.prefill()
        batched = s.forward(ids[3:], len(ids) - 3)
    finally:
        engine.verify = "exact"
    assert torch.equal(batched.argmax(-1), ref.argmax(-1))
    assert (batched - ref).abs().max() < 1e-3


def test_rollback_keeps_exactly_the_committed_prefix(pair):
    engine = pair.target
    ids = torch.tensor(_ids(pair, PROMPTS[4]))
    s = engine.session(ids[:5])
    s.prefill()
    first = s.forward(ids[4:14], 10)
    s.truncate(9)  # keep 9 tokens: the last 5 computed ones are dropped
    assert s.length == 9 and torch.equal(s.unseen(ids[:14]), ids[9:14])
    again = s.forward(ids[9:14], 5)
    assert torch.equal(again, first[5:])
    s.truncate(20)  # nothing past the end to drop
    assert s.length == 14


def test_a_new_session_retires_the_old_one(pair):
    ids = torch.tensor(_ids(pair, PROMPTS[0]))
    old = pair.target.session(ids)
    pair.target.session(ids)
    with pytest.raises(DiscoError, match="replaced by a newer one"):
        old.forward(ids[:1], 1)


def test_exact_verification_is_exact_past_the_probed_window(tmp_path, monkeypatch):
    """Past the first 256 KV cells llama.cpp attends differently for one token (split across threads) than for
    a batch: exact verification there must still equal one-token steps bit for bit (EXACT_SPAN)."""
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    model = tiny_pair(noise=0.3, dtype=torch.float32)[0]
    model.config.max_position_embeddings = 1024  # a context long enough for llama.cpp's long-context kernels
    path = write_tiny_gguf(model, char_tokenizer(), tmp_path / "long.gguf")
    # Q4_0, as the embedded draft runs: batches of up to 4 are exact inside the probed window (F32 has width 1);
    # on the code before EXACT_SPAN 289 of these 421 rows differed and 2 argmaxes flipped
    engine = LlamaCppEngine(requantized(path, "q4_0", progress=False), threads=2, verify="exact")
    ids = torch.randint(3, engine.vocab_size, (720,), generator=torch.Generator().manual_seed(0))
    n0 = 300
    steps = engine.session(ids[:n0])
    steps.prefill()
    ref = torch.cat([steps.forward(ids[i : i + 1], 1) for i in range(n0 - 1, len(ids))])
    assert engine.exact_width > 1  # batches are exact inside the probed window, so the rule matters
    s = engine.session(ids[:n0])
    s.prefill()
    rows = [s.forward(ids[i : i + 5], len(ids[i : i + 5])) for i in range(n0 - 1, len(ids), 5)]
    assert torch.equal(torch.cat(rows), ref)


# --- weight repacking, probed in a child process ------------------------------------------------------

_CHILD_OK = [sys.executable, "-c", "print('finite')"]
_CHILD_SEGV = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
_CHILD_NAN = [sys.executable, "-c", "print('non-finite')"]
_CHILD_FAILS = [sys.executable, "-c", "raise SystemExit(3)"]


def test_the_repack_probe_follows_its_child(files, tmp_path, monkeypatch):
    from disco.engines.llamacpp.llamacpp_repack import choose, verdict_path

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    t = files[0]
    crashed = choose("auto", t, "build-a", _CHILD_SEGV, progress=False)
    assert not crashed.repack and "SIGSEGV" in crashed.reason
    assert verdict_path(t, "build-a").is_file()
    # cached: the same file, build and CPU are not probed again (a child that would succeed is not asked)
    assert choose("auto", t, "build-a", _CHILD_OK, progress=False) == crashed
    # another build is probed anew
    assert choose("auto", t, "build-b", _CHILD_OK, progress=False).repack
    assert not choose("auto", t, "build-c", _CHILD_NAN, progress=False).repack
    # a child that fails by itself is no verdict on repacking: off for now, asked again next time
    assert not choose("auto", t, "build-d", _CHILD_FAILS, progress=False).repack
    assert not verdict_path(t, "build-d").exists()
    assert choose("auto", t, "build-d", _CHILD_OK, progress=False).repack
    # off never probes; on insists, and is refused where the probe saw repacking fail
    assert choose("off", t, "build-e", _CHILD_SEGV, progress=False).reason == "repack off (asked)"
    assert not verdict_path(t, "build-e").exists()
    assert choose("on", t, "build-b", _CHILD_SEGV, progress=False).repack
    with pytest.raises(DiscoError, match=r"repack on refused for target.gguf: probe: llama.cpp died by SIGSEGV"):
        choose("on", t, "build-a", _CHILD_OK, progress=False)


def test_a_changed_file_is_probed_again(tmp_path, monkeypatch):
    from disco.engines.llamacpp.llamacpp_repack import choose

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"0" * 16)
    assert not choose("auto", f, "b", _CHILD_SEGV, progress=False).repack
    f.write_bytes(b"GGUF" + b"1" * 32)  # another file at the same path
    assert choose("auto", f, "b", _CHILD_OK, progress=False).repack


def test_the_engine_runs_without_repacking_where_the_probe_crashed(files, tmp_path, monkeypatch):
    import disco.engines.llamacpp.llamacpp as llamacpp

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    t, d = files[0], files[1]
    real = LlamaCppEngine(d, threads=1)  # the real child: repacking works with this build on this CPU
    assert real.repack and real.describe()["repack_reason"] == "auto: probe ok"
    monkeypatch.setattr(llamacpp, "probe_command", lambda path, threads: _CHILD_SEGV)
    engine = LlamaCppEngine(t, threads=1)
    info = engine.describe()
    assert not engine.repack and info["repack"] is False and "SIGSEGV" in info["repack_reason"]
    assert info["build"] and not engine.spare().repack  # a spare context makes the same choice, unprobed
    with pytest.raises(DiscoError, match="repack on refused"):
        LlamaCppEngine(t, threads=1, repack="on")


def test_repack_on_refused_by_the_cli_in_one_line(files, tmp_path, capsys, monkeypatch):
    import disco.engines.llamacpp.llamacpp as llamacpp

    t, d, *_, cache = files
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llamacpp, "probe_command", lambda path, threads: _CHILD_SEGV)
    args = ["generate", "--target", str(t), "--draft", str(d), "--engine", "llama.cpp", "--prompt", "x = 1"]
    rc, _, err = cli(capsys, *args, "--repack", "on", "--max-new-tokens", "4", "--policy", "constant")
    lines = err.strip().splitlines()
    assert rc != 0 and lines[-1].startswith("error: repack on refused") and "repack auto or off" in lines[-1]
    assert "Traceback" not in err
    rc, _, err = cli(capsys, *args, "--repack", "auto", "--max-new-tokens", "4", "--policy", "constant")
    assert rc == 0, err


# --- the loop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("verify", ["exact", "fast"])
def test_every_policy_is_lossless_against_llamacpp_target_only(pair, verify):
    specs = [
        PolicySpec("constant", k=1),
        PolicySpec("constant", k=4),
        PolicySpec("heuristic"),
        PolicySpec("threshold", threshold=0.4),
        PolicySpec("threshold", threshold=0.9, adaptive=True),
        PolicySpec("oracle"),
    ]
    for engine in (pair.target, pair.draft):
        engine.verify = verify
    try:
        for text in PROMPTS:
            for n in (1, 7, 30):
                config = DecodeConfig(max_new_tokens=n)
                ref = target_generate(pair.target, _ids(pair, text), config, pair.eos_token_ids)
                for spec in specs:
                    res = generate(pair, text, spec, config, chat=False, target_tokens=ref.tokens)
                    assert res.tokens == ref.tokens, (verify, text, n, spec)
                    assert res.stats.target_forwards <= ref.stats.target_forwards
    finally:
        for engine in (pair.target, pair.draft):
            engine.verify = "exact"


def test_speculation_saves_target_calls(pair):
    from disco.policies.policy import ConstantPolicy

    ids = _ids(pair, PROMPTS[0])
    res = speculative_generate(
        pair.target, pair.draft, ids, ConstantPolicy(4), DecodeConfig(max_new_tokens=40), pair.eos_token_ids
    )
    assert res.stats.accepted > 0 and res.stats.target_forwards < res.stats.new_tokens


# --- the commands --------------------------------------------------------------------------------


def test_collect_train_generate_on_llamacpp(files, tmp_path, capsys, monkeypatch):
    t, d, _, folder, cache = files
    monkeypatch.setenv("DISCO_CACHE", str(cache))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "task": ("code", "text")[i % 2], "prompt": p + str(i)}) + "\n"
            for i, p in enumerate(PROMPTS * 3)
        )
    )
    pair_args = ["--target", t, "--draft", d, "--threads", 1, "--no-chat"]
    code, out, err = cli(
        capsys, *collect_args(t, d, prompts, tmp_path / "traces", "--threads", 1, "--no-chat", max_new_tokens=24)
    )
    assert code == 0, err
    manifest = json.loads((tmp_path / "traces" / "manifest.json").read_text())
    assert manifest["pair"]["engine"]["name"] == "llama.cpp" and manifest["status"]["complete"]
    assert manifest["versions"]["llama-cpp-python"]

    code, out, err = cli(
        capsys,
        "profile",
        "--out",
        tmp_path / "profile.json",
        "--context",
        16,
        "--repeats",
        2,
        "--warmup",
        1,
        *pair_args[:-1],
    )
    assert code == 0, err
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["pair"]["engine"]["name"] == "llama.cpp" and len(profile["c_t"]) == 21

    code, out, err = cli(
        capsys,
        "train",
        "--traces",
        tmp_path / "traces",
        "--out",
        tmp_path / "clf",
        "--profile",
        tmp_path / "profile.json",
        "--model",
        "logistic",
    )
    assert code == 0, err
    artifact = json.loads((tmp_path / "clf" / "manifest.json").read_text())
    assert artifact["pair"]["engine"]["name"] == "llama.cpp"

    outs = {}
    for policy in ("target", "classifier"):
        code, out, err = cli(
            capsys,
            "generate",
            "--prompts",
            prompts,
            "--limit",
            4,
            "--policy",
            policy,
            "--classifier",
            tmp_path / "clf",
            "--max-new-tokens",
            20,
            "--json",
            tmp_path / f"{policy}.json",
            *pair_args,
        )
        assert code == 0, err
        assert "warning" not in err  # trained and run on the same engine
        outs[policy] = [r["token_ids"] for r in json.loads((tmp_path / f"{policy}.json").read_text())["results"]]
    assert outs["classifier"] == outs["target"]

    # the same artifact on the torch engine (transformers reads the same GGUF files): a warning, not a refusal
    code, out, err = cli(
        capsys,
        "generate",
        "--prompt",
        PROMPTS[0],
        "--policy",
        "classifier",
        "--classifier",
        tmp_path / "clf",
        "--max-new-tokens",
        8,
        "--target",
        t,
        "--draft",
        d,
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--no-chat",
    )
    assert code == 0, err
    assert "warning:" in err and "trained on llama.cpp" in err and "runs on torch" in err


def test_compare_has_the_llamacpp_rows(pair, tmp_path):
    prompts = [Prompt(f"p{i}", "code", p) for i, p in enumerate(PROMPTS[:3])]
    entries = default_entries(
        tuned_threshold=0.5, pair=pair, anchor_settings={"server_tuned": {"n_max": 4, "p_min": 0.5}}
    )
    labels = [e.label for e in entries]
    assert SERVER_TARGET_LABEL in labels and "threshold 0.50 (tuned) (fast verify)" in labels
    assert sum(label.startswith(SERVER_LABEL) for label in labels) == 2
    result = run_compare(
        pair, prompts, entries, DecodeConfig(max_new_tokens=16), tmp_path, chat=False, progress=False, plots=True
    )
    summary = result["summary"]
    for label in labels:
        assert summary[label]["tokens_per_s"] > 0
    assert summary[SERVER_TARGET_LABEL]["lossless"]  # llama-server's own one-token decoding: the same kernels
    assert summary["threshold 0.50 (tuned)"]["lossless"] and summary["oracle"]["lossless"]
    tuned = next(label for label in labels if "tuned: n-max 4" in label)
    assert summary[tuned]["target_forwards_per_token"] is None  # the server does not expose its forward calls
    assert set(result["anchors"]) == {label for label in labels if label.startswith("llama-server")}
    assert (tmp_path / "table.md").read_text().count("llama-server") == 3


# --- choosing the engine, and bad input ----------------------------------------------------------


def test_auto_takes_llamacpp_for_gguf_on_the_cpu():
    assert resolve_engine("auto", None, None, "cpu") == "llama.cpp"  # the embedded pair
    assert resolve_engine("auto", "a.gguf", "b.gguf", "cpu") == "llama.cpp"
    assert resolve_engine("auto", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-0.5B", "cpu") == "torch"
    assert resolve_engine("auto", "a.gguf", "b.gguf", "cuda") == "torch"
    assert resolve_engine("torch", "a.gguf", "b.gguf", "cpu") == "torch"
    with pytest.raises(DiscoError, match="runs on the CPU"):
        resolve_engine("llama.cpp", None, None, "cuda")
    with pytest.raises(DiscoError, match="unknown engine"):
        resolve_engine("sglang", None, None, "cpu")


def test_bad_input_gets_one_line_errors(files, tmp_path, capsys, monkeypatch):
    t, d, other, folder, cache = files
    monkeypatch.setenv("DISCO_CACHE", str(cache))
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 definitely not a GGUF")
    cases = [
        (["--target", not_gguf, "--draft", d], "is not a GGUF file"),
        (["--target", folder / "config.json", "--draft", d, "--engine", "llama.cpp"], "is not a GGUF file"),
        (["--target", t, "--draft", other], "do not share a tokenizer"),
        (["--target", t, "--draft", d, "--max-new-tokens", 300], "exceeds the models' context of 256"),
        (["--target", t, "--draft", d, "--verify", "sometimes"], "unknown verification mode"),
        (["--target", t, "--draft", d, "--draft-quant", "q3"], "unknown --draft-quant"),
    ]
    for args, message in cases:
        code, out, err = cli(capsys, "generate", "--prompt", "hello", "--no-chat", "--threads", 1, *args)
        assert code == 2, (args, err)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err


def test_a_missing_llamacpp_says_how_to_install_and_torch_still_works(files, monkeypatch):
    t, d, _, folder, cache = files
    monkeypatch.setenv("DISCO_CACHE", str(cache))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    with pytest.raises(DiscoError, match=r"pip install 'disco-spec\[llamacpp\]'. \(llama-cpp-python 0\.3\.36"):
        load_pair(PairOptions(str(t), str(d), engine="llama.cpp"))
    with pytest.raises(DiscoError, match="--engine torch"):
        LlamaCppEngine(t)
    torch_pair = load_pair(PairOptions(str(folder), str(folder), device="cpu", engine="auto"))
    assert torch_pair.engine_name == "torch"
    assert target_generate(torch_pair.target, [5, 6, 7], DecodeConfig(max_new_tokens=3)).stats.new_tokens == 3


def test_hidden_states_match_the_torch_engine(files, pair):
    """Both engines give the last layer's states (after the final norm) of the kept positions: the
    input SpecDec++-style policies read. The tiny GGUF holds the same weights as the torch model."""
    from transformers import AutoModelForCausalLM

    from disco.loop.engine_registry import as_engine

    t = files[0]
    model = AutoModelForCausalLM.from_pretrained(str(t.parent), gguf_file=t.name, dtype=torch.float32).eval()
    ids = torch.tensor(_ids(pair, PROMPTS[3]))
    states = []
    for engine in (pair.target, as_engine(model)):
        s = engine.session(ids[:6], hidden=True)
        s.prefill()
        logits = s.forward(ids[5:12], 4)
        h = s.hidden()
        assert h is not None and h.shape == (4, 32) and logits.shape[0] == 4
        states.append(h.float())
    assert (states[0] - states[1]).abs().max() < 2e-2 * states[1].abs().max()
    plain = pair.target.session(ids[:6])
    plain.prefill()
    plain.forward(ids[5:12], 4)
    assert plain.hidden() is None  # only on request: it costs an extra output


def test_trace_hidden_states_and_signals_equal_the_live_loop_on_llamacpp(pair):
    """On llama.cpp too, the collector's teacher-forced draft pass gives the hidden states the live loop
    hands a policy (DraftStep.hidden), and the trace's window features (target-side signals included)
    equal what the policy computes live, at every position the oracle drafts."""
    import numpy as np

    from disco.core.features import FEATURES
    from disco.formats.trace import HIDDEN_COLUMN
    from disco.jobs.collect import teacher_forced_trace

    classes = pair.token_classes()
    config = DecodeConfig(max_new_tokens=24, max_window=6)
    checked = 0
    for text in PROMPTS:
        ids = _ids(pair, text)
        y = target_generate(pair.target, ids, config, pair.eos_token_ids).tokens
        policy = RecordingOracle(y, classes)
        live = speculative_generate(pair.target, pair.draft, ids, policy, config, pair.eos_token_ids)
        assert live.tokens == y
        df = teacher_forced_trace(pair, ids, y, config, classes, "p", "t").to_pandas()
        ours = df[df["oracle_drafted"]]
        assert ours["gen_pos"].tolist() == [r["gen_pos"] for r in policy.rows]
        if not policy.rows:
            continue
        np.testing.assert_allclose(
            ours[list(FEATURES)].to_numpy(np.float64),
            np.stack([r["features"] for r in policy.rows]),
            rtol=1e-4,
            atol=1e-5,
        )
        stored = np.stack([np.frombuffer(b, np.float16) for b in ours[HIDDEN_COLUMN]]).astype(np.float32)
        live_h = np.stack([r["hidden"] for r in policy.rows])
        np.testing.assert_allclose(stored, live_h, rtol=2e-3, atol=2e-3 * np.abs(live_h).max())
        checked += len(policy.rows)
    assert checked > 0


def test_compare_sampled_on_llamacpp_with_server_rows(pair, tmp_path):
    """Sampling on llama.cpp: disco's rows and llama-server's, seeded, with target log-probs."""
    from disco.engines.llamacpp.llamacpp_server import GREEDY_FIELDS, sampler_fields

    fields = sampler_fields(0.7, 0.95, 3)
    assert fields["samplers"] == ["temperature", "top_p"] and fields["top_k"] == 0 and fields["seed"] == 3
    assert sampler_fields(0.0, 0.95, 3) == GREEDY_FIELDS
    prompts = [Prompt("p0", "code", PROMPTS[0])]
    entries = [
        e
        for e in default_entries(tuned_threshold=0.5, pair=pair, sampling=True)
        if e.label in ("threshold 0.4", SERVER_TARGET_LABEL) or e.label.startswith(SERVER_LABEL + " (defaults")
    ]
    assert len(entries) == 3
    config = DecodeConfig(max_new_tokens=12, temperature=0.7, top_p=0.95)
    result = run_compare(pair, prompts, entries, config, tmp_path, chat=False, progress=False, plots=False, seeds=2)
    for label, s in result["summary"].items():
        assert s["tokens_per_s"] > 0 and s["target_logprob"] < 0 and len(s["speedup_by_seed"]) == 2, label
