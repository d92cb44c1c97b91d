"""llama-server -md tuning's record (disco.jobs.server_tuning): the file it writes beside an artifact is the one
compare and demo read, the fastest setting wins, the prompts are the artifact's validation prompts. The
measurement itself needs llama-server and the embedded pair (bench/tune_llama_server.py)."""

from __future__ import annotations

import json
from pathlib import Path

from disco.base.files import atomic_write_json
from disco.formats.prompts import Prompt
from disco.jobs.server_tuning import TUNED_FILE, tuned_server, tuning_record, validation_prompts

ROOT = Path(__file__).resolve().parents[1]


def test_the_fastest_setting_is_recorded_and_read_back(tmp_path):
    grid = [
        {"n_max": 4, "p_min": 0.5, "tok_s": 10.0},
        {"n_max": 16, "p_min": 0.7, "tok_s": 12.5},
        {"n_max": 8, "p_min": 0.9, "tok_s": 11.0},
    ]
    record = tuning_record(grid, [Prompt("code-004", "code", "x")], 128, {"name": "llama.cpp"})
    assert (record["n_max"], record["p_min"], record["prompts"], record["grid"]) == (16, 0.7, ["code-004"], grid)
    assert tuned_server(tmp_path) is None  # nothing tuned beside this artifact
    atomic_write_json(tmp_path / TUNED_FILE, record)
    assert tuned_server(tmp_path) == {"n_max": 16, "p_min": 0.7}


def test_the_shipped_record_still_reads():
    assert tuned_server(ROOT / "models/embedded-qwen2.5-coder-llamacpp") == {"n_max": 16, "p_min": 0.7}


def test_validation_prompts_are_the_artifacts_up_to_per_task(tmp_path):
    val = ["code-004", "code-007", "code-012", "explain-001", "write-009", "nowhere-001"]
    (tmp_path / "manifest.json").write_text(json.dumps({"training": {"val_prompt_ids": val}}))
    picked = validation_prompts(tmp_path, per_task=2)
    assert [p.id for p in picked] == ["code-004", "code-007", "explain-001", "write-009"]
    assert all(p.prompt for p in picked)
