"""What `disco generate`, `compare`, `collect` and `profile` do once their options are parsed and checked.

disco.cli.cli parses a command's options, refuses what disco.cli.checks refuses, and calls the function of the same name
here: load the prompts and the pair, run the stage (decoding through the pair's runner, disco.jobs.runner), print
what it found and write its files. Stdout gets the results (text, tables), stderr the progress lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from disco.base.defaults import DEFAULT_VLLM_PROPOSERS
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.cli.checks import int_list

if TYPE_CHECKING:
    from disco.loop.decode import DecodeConfig
    from disco.policies.policy_registry import PolicySpec


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def generate(
    prompt: Optional[str],
    prompts: Optional[str],
    spec: PolicySpec,
    config: DecodeConfig,
    chat: Optional[bool],
    limit: Optional[int],
    json_out: Optional[Path],
    options: PairOptions,
    closed_loop: bool = False,
) -> None:
    """`disco generate`: one prompt or a prompt set under one policy; text on stdout, stats on stderr."""
    from disco.base.files import atomic_write_json, write_or_rescue
    from disco.formats.prompts import Prompt, load_prompt_sources
    from disco.loop.pair import apply_pair_file, load_pair

    if (prompt is None) == (prompts is None):
        raise DiscoError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    config.validate()
    items = [Prompt("prompt", "default", prompt)] if prompt is not None else load_prompt_sources([prompts], limit)
    options, chat = apply_pair_file(options, chat)
    _say("loading the pair …")
    pair = load_pair(options)
    from disco.jobs.answers import answer_first_turns
    from disco.jobs.runner import runner_for

    items = answer_first_turns(pair, items, config.max_new_tokens, chat)  # mt-bench-2: the first turns' answers
    compile_s = pair.warm_up(max(len(pair.encode(i.prompt, chat)) for i in items) + config.max_new_tokens)
    if compile_s:
        _say(f"compiled the captured steps in {compile_s:.1f}s (once; not in the timings below)")
    records = []
    # as the engine decodes a prompt set: disco's loop one at a time, vLLM all together (its proposer inside)
    runner = runner_for(pair, closed_loop=closed_loop)  # closed loop: the prompt set is one stream
    decoded = runner.decode([pair.encode(i.prompt, chat) for i in items], spec, config)
    for item, res in zip(items, decoded):
        text = pair.decode(res.tokens)
        typer.echo(text if len(items) == 1 else f"--- {item.id}\n{text}")
        _say(f"[{spec.name}] {res.stats.summary()}")
        if spec.name == "classifier" and res.stats.draft_forwards == 0 and res.stats.new_tokens > 1:
            _say(
                "[classifier] drafted nothing: the artifact's cost rule found that no draft window pays under the "
                "cost model it was trained with (its metrics.md); on other hardware, `disco profile` and retrain"
            )
        records.append(
            {
                "id": item.id,
                "task": item.task,
                "policy": spec.name,
                "text": text,
                "token_ids": res.tokens,
                "stats": res.stats.to_dict(),
            }
        )
    if json_out is not None:
        result = {"pair": pair.describe(), "config": config.__dict__, "results": records}
        write_or_rescue(json_out, lambda path: atomic_write_json(path, result), "results file")
        _say(f"wrote {json_out}")


def compare(
    prompts: list[str],
    out: Path,
    classifier: Optional[list[str]],
    tuned_k: Optional[int],
    tuned_threshold: Optional[float],
    anchor: bool,
    server_p_min: Optional[float],
    server_n_max: Optional[int],
    policies: Optional[str],
    limit: Optional[int],
    config: DecodeConfig,
    seeds: int,
    chat: Optional[bool],
    concurrency: str,
    fixed_k: str,
    dynamic_schedule: Optional[str],
    load_profile: Optional[list[Path]],
    proposers: str,
    options: PairOptions,
    closed_loop: bool = False,
) -> None:
    """`disco compare`: every row on the same prompts; the tables on stdout, compare.json and plots under `out`."""
    from disco.core.load_profiles import LoadProfiles
    from disco.formats.prompts import load_prompt_sources
    from disco.jobs.compare import check_seeds, default_entries, report, run_compare, select_entries, written
    from disco.loop.pair import apply_pair_file, load_pair

    config.validate()
    chosen = _proposers(proposers)  # before the pair loads: a typo fails at once
    schedule = _schedule(dynamic_schedule) if dynamic_schedule is not None else None
    check_seeds(seeds, config.temperature)
    select_entries([], policies)  # a mistyped name fails before the models load
    items = load_prompt_sources(prompts, limit)
    load = LoadProfiles(load_profile) if load_profile else None  # (a missing file fails before the pair loads)
    tuned: dict = {}
    classifiers = classifier or []
    first = classifiers[0] if classifiers else None
    if first is not None:  # tuned baselines from the artifact unless given
        from disco.jobs.compare import tuned_from_artifact

        tuned = tuned_from_artifact(first)
        tuned_k = tuned.get("k") if tuned_k is None else tuned_k
        tuned_threshold = tuned.get("threshold") if tuned_threshold is None else tuned_threshold
    options, chat = apply_pair_file(options, chat)
    _say("loading the pair …")
    pair = load_pair(options)
    server_tuned = {k: v for k, v in (("p_min", server_p_min), ("n_max", server_n_max)) if v is not None}
    if first is not None and not server_tuned:  # tuned beside the artifact (disco.jobs.server_tuning)
        from disco.jobs.server_tuning import tuned_server

        server_tuned = tuned_server(first) or {}
    entries = default_entries(
        first,
        tuned_k,
        tuned_threshold,
        pair=pair,
        include_anchor=anchor,
        anchor_settings={"server_tuned": server_tuned},
        tuned=tuned,
        sampling=config.temperature > 0,
        more_classifiers=classifiers[1:],
    )
    entries = select_entries(entries, policies)
    levels, lengths = int_list(concurrency, "--concurrency"), int_list(fixed_k, "--fixed-k")
    # vLLM's own rows' settings (and the closed loop's, below)
    settings: dict[str, Any] = {"fixed_k": [(k, "") for k in lengths], "proposers": chosen, "schedule": schedule}
    if closed_loop:  # disco's loop: each policy row's twin under the closed loop (runner.LoopRunner.rows)
        from disco.jobs.runner import check_closed_loop

        check_closed_loop(pair)
        settings["closed_loop"] = True
    result = run_compare(
        pair, items, entries, config, out, chat, seeds=seeds, concurrency=levels, settings=settings, load=load
    )
    typer.echo(report(result))
    _say(written(out, result))


def _proposers(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = sorted(set(names) - set(DEFAULT_VLLM_PROPOSERS))
    if unknown or not names:
        raise DiscoError(
            f"--proposers {text!r}: choose among {', '.join(DEFAULT_VLLM_PROPOSERS)}, comma-separated (e.g. draft)"
        )
    return names


def _schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """--dynamic-schedule: vLLM's num_speculative_tokens_per_batch_size, [[first, last batch size, k], ...], checked
    as vLLM checks it (v1/spec_decode/dynamic/utils.py), here: vLLM would refuse it only after the pair loads."""
    hint = (
        "give [[first, last batch size, k], ...] in JSON, batch sizes from 1 in order, k >= 0 and one k >= 1, "
        "e.g. '[[1,3,3],[4,256,2]]'"
    )
    try:
        rows = json.loads(text)
        schedule = tuple((int(a), int(b), int(k)) for a, b, k in rows)
        if any(isinstance(v, bool) or int(v) != v for r in rows for v in r):
            raise ValueError
    except (ValueError, TypeError):
        raise DiscoError(f"--dynamic-schedule {text!r} is not a schedule: {hint}") from None
    ends = [0] + [b for _, b, _ in schedule[:-1]]
    bad = any(a <= end or b < a or k < 0 for (a, b, k), end in zip(schedule, ends))
    if not schedule or schedule[0][0] != 1 or bad or max(k for _, _, k in schedule) < 1:
        raise DiscoError(f"--dynamic-schedule {text!r}: {hint}")
    return schedule


def collect(
    prompts: list[str],
    out: Path,
    config: DecodeConfig,
    limit: Optional[int],
    overwrite: bool,
    chat: Optional[bool],
    shard_prompts: int,
    max_batch: int,
    options: PairOptions,
) -> None:
    """`disco collect`: this process's share of the prompts traced into `out` (resumable); its summary."""
    from disco.formats.prompts import load_prompt_sources
    from disco.formats.trace import format_summary
    from disco.jobs.collect import collect as run_collect
    from disco.jobs.launch import distributed
    from disco.loop.pair import apply_pair_file, load_pair

    config.validate()
    items = load_prompt_sources(prompts, limit)
    options, chat = apply_pair_file(options, chat)
    with distributed() as dist:
        if dist.rank == 0:
            _say(f"loading the pair … ({len(items)} prompts, {dist.world} process{'es' * (dist.world > 1)})")
        pair = dist.main_first(lambda: load_pair(options))
        stats = run_collect(
            pair,
            items,
            out,
            config,
            chat=chat,
            overwrite=overwrite,
            dist=dist,
            sources=prompts,
            shard_prompts=shard_prompts,
            max_batch=max_batch,
        )
    _say(stats.summary())
    if stats.manifest is not None:
        typer.echo(format_summary(stats.manifest["status"]["summary"]))
        _say(f"wrote {out}")


def profile(
    out: Optional[Path],
    max_window: int,
    context: int,
    repeats: int,
    warmup: int,
    max_batch: int,
    options: PairOptions,
) -> None:
    """`disco profile`: the pair's cost model measured here, printed and written (default: under the cache root)."""
    from disco.base.files import atomic_write_json, write_or_rescue
    from disco.jobs.profile import default_profile_path, format_profile
    from disco.jobs.runner import runner_for
    from disco.loop.pair import load_pair

    _say("loading the pair …")
    pair = load_pair(options)
    # disco's loop: c_d and c_t(k) on the engines' sessions; vLLM: its step cost by the tokens in a step
    result = runner_for(pair).profile(max_window, context, repeats, warmup, max_batch)
    path = out if out is not None else default_profile_path(pair)
    typer.echo(format_profile(result))  # first: a failed write below then loses nothing
    write_or_rescue(path, lambda p: atomic_write_json(p, result), "profile")
    _say(f"wrote {path} (use it with: disco train --profile {path})")
