"""`disco compare`: every policy on the same prompts, in one run, interleaved per prompt.

For each prompt, target-only decoding runs first (it is the reference output, the oracle's
knowledge and the speedup's denominator), then every policy in an order rotated per prompt,
so that machine drift and cache warmth hit all policies alike. Outputs: a table, a JSON file
with per-prompt numbers, and PNG plots. The rows decode through the pair's runner (runner.py):
disco's loop one prompt at a time; vLLM groups of prompts submitted together at each --concurrency
level, each level's result in its own folder (docs/architecture.md, "Runners").

The run measures its own noise: target-only decodes each group again after its other rows (each prompt's
"target_again"), and rows that run exactly target-only's computation (a policy that never drafts) are timed
like any row; how far these put the same computation from 1.00× is the run's drift (`measured_drift`), and the
table marks the wall-clock speedups within it (≈) and says so under the table.

Under sampling (temperature > 0) each prompt runs with several seeds (target-only first for each),
speedups come with their spread over seeds, and outputs cannot be compared token by token: that
the loop samples from the target's distribution is proved by the distribution tests
(tests/test_sampling.py), and the table shows, as a sanity figure, the mean log-probability per
token of each policy's output under the target's sampling distribution beside target-only's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import torch

from disco.base.crash import keep
from disco.base.defaults import ADAEDL_LAMBDA, DEFAULT_BUDGET_K, DEFAULT_K, DEFAULT_THRESHOLD, POLICY_NAMES, SVIP_H
from disco.base.errors import DiscoError
from disco.base.files import atomic_write_json, atomic_write_text, write_dir
from disco.core.cost import CostModel
from disco.core.load_profiles import LoadProfiles
from disco.engines.base import Anchor, CompareRow, Variant
from disco.formats.prompts import Prompt
from disco.jobs.runner import TARGET_LABEL, runner_for
from disco.loop.decode import DecodeConfig, GenResult, GenStats, warp
from disco.loop.engine_registry import ANCHOR_NAMES, ENGINE_KINDS, teacher_forced
from disco.loop.pair import Pair
from disco.policies.policy_registry import PolicySpec

__all__ = ["TARGET_LABEL", "Entry", "default_entries", "run_compare", "summarise"]

AGAIN = "target_again"  # a prompt's key: target-only decoded again, after the prompt's other rows (the drift)
AGAIN_LABEL = f"{TARGET_LABEL} again"  # its sample in the drift's record
NEAR = "≈"  # the table's mark of a wall-clock speedup within the run's drift


@dataclass
class Entry:
    label: str  # the row name in the table
    spec: PolicySpec | None = None  # a policy in disco's loop; None for the engines' own decoding (anchors)
    own: Anchor | None = None  # the engine's own speculative decoding (engines.base.Anchor)
    variant: Variant | None = None  # run this policy in another setting of the engine (e.g. llama.cpp's fast verify)

    @property
    def anchor(self) -> bool:
        """The engine's own decoding (transformers' assisted generation, llama-server): no windows known."""
        return self.spec is None


# vLLM's adaptive verification re-implemented (adaptive_verification.BatchAdaptiveVerification) and disco's learned
# budget (BatchLearnedBudget), on vLLM's draft: rows "vllm draft + LABEL" (vllm/stages.serving_rows); in disco's
# loop (torch, llama.cpp) their one-request forms (loop_budget.py), rows LABEL
ADAPTIVE_LABEL = "adaptive verification (vLLM 0.32 method)"
LEARNED_BUDGET_LABEL = "learned budget"
# the rows that also run in each of the engine's variants: the tuned rules and the bound
VARIANT_ROWS = ("classifier", "oracle")


def default_entries(
    classifier: str | None = None,
    tuned_k: int | None = None,
    tuned_threshold: float | None = None,
    pair: Pair | None = None,
    include_anchor: bool = True,
    anchor_settings: dict | None = None,
    tuned: dict | None = None,
    sampling: bool = False,
    more_classifiers: Sequence[str] = (),
) -> list[Entry]:
    """The standard line-up: every policy (AdaEDL and SVIP at their papers' settings), plus tuned
    baselines and the classifier when known (what `disco train` chose, and each of its rules at its
    tuned setting), and, given the pair, its engine's own speculative decoding (Engine.anchors:
    transformers' generate(assistant_model=…) on torch; llama-server target-only and -md on llama.cpp,
    anchor_settings["server_tuned"] = {n_max, p_min} tuned on validation prompts) and the rows the engine
    also runs in another setting (Engine.variants: llama.cpp's fast verification in exact mode).
    tuned: the artifact's "tuned" record (adaedl_lambda, svip_h, rules: {rule: setting}). sampling: no
    oracle (it is defined for greedy decoding only). more_classifiers: other artifacts, each a row
    "classifier (FOLDER NAME)"."""
    tuned = tuned or {}
    entries = [
        Entry(f"constant k={DEFAULT_K}", PolicySpec("constant", k=DEFAULT_K)),
        Entry("heuristic", PolicySpec("heuristic")),
        Entry(f"threshold {DEFAULT_THRESHOLD:g}", PolicySpec("threshold", threshold=DEFAULT_THRESHOLD)),
        Entry("threshold adaptive", PolicySpec("threshold", threshold=DEFAULT_THRESHOLD, adaptive=True)),
        Entry(f"adaedl λ0={ADAEDL_LAMBDA:g}", PolicySpec("adaedl", lam=ADAEDL_LAMBDA)),
        Entry(f"svip h={SVIP_H:g}", PolicySpec("svip", h=SVIP_H)),
        Entry("oracle", PolicySpec("oracle")),
    ]
    if tuned_k is not None and tuned_k != DEFAULT_K:
        entries.insert(1, Entry(f"constant k={tuned_k} (tuned)", PolicySpec("constant", k=tuned_k)))
    if tuned_threshold is not None:
        entries.insert(
            -1, Entry(f"threshold {tuned_threshold:.2f} (tuned)", PolicySpec("threshold", threshold=tuned_threshold))
        )
    if tuned.get("adaedl_lambda") is not None:
        entries.insert(
            -1, Entry(f"adaedl λ0={tuned['adaedl_lambda']:g} (tuned)", PolicySpec("adaedl", lam=tuned["adaedl_lambda"]))
        )
    if tuned.get("svip_h") is not None:
        entries.insert(-1, Entry(f"svip h={tuned['svip_h']:g} (tuned)", PolicySpec("svip", h=tuned["svip_h"])))
    if classifier is not None:
        entries.insert(-1, Entry("classifier", PolicySpec("classifier", classifier=classifier)))
        for rule, setting in (tuned.get("rules") or {}).items():
            entries.insert(
                -1,
                Entry(
                    f"classifier {rule} rule {setting:g} (tuned)",
                    PolicySpec("classifier", classifier=classifier, classifier_rule=rule, classifier_setting=setting),
                ),
            )
    for other in more_classifiers:
        entries.insert(-1, Entry(f"classifier ({Path(other).name})", PolicySpec("classifier", classifier=other)))
    # the budget policies: on vLLM's draft a budget of the batch's slots (priced by the load profile); in disco's
    # loop a budget of the window (loop_budget.py), priced by the artifact's cost model, so only given one
    serving = pair is not None and ENGINE_KINDS[pair.engine_name].serving
    if serving or classifier is not None:
        priced_by = None if serving else classifier
        entries.insert(
            -1, Entry(ADAPTIVE_LABEL, PolicySpec("adaptive-verification", k=DEFAULT_BUDGET_K, classifier=priced_by))
        )
        if classifier is not None:
            budget = PolicySpec("learned-budget", classifier=classifier, k=DEFAULT_BUDGET_K)
            entries.insert(-1, Entry(LEARNED_BUDGET_LABEL, budget))
    if pair is not None:
        engine = pair.target_engine
        for variant in engine.variants():
            entries += [
                Entry(e.label + variant.suffix, e.spec, variant=variant)
                for e in entries
                if e.label in VARIANT_ROWS or e.label.endswith("(tuned)") and e.spec.name == "threshold"
            ]
        if include_anchor:
            entries += [Entry(a.label, own=a) for a in engine.anchors(pair, anchor_settings or {})]
    if sampling:
        entries = [e for e in entries if e.spec is None or not e.spec.kind.greedy_only]
    return entries


def tuned_from_artifact(path: str | Path) -> dict:
    """The settings `disco train` tuned on the same validation prompts as the classifier (k, threshold,
    adaedl_lambda, svip_h, rules: {rule: setting}), read from the artifact's manifest (JSON only)."""
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        raise DiscoError(f"no classifier artifact at {path} (manifest.json missing): train one with `disco train`")
    return json.loads(manifest.read_text()).get("tuned", {})


def select_entries(entries: list[Entry], names: str | None) -> list[Entry]:
    """The entries whose policy name (constant, threshold, adaedl, classifier, …) or label prefix
    (transformers, llama-server) is in the comma-separated `names`; all when None. `rules` names the
    classifier's rows under each of its other rules. Target-only always runs: it is every speedup's
    denominator."""
    if not names:
        return entries
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    known = [*POLICY_NAMES, RULES_NAME, *ANCHOR_NAMES]
    unknown = sorted(wanted - set(known))
    if unknown or not wanted:
        raise DiscoError(f"--policies: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(known)}")
    return [e for e in entries if _selection_name(e) in wanted]


RULES_NAME = "rules"  # --policies name of the classifier's per-rule rows


def _selection_name(e: Entry) -> str:
    if e.spec is None:
        return e.label.split(" ")[0]
    return RULES_NAME if e.spec.classifier_rule is not None else e.spec.name


def check_seeds(seeds: int, temperature: float) -> None:
    if seeds < 1 or (seeds > 1 and temperature == 0):
        raise DiscoError(f"--seeds {seeds}: give 1, or more with --temperature > 0 (greedy decoding is deterministic)")


def run_compare(
    pair: Pair,
    prompts: list[Prompt],
    entries: list[Entry],
    config: DecodeConfig,
    out_dir: Path,
    chat: bool | None = None,
    progress: bool = True,
    plots: bool = True,
    seeds: int = 1,
    concurrency: Sequence[int] = (1,),
    settings: dict | None = None,
    load: LoadProfiles | None = None,
) -> dict:
    """Run every entry on every prompt (with `seeds` seeds config.seed, config.seed + 1, … when sampling) through
    the pair's runner (runner.runner_for), at each of its `concurrency` levels: the prompts in groups of c decoded
    together (one at a time on disco's loop), target-only first, the other rows' order rotated per group and seed.
    Writes compare.json, table.md and plots into out_dir; a runner with results by level (vLLM) writes them into
    out_dir/c{c}/ and all tables into out_dir/table.md, and returns {"concurrency": {c: result}}.
    settings: the engine's own rows' settings (vLLM: fixed_k, proposers); load: vLLM load profiles (each proposer
    takes its own)."""
    sampled = config.temperature > 0
    check_seeds(seeds, config.temperature)
    runner = runner_for(pair, load)
    levels = runner.levels(concurrency)
    rows = runner.rows(entries, config, settings or {}, max(levels))
    ref_row, others = rows[0], rows[1:]
    greedy_only = sorted({e.spec.name for e in entries if e.spec is not None and e.spec.kind.greedy_only})
    if sampled and greedy_only:
        raise DiscoError(
            f"the {', '.join(greedy_only)} policy is defined for greedy decoding only: leave it out of "
            "--policies when sampling"
        )
    from tqdm import tqdm

    from disco.jobs.answers import answer_first_turns

    prompts = answer_first_turns(pair, prompts, config.max_new_tokens, chat, progress)  # mt-bench-2: turn 1 first
    ids = [pair.encode(p.prompt, chat) for p in prompts]
    partial = _Partial(Path(out_dir))
    # captured steps (torch --compile) are compiled here, once, not inside any timed decode
    compile_s = pair.warm_up(max(len(i) for i in ids) + config.max_new_tokens)
    results: dict[int, dict] = {}
    with partial.said_on_error(), contextlib.ExitStack() as stack:
        for row in rows:  # the engines' own decoding (servers) starts before any timing
            row.start(stack, progress)
        total = len(levels) * len(prompts) * seeds * (len(rows) + 1)  # + target-only again
        bar = tqdm(total=total, desc="compare", unit="run", disable=not progress)
        stack.callback(bar.close)  # an error's line then starts a line of its own
        for c in levels:
            per_prompt: list[dict] = []
            costs: dict[str, list[float]] = {}  # disco's proposer's own time (vLLM): decide_s, forward_s, drafts
            for g, start in enumerate(range(0, len(prompts), c)):
                group = list(range(start, min(start + c, len(prompts))))
                group_ids = [ids[i] for i in group]
                for s in range(seeds):
                    cfg = replace(config, seed=config.seed + s)
                    bar.set_postfix_str(f"c={c}: {prompts[start].id}: {TARGET_LABEL}")
                    refs = ref_row.decode(group_ids, cfg, None, c)
                    bar.update(len(group))
                    done = [
                        {
                            "id": prompts[i].id,
                            "task": prompts[i].task,
                            "seed": cfg.seed if sampled else None,
                            "prompt_tokens": len(ids[i]),
                            "runs": {TARGET_LABEL: _record(pair, ids[i], cfg, ref, ref, ref_row.forwards_known)},
                        }
                        for i, ref in zip(group, refs)
                    ]
                    shift = (g * seeds + s) % len(others)
                    for row in others[shift:] + others[:shift]:  # rotate the order per group and seed
                        bar.set_postfix_str(f"c={c}: {prompts[start].id}: {row.label}")
                        res = row.decode(group_ids, cfg, refs, c)
                        for n, i in enumerate(group):
                            record = _record(pair, ids[i], cfg, res[n], refs[n], forwards_known=row.forwards_known)
                            done[n]["runs"][row.label] = record
                        bar.update(len(group))
                        if row.costs is not None:
                            cost = costs.setdefault(row.label, [0.0, 0.0, 0])
                            cost[0], cost[1] = cost[0] + row.costs[0], cost[1] + row.costs[1]
                            cost[2] += sum(d["runs"][row.label]["draft_forwards"] for d in done)
                    # target-only once more, last: the same computation as the first, apart by the run's drift
                    bar.set_postfix_str(f"c={c}: {prompts[start].id}: {AGAIN_LABEL}")
                    for d, second, first in zip(done, ref_row.decode(group_ids, cfg, None, c), refs):
                        d[AGAIN] = _again(second, first)
                    bar.update(len(group))
                    for d in done:
                        per_prompt.append(d)
                        partial.add(d)
            results[c] = _result(pair, config, runner.by_level, c, seeds, compile_s, ref_row, others, per_prompt, costs)
        bar.close()

    def fill(folder: Path) -> None:  # a new folder replacing the old whole: no stale plot stays
        if not runner.by_level:
            _write_result(results[1], folder, plots)
            return
        tables = []
        for c, result in results.items():
            sub = folder / f"c{c}"
            sub.mkdir()
            _write_result(result, sub, plots)
            tables.append(f"## {c} request{'s' if c > 1 else ''} at a time ({TARGET_LABEL} = {ref_row.label})\n\n")
            tables[-1] += format_tables(result) + "\n"
        atomic_write_text(folder / "table.md", "\n".join(tables))
        atomic_write_json(folder / "compare.json", {"concurrency": {str(c): r for c, r in results.items()}})

    write_dir(out_dir, fill, "comparison")
    with contextlib.suppress(OSError):
        partial.path.unlink(missing_ok=True)
    return {"concurrency": results} if runner.by_level else results[1]


def _result(
    pair: Pair,
    config: DecodeConfig,
    by_level: bool,
    c: int,
    seeds: int,
    compile_s: float,
    ref_row: CompareRow,
    others: list[CompareRow],
    per_prompt: list[dict],
    costs: dict[str, list[float]],
) -> dict:
    """One level's compare result: the rows summarised over the prompts (and by task), the run's drift, the
    prompts' runs."""
    anchors = [r.label for r in others if r.anchor]
    summary, by_task = summarise([TARGET_LABEL, *(r.label for r in others)], per_prompt, anchors)
    for label, (decide_s, forward_s, drafts) in costs.items():  # the proposer's time per draft token
        n = max(drafts, 1)
        summary[label]["decide_ms_per_draft"] = 1000 * decide_s / n
        summary[label]["draft_ms_per_draft"] = 1000 * forward_s / n
    reference = TARGET_LABEL if ref_row.label == TARGET_LABEL else f"{TARGET_LABEL} ({ref_row.label})"
    return {
        "pair": pair.describe(),
        "config": config.__dict__,
        "n_prompts": len(per_prompt) // seeds,  # every prompt ran with every seed
        "seeds": seeds,
        **({"concurrency": c} if by_level else {"compile_s": compile_s}),
        "reference": reference,
        "anchors": anchors,
        # the run's drift: what separated runs of the same computation (None: nothing measured it)
        "drift": summary[TARGET_LABEL].get("drift"),
        "summary": summary,
        "summary_by_task": by_task,
        "prompts": per_prompt,
    }


def _write_result(result: dict, folder: Path, plots: bool) -> None:
    atomic_write_json(folder / "compare.json", result)
    atomic_write_text(folder / "table.md", format_tables(result) + "\n")
    if plots:
        from disco.formats.plots import write_plots

        write_plots(result, folder)


def report(result: dict) -> str:
    """What `disco compare` prints: run_compare's tables, each level's under its heading (vLLM)."""
    if "concurrency" not in result or not isinstance(result["concurrency"], dict):
        return format_tables(result)
    return "\n".join(f"\n{c} request(s) at a time:\n" + format_tables(r) for c, r in result["concurrency"].items())


def written(out_dir: Path, result: dict) -> str:
    """The line saying what run_compare wrote."""
    if "concurrency" in result and isinstance(result["concurrency"], dict):
        return f"wrote {out_dir}/table.md and c*/compare.json, table.md, plots"
    return f"wrote {out_dir}/compare.json, table.md and plots"


class _Partial:
    """Each finished prompt's rows, appended as it finishes to OUT.partial.jsonl beside --out: what a crash
    (disco.base.crash.keep) or an engine's error keeps; removed once compare.json is written."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir.parent / f"{out_dir.name}.partial.jsonl"
        self.rows = 0  # prompts written; -1 once a write failed (the run goes on; write_dir rescues the result)

    def add(self, row: dict) -> None:
        if self.rows < 0:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a" if self.rows else "w", encoding="utf-8") as f:  # "w": an older run's go
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.rows += 1
        except OSError:
            self.rows = -1
        keep(self.note())

    def note(self) -> str:
        n = self.rows
        return f"the rows of {n} finished prompt{'s' * (n > 1)} are kept in {self.path}" if n > 0 else ""

    @contextlib.contextmanager
    def said_on_error(self) -> Iterator[None]:
        """A DiscoError raised inside (an engine failed, e.g. llama-server died) also says what was kept."""
        try:
            yield
        except DiscoError as e:
            if self.note():
                raise DiscoError(f"{e}; {self.note()}") from None
            raise


def _record(
    pair: Pair, prompt_ids: list[int], config: DecodeConfig, res: GenResult, ref: GenResult, forwards_known: bool = True
) -> dict:
    """One run's numbers. forwards_known=False: llama-server, whose forward calls we do not see.
    Greedy: whether the output equals target-only decoding's. Sampling: the sum of the target's
    log-probabilities of the output (target_logprob, outside the timed run)."""
    s = res.stats
    out = {
        **s.to_dict(),
        "speedup": _per_token_speedup(ref.stats.wall_s, ref.stats.new_tokens, s.wall_s, s.new_tokens),
        "forwards_known": forwards_known,
    }
    if config.temperature == 0:
        return {**out, "lossless": res.tokens == ref.tokens, "first_mismatch": _first_mismatch(res.tokens, ref.tokens)}
    return {**out, "target_logprob": target_logprob(pair, prompt_ids, res.tokens, config)}


@torch.inference_mode()
def target_logprob(pair: Pair, prompt_ids: list[int], tokens: list[int], config: DecodeConfig) -> float:
    """Sum over `tokens` of log p(token) under the target's sampling distribution (decode.warp at the
    config's temperature and top-p), from one teacher-forced target forward."""
    if not tokens:
        return 0.0
    ids = torch.tensor([*prompt_ids, *tokens], device=pair.device)
    logits, _ = teacher_forced(pair.target, ids, len(prompt_ids))
    p = warp(logits, config.temperature, config.top_p)
    return float(p.gather(-1, ids[len(prompt_ids) :, None])[:, 0].clamp_min(1e-30).log().sum())


def _again(res: GenResult, ref: GenResult) -> dict:
    """Target-only's second run of a prompt: its time, and its speedup over the first (the drift between them)."""
    s = res.stats
    return {
        "wall_s": s.wall_s,
        "new_tokens": s.new_tokens,
        "speedup": _per_token_speedup(ref.stats.wall_s, ref.stats.new_tokens, s.wall_s, s.new_tokens),
        "same_output": res.tokens == ref.tokens,
    }


def _per_token_speedup(base_s: float, base_tokens: int, s: float, tokens: int) -> float:
    """Target-only time per token over the policy's: under sampling their outputs (and lengths) differ,
    so whole-run times do not compare; under greedy decoding the lengths are equal and this is their ratio."""
    return (base_s / max(base_tokens, 1)) / (s / max(tokens, 1)) if s > 0 else 0.0


def _first_mismatch(tokens: list[int], ref: list[int]) -> int | None:
    """Index of the first generated token that differs from target-only decoding (None: identical)."""
    for i, (a, b) in enumerate(zip(tokens, ref)):
        if a != b:
            return i
    return None if len(tokens) == len(ref) else min(len(tokens), len(ref))


def summarise(labels: Sequence[str], per_prompt: list[dict], anchors: Sequence[str] = ()) -> tuple[dict, dict]:
    """(summary, summary by task): every row pooled over all prompts, and over each task's prompts
    ({task: {label: summary}}, tasks in the order they first come, e.g. MT-Bench's categories). The pooled
    summary also holds the run's drift (measured_drift; anchors: rows of another engine's loop, never the same
    computation as target-only): target-only's "drift", and each other row's "within_drift" (whether its pooled
    speedup is no further from 1.00× than the drift)."""
    summary = {label: _summarise(label, per_prompt) for label in labels}
    drift = measured_drift(per_prompt, summary, anchors) if TARGET_LABEL in summary else None
    if drift is not None:
        summary[TARGET_LABEL]["drift"] = drift
        for label, s in summary.items():
            if label != TARGET_LABEL:
                s["within_drift"] = abs(s["speedup"] - 1) <= drift["drift"]
    by_task = {
        task: {label: _summarise(label, [p for p in per_prompt if p["task"] == task]) for label in labels}
        for task in dict.fromkeys(p["task"] for p in per_prompt)
    }
    return summary, by_task


def _same_computation(run: dict, base: dict) -> bool:
    """Whether a row's run did exactly what target-only's did: no draft forward, the same target forwards for the
    same tokens (a policy that never drafts), both counted (not vLLM's or a server's rows, whose forwards are not)."""
    known = run.get("forwards_known", True) and base.get("forwards_known", True)
    same = run["draft_forwards"] == 0 and (run["target_forwards"], run["new_tokens"]) == (
        base["target_forwards"],
        base["new_tokens"],
    )
    return bool(known and same and base["target_forwards"] > 0)


def measured_drift(per_prompt: list[dict], summary: dict, anchors: Sequence[str] = ()) -> dict | None:
    """How far the run's wall clock put runs of the same computation apart: target-only decoded again after each
    prompt's other rows (the prompts' AGAIN; its pooled time per token over the first run's), and each row whose
    every run did exactly what target-only did (_same_computation: a policy that never drafts; anchors excepted),
    as pooled speedups over target-only. drift: the largest distance of one of them from 1.00×; a row's speedup
    no further from 1.00× than that (or from another row's) is not told apart from it by this run.
    None where nothing measured it (prompts recorded before target-only ran twice, and no row that never drafts)."""
    if not per_prompt:
        return None
    samples: dict[str, float] = {}
    base = [p["runs"][TARGET_LABEL] for p in per_prompt]
    again = [p.get(AGAIN) for p in per_prompt]
    if all(again):
        samples[AGAIN_LABEL] = _per_token_speedup(
            sum(b["wall_s"] for b in base),
            sum(b["new_tokens"] for b in base),
            sum(a["wall_s"] for a in again),
            sum(a["new_tokens"] for a in again),
        )
    for label, s in summary.items():
        if label == TARGET_LABEL or label in anchors:
            continue
        if all(_same_computation(p["runs"][label], b) for p, b in zip(per_prompt, base)):
            samples[label] = s["speedup"]
    if not samples:
        return None
    return {
        "drift": max(abs(v - 1) for v in samples.values()),
        "samples": samples,  # {what ran target-only's computation: its pooled speedup over target-only}
        "measured_by": "target-only decoded again after each prompt's other rows, and the rows that never draft "
        "(the same forwards as target-only), timed like every row",
    }


def _summarise(label: str, per_prompt: list[dict]) -> dict:
    runs = [p["runs"][label] for p in per_prompt]
    base = [p["runs"][TARGET_LABEL] for p in per_prompt]
    tokens = sum(r["new_tokens"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    windows = [a for r in runs for a in r["accepted_per_window"]]
    drafted = sum(r["drafted"] for r in runs)
    known = all(r.get("forwards_known", True) for r in runs)  # llama-server reports drafted/accepted only
    sampled = "target_logprob" in runs[0]
    by_seed = _pooled_by_seed(per_prompt, lambda r: r["wall_s"], label)
    out = {
        # pooled: target-only's time per token over this policy's, each summed over the prompts
        "speedup": _per_token_speedup(sum(b["wall_s"] for b in base), sum(b["new_tokens"] for b in base), wall, tokens),
        "speedup_median": statistics.median(r["speedup"] for r in runs),
        "speedup_min": min(r["speedup"] for r in runs),
        "speedup_max": max(r["speedup"] for r in runs),
        "speedup_by_seed": by_seed,  # {seed: pooled speedup over the prompts}: the spread over seeds
        "tokens_per_s": tokens / wall if wall else 0.0,
        "target_forwards_per_token": sum(r["target_forwards"] for r in runs) / tokens if known else None,
        "draft_forwards_per_token": sum(r["draft_forwards"] for r in runs) / tokens if known else None,
        "mean_accepted_window": statistics.fmean(windows) if windows else None,
        "acceptance_rate": sum(r["accepted"] for r in runs) / drafted if drafted else None,
        # captured steps (torch --compile): filler tokens padding forwards up to their bucket, per token
        "padded_per_token": sum(r.get("padded_tokens", 0) for r in runs) / tokens if tokens else 0.0,
        "prompts": len(runs),
        # the totals the rates above are taken from: a task's summary adds up to the pooled one
        "new_tokens": tokens,
        "wall_s": wall,
        "drafted": drafted,
        "accepted": sum(r["accepted"] for r in runs),
    }
    if sampled:
        return {**out, "target_logprob": sum(r["target_logprob"] for r in runs) / tokens if tokens else None}
    return {
        **out,
        "lossless": all(r["lossless"] for r in runs),
        "mismatched_prompts": sum(not r["lossless"] for r in runs),
    }


def _pooled_by_seed(per_prompt: list[dict], time_of, label: str) -> dict[str, float]:
    """{seed: target-only time per token over `label`'s, each summed over the prompts run with that seed}."""
    seeds: dict[str, list[float]] = {}
    for p in per_prompt:
        t = seeds.setdefault(str(p.get("seed")), [0.0, 0.0, 0.0, 0.0])
        base, run = p["runs"][TARGET_LABEL], p["runs"][label]
        t[0], t[1] = t[0] + time_of(base), t[1] + base["new_tokens"]
        t[2], t[3] = t[2] + time_of(run), t[3] + run["new_tokens"]
    return {seed: _per_token_speedup(*t) for seed, t in seeds.items()}


def cost_model_speedups(result: dict, cost: CostModel) -> dict[str, dict | None]:
    """Per policy of a compare result: the speedup over target-only decoding that the run's own
    forward counts give under a cost model (simulate.CostModel from `disco profile`), pooled over
    prompts, median per prompt, and pooled per seed (sampling). Machine noise cannot touch it,
    which makes it the figure to compare on a shared machine. None for the anchors (their loops
    expose no windows)."""
    out: dict[str, dict | None] = {}
    anchors = set(result["anchors"])
    as_stats = lambda r: GenStats(**{k: r[k] for k in ("new_tokens", "target_forwards", "draft_forwards", "windows")})  # noqa: E731
    for label in result["summary"]:
        if label in anchors:
            out[label] = None
            continue
        runs = [as_stats(p["runs"][label]) for p in result["prompts"]]
        times = [cost.time(s) for s in runs]
        bases = [cost.baseline(s) for s in runs]
        out[label] = {
            "pooled": sum(bases) / sum(times),
            "median": statistics.median(b / t for b, t in zip(bases, times)),
            "by_seed": _pooled_by_seed(result["prompts"], lambda r: cost.time(as_stats(r)), label),
        }
    return out


def spread(by_seed: dict[str, float]) -> str:
    """ "min–max over N seeds" of per-seed speedups ("" for a single seed)."""
    values = list(by_seed.values())
    return f"{min(values):.2f}–{max(values):.2f} over {len(values)} seeds" if len(values) > 1 else ""


def format_table(summary: dict) -> str:
    """Greedy: the last column says whether the output equals target-only decoding's. Sampling: the
    speedup's spread over seeds, and the mean target log-probability per output token. Captured steps
    (torch --compile): the filler tokens per output token that padded forwards up to their buckets."""
    sampled = "target_logprob" in next(iter(summary.values()))
    padded = any(s.get("padded_per_token") for s in summary.values())  # the bucket overhead of captured steps
    last = "target log-prob/token" if sampled else "= target"
    head = (
        f"| policy | speedup |{' over seeds |' if sampled else ''} median (min–max) per prompt | tok/s | "
        f"target fwd/tok | draft fwd/tok | mean accepted/window | acceptance |{' padding/tok |' if padded else ''}"
        f" {last} |"
    )
    lines = [head, "|" + "---|" * (9 + sampled + padded)]
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    for label, s in summary.items():
        rate = "–" if s["acceptance_rate"] is None else f"{100 * s['acceptance_rate']:.0f}%"
        if sampled:
            end = fmt(s["target_logprob"], ".3f")
        else:
            end = (
                "yes"
                if s["lossless"]
                else f"NO ({s.get('mismatched_prompts', '?')}/{s.get('prompts', '?')} prompts differ)"
            )
        seeds = f" {spread(s['speedup_by_seed'])} |" if sampled else ""
        pad = f" {s.get('padded_per_token', 0.0):.2f} |" if padded else ""
        near = NEAR if s.get("within_drift") else ""
        lines.append(
            f"| {label} | {near}{s['speedup']:.2f}× |{seeds} {s['speedup_median']:.2f} ({s['speedup_min']:.2f}–{s['speedup_max']:.2f}) "
            f"| {s['tokens_per_s']:.2f} | {fmt(s['target_forwards_per_token'], '.3f')} "
            f"| {fmt(s['draft_forwards_per_token'], '.3f')} | {fmt(s['mean_accepted_window'], '.2f')} | {rate} |{pad} {end} |"
        )
    drift = summary.get(TARGET_LABEL, {}).get("drift")  # target-only's row holds the run's drift
    if drift is not None:
        lines += ["", drift_note(drift)]
    return "\n".join(lines)


def drift_note(drift: dict) -> str:
    """The line under the table: what ≈ marks, the run's drift and how it was measured."""
    measured = "; ".join(
        f"{TARGET_LABEL}-only again, after each prompt's other rows, {v:.2f}×"
        if label == AGAIN_LABEL
        else f"{label}, a row that never drafts, {v:.2f}×"
        for label, v in drift["samples"].items()
    )
    return (
        f"{NEAR}: within ±{100 * drift['drift']:.1f}% of 1.00× ({1 - drift['drift']:.2f}×–{1 + drift['drift']:.2f}×), "
        "this run's drift (the widest gap between runs of "
        f"target-only's own computation: {measured}): not faster or slower than target-only beyond this run's "
        "noise; rows closer than that to each other are not told apart either."
    )


def format_task_table(by_task: dict, summary: dict) -> str:
    """Speedup of every row by task (columns: all prompts pooled, then each task with its prompt count)."""
    tasks = list(by_task)
    n = lambda t: next(iter(by_task[t].values()))["prompts"]  # noqa: E731
    head = f"| policy | all ({next(iter(summary.values()))['prompts']}) | " + " | ".join(f"{t} ({n(t)})" for t in tasks)
    lines = [head + " |", "|" + "---|" * (2 + len(tasks))]
    for label, s in summary.items():
        cells = " | ".join(f"{by_task[t][label]['speedup']:.2f}×" for t in tasks)
        lines.append(f"| {label} | {s['speedup']:.2f}× | {cells} |")
    return "\n".join(lines)


def format_tables(result: dict) -> str:
    """table.md: the main table, then, when the prompts span several tasks, the speedups by task."""
    text = format_table(result["summary"])
    by_task = result.get("summary_by_task") or {}
    if len(by_task) > 1:
        text += (
            "\n\nSpeedup by task (target-only's time per token over the row's, pooled over the task's prompts):\n\n"
            + format_task_table(by_task, result["summary"])
        )
    return text
