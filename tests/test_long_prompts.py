"""data/long-prompts.jsonl (bench/long_prompts.py): long "explain this module" prompts for issue 30's
exactness check on long contexts, loaded through disco's own prompt loader."""

import json

from disco.formats.prompts import DATA_DIR, load_prompt_source, load_prompt_sources

LONG = DATA_DIR / "long-prompts.jsonl"


def test_long_prompts_load_and_are_long() -> None:
    prompts = load_prompt_source("long-prompts")  # the shipped set, by name
    assert len(prompts) >= 8 and len({p.id for p in prompts}) == len(prompts)
    assert {p.task for p in prompts} == {"explain"}
    for p in prompts:
        assert isinstance(p.prompt, str) and p.prompt.startswith("Explain what this Python module does")
        assert "```python\n" in p.prompt and p.prompt.endswith("\n```")
        # 1,000-3,000 tokens (bench/long_prompts.py checks by the tokenizer): ~3-5 characters a token here
        assert 3_000 < len(p.prompt) < 15_000, (p.id, len(p.prompt))
    assert LONG.stat().st_size < 200_000
    # the same three fields as the other shipped sets, and ids no other shipped set uses
    assert all(set(json.loads(line)) == {"id", "task", "prompt"} for line in LONG.read_text().splitlines())
    others = sorted(p.stem for p in DATA_DIR.glob("*.jsonl") if p != LONG)
    assert len(load_prompt_sources(["long-prompts", *others])) == len(prompts) + len(load_prompt_sources(others))
