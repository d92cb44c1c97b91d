"""`disco generate` end to end on tiny model folders, and its one-line errors."""

import json
import subprocess
import sys

import pytest
from helpers import cli
from tiny import char_tokenizer

CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def test_generate_writes_json_identical_to_target(folders, tmp_path, capsys):
    t, d, _ = folders
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "task": "t", "prompt": f"def f{i}(x):"}) + "\n" for i in range(3))
    )
    outs = {}
    for policy in ("target", "constant", "heuristic", "threshold", "oracle"):
        code, stdout, err = cli(
            capsys,
            "generate",
            "--target",
            t,
            "--draft",
            d,
            "--prompts",
            prompts,
            "--policy",
            policy,
            "--max-new-tokens",
            12,
            "--device",
            "cpu",
            "--json",
            tmp_path / f"{policy}.json",
        )
        assert code == 0, err
        assert f"[{policy}]" in err and "tok/s" in err
        data = json.loads((tmp_path / f"{policy}.json").read_text())
        outs[policy] = [r["token_ids"] for r in data["results"]]
        assert [r["id"] for r in data["results"]] == ["p0", "p1", "p2"]
        assert all(len(ids) == 12 for ids in outs[policy])
    assert all(v == outs["target"] for v in outs.values())


def test_single_prompt_is_tokenized_as_the_tokenizer_does(folders, tmp_path, capsys):
    t, d, _ = folders
    code, _, err = cli(
        capsys,
        "generate",
        "--target",
        t,
        "--draft",
        d,
        "--prompt",
        "hello",
        "--policy",
        "constant",
        "--max-new-tokens",
        5,
        "--json",
        tmp_path / "o.json",
    )
    assert code == 0, err
    from transformers import AutoModelForCausalLM

    from disco.loop.decode import DecodeConfig, target_generate

    model = AutoModelForCausalLM.from_pretrained(t)
    ref = target_generate(model, char_tokenizer()("hello")["input_ids"], DecodeConfig(max_new_tokens=5)).tokens
    assert json.loads((tmp_path / "o.json").read_text())["results"][0]["token_ids"] == ref


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "/no/such/model", "--draft", "/no/such/draft"], "no such model folder"),
        (["--policy", "constant", "--k", "0"], "--k must be at least 1"),
        (["--threshold", "1.5"], "--threshold must be within [0, 1]"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
        (["--policy", "sometimes"], "unknown policy 'sometimes'"),
        (["--prompt", "   "], "the prompt is empty"),
        (["--prompt", "x" * 300], "exceeds the models' context of 256 tokens"),
        (["--prompts", "/no/such.jsonl"], "prompt file not found"),
    ],
)
def test_bad_input_is_one_line_exit_2(folders, capsys, args, message):
    t, d, _ = folders
    base = ["generate", "--target", t, "--draft", d, "--max-new-tokens", 4]
    if not any(a in ("--prompt", "--prompts") for a in args):
        base += ["--prompt", "hi"]
    code, _, err = cli(capsys, *base, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: ")


def test_mismatched_tokenizers_are_refused(folders, capsys):
    t, _, o = folders
    code, _, err = cli(capsys, "generate", "--target", t, "--draft", o, "--prompt", "hi")
    assert code == 2
    assert "do not share a tokenizer" in err and "universal assisted generation" in err


def test_bad_prompt_files(tmp_path, folders, capsys):
    t, d, _ = folders
    cases = {"notjson.jsonl": "{nope\n", "nofield.jsonl": '{"id": "a"}\n', "empty.jsonl": "\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        code, _, err = cli(capsys, "generate", "--target", t, "--draft", d, "--prompts", tmp_path / name)
        assert code == 2 and "Traceback" not in err, err
    assert not list(tmp_path.glob("*.json"))


def test_installed_command_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, "cli.py", "generate", "--prompt", "hi", "--policy", "nope"],
        capture_output=True,
        text=True,
        cwd=__file__.rsplit("/tests/", 1)[0],
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "error: unknown policy 'nope': choose one of target, constant, heuristic, threshold, adaedl, svip, oracle, "
        "classifier, adaptive-verification, learned-budget"
    )


def test_compare_refuses_an_unknown_proposer_before_loading(capsys):
    code, _, err = cli(capsys, "compare", "--prompts", "code-test", "--engine", "vllm", "--proposers", "draft,gpu")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: --proposers 'draft,gpu': choose among draft, side, comma-separated (e.g. draft)"
    ]


@pytest.mark.parametrize(
    "schedule",
    ["[[1,3,3],[3,256,2]]", "[[2,8,3]]", "[[1,4,0]]", "[[1,4,3],[5,8,-1]]", "[[1,4]]", "3", "[[1,4,2.5]]", "[]"],
)
def test_compare_refuses_a_bad_dynamic_schedule_before_loading(capsys, schedule):
    code, _, err = cli(capsys, "compare", "--prompts", "code-test", "--engine", "vllm", "--dynamic-schedule", schedule)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --dynamic-schedule {schedule!r}")
    assert "[[first, last batch size, k], ...]" in lines[0]


def test_compare_refuses_concurrency_on_an_engine_that_decodes_one_at_a_time(folders, tmp_path, capsys):
    """--concurrency sizes groups of requests decoded together: disco's loop (torch, llama.cpp) decodes one at a
    time, so a level other than its default or 1 is refused in one line before anything loads or is written."""
    t, d, _ = folders
    out = tmp_path / "o"
    base = ["compare", "--target", t, "--draft", d, "--engine", "torch", "--prompts", "code-test", "--out", out]
    code, stdout, err = cli(capsys, *base, "--concurrency", "8")
    assert code == 2 and "Traceback" not in err and "loading the pair" not in err and not stdout
    assert err.strip().splitlines() == [
        "error: --concurrency 8 applies to the vllm engine only, and this run uses torch: drop --concurrency, "
        "or add --engine vllm"
    ]
    assert not out.exists() and not list(tmp_path.iterdir())
    code, _, err = cli(capsys, *base, "--concurrency", "1,x")  # a mistyped list: on every engine, before loading
    assert code == 2 and err.strip().splitlines() == [
        "error: --concurrency '1,x': give positive whole numbers, comma-separated (e.g. 1,8)"
    ]


def test_batching_options_apply_to_the_engine_that_batches():
    """compare's default --concurrency (vLLM's levels) and 1 run on every engine; --max-batch (collect's, profile's)
    other than its default only on vLLM."""
    from disco.base.defaults import DEFAULT_CONCURRENCY
    from disco.base.errors import DiscoError
    from disco.cli.checks import check_batching

    for engine in ("torch", "llama.cpp", "vllm"):
        for levels in (DEFAULT_CONCURRENCY, "1"):
            check_batching("compare", {"concurrency": levels}, engine)
    check_batching("compare", {"concurrency": "1,2,4,8"}, "vllm")
    check_batching("profile", {"max_batch": 16}, "vllm")
    for command, option, line in [
        ("compare", {"concurrency": "2,8"}, "--concurrency 2,8 applies to the vllm engine only"),
        ("profile", {"max_batch": 16}, "--max-batch 16 applies to the vllm engine only"),
        ("collect", {"max_batch": 4}, "--max-batch 4 applies to the vllm engine only"),
    ]:
        with pytest.raises(DiscoError, match=line):
            check_batching(command, option, "llama.cpp")
