"""vLLM's stages (docs/architecture.md, "vLLM", "Runners"): its runner (`VllmRunner`, engines.base.Runner: generate,
compare, profile and the first-turn answers on vLLM: groups of prompts submitted together, compare's rows "serving
rows" timed by the group's wall clock), `disco profile --engine vllm` (`profile_load`: the target's step cost by the
tokens in a step, vLLM's batched draft by batch size), `disco collect --engine vllm` (`VllmContinuations`: every
prompt's continuation from one batched run), and the engine's registry entry (`KIND`). The engine itself (the
target's vLLM instances, loading a pair) is engine.py.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from disco.base.defaults import (
    DEFAULT_VLLM_MAX_SEQS,
    DEFAULT_VLLM_PROPOSERS,
    VLLM_PROFILE_BATCHES,
    VLLM_PROFILE_WINDOWS,
)
from disco.base.errors import DiscoError
from disco.base.machine import this_machine
from disco.core.cost import CostModel
from disco.core.load_profiles import SIDE_ENGINE, VLLM_DRAFT, LoadProfiles
from disco.core.stats import GenResult
from disco.engines.base import Continuation, EngineKind
from disco.formats.prompts import context_ids
from disco.policies.policy_registry import PolicySpec
from disco.sources.hub import load_model
from disco.vllm.engine import (
    DISCO_DRAFT,
    NO_SESSION,
    PROPOSER,
    ServingRow,
    SpecConfig,
    VllmTarget,
    check_device,
    instance_seqs,
    load_pair,
    prepare_embedded,
)
from disco.vllm.process import PROCESS, is_request
from disco.vllm.proposer import Proposer

# --- the runner: generate, compare, profile and the first-turn answers on vLLM ---------------------------


class VllmRunner:
    """Prompts decoded by vLLM (engines.base.Runner; docs/architecture.md, "Runners"): groups of prompts submitted
    together, disco's proposer inside (draft.DiscoDraftProposer on vLLM's own draft, side.DiscoProposer
    on the side engine). Each request's window counts come from the proposer by vLLM's request id, its time is
    its share of the group's wall clock (by tokens), so pooled figures are the groups' throughput."""

    group = DEFAULT_VLLM_MAX_SEQS  # the first-turn answers: this many together, the cache written after each group
    by_level = True  # compare: one result per --concurrency level

    def __init__(self, pair: Any, load: LoadProfiles | None = None) -> None:
        self.pair = pair
        self.load = load  # load profiles (c_step): the cost rules decide per batch, each proposer with its own

    def levels(self, asked: Sequence[int]) -> list[int]:
        return list(asked)

    def share(self) -> None:
        """What the side-engine proposer drafts with, set before vLLM builds it in this process."""
        PROCESS.side.pair, PROCESS.side.keep_stats = self.pair, True  # (its load: _proposer)

    def decode(
        self, prompts: Sequence[list[int]], spec: PolicySpec, config: Any, concurrency: int | None = None
    ) -> Iterator[GenResult]:
        """`prompts` in groups of `concurrency` (None: all together) with disco's proposer under `spec`
        (target-only for the target policy; on vLLM's own draft where the pair has a draft folder and the
        policy a batched form, else the side-engine proposer)."""
        if config.temperature > 0:
            raise DiscoError("--engine vllm generates greedily here: drop --temperature (or serve with vLLM itself)")
        self.share()
        target = self.pair.target_engine
        if spec.name == "target":
            row = ServingRow(spec.name, SpecConfig())
        elif target.draft_folder is not None and spec.runs_batched:  # on vLLM's own draft
            row = ServingRow(spec.name, SpecConfig(DISCO_DRAFT, config.max_window, str(target.draft_folder)), spec)
        else:  # a GGUF draft (vLLM loads none on CPUs), or a policy without a batched form: the side-engine proposer
            row = ServingRow(spec.name, SpecConfig("custom_class", config.max_window, PROPOSER), spec)
        together = concurrency or max(len(prompts), 1)
        target.size(instance_seqs((together,)), fixed=False)  # before _proposer builds the instance
        proposer = _proposer(target, row, self.load)
        return self._groups(row, proposer, list(prompts), config, together)

    def _groups(self, row: ServingRow, proposer: Proposer | None, prompts: list[list[int]], config: Any, together: int):
        target = self.pair.target_engine
        for start in range(0, len(prompts), together):
            group = prompts[start : start + together]
            results, request_ids, wall = row.generate(
                target, group, config.max_new_tokens, self.pair.eos_token_ids, together
            )
            _apportion(results, group, request_ids, wall, proposer)
            yield from results

    def rows(self, entries: Sequence[Any], config: Any, settings: dict, max_concurrency: int) -> list[VllmRow]:
        """vLLM's own rows (target-only first: the reference; its draft-model decoding at fixed lengths), then
        compare's policy entries as disco's proposers inside vLLM (serving_rows)."""
        if config.temperature > 0:
            raise DiscoError("compare --engine vllm runs greedy decoding (vLLM's outputs are compared token by token)")
        rows = serving_rows(self.pair, entries, config.max_window, settings, self.load is not None)
        if len(rows) < 2:
            raise DiscoError("no row to run beside vLLM target-only: choose rows with --policies")
        target = self.pair.target_engine
        target.plan([row.spec for row in rows])
        target.size(instance_seqs((max_concurrency,)))  # every row's instance alike, whichever level builds it
        return [VllmRow(self, row) for row in rows]

    def profile(self, max_window: int, context: int, repeats: int, warmup: int, max_batch: int) -> dict:
        """vLLM's step cost by the tokens in a step, requests x (window + 1) (profile_load; repeats and warmup are
        disco's loop's: here every width is timed over its steady steps)."""
        return profile_load(self.pair, max_window, context, max_batch)


class VllmRow:
    """A `disco compare` row on vLLM (engines.base.CompareRow): a group of prompts submitted together."""

    forwards_known = False  # vLLM's target forwards are its steps, not counted per request

    def __init__(self, runner: VllmRunner, row: ServingRow) -> None:
        self.runner, self.row = runner, row
        self.label = row.label
        self.anchor = row.policy is None  # vLLM's own decoding
        self.costs: tuple[float, float] | None = None

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None:
        pass  # each vLLM instance is built (and warmed up) on first use, untimed

    def decode(
        self, prompts: list[list[int]], config: Any, refs: list[GenResult] | None, concurrency: int
    ) -> list[GenResult]:
        pair = self.runner.pair
        self.runner.share()
        proposer = _proposer(pair.target_engine, self.row, self.runner.load)
        results, request_ids, wall = self.row.generate(
            pair.target_engine, prompts, config.max_new_tokens, pair.eos_token_ids, concurrency
        )
        _apportion(results, prompts, request_ids, wall, proposer)
        self.costs = (proposer.decide_s, proposer.forward_s) if proposer is not None else None
        return results


def serving_rows(
    pair: Any, entries: Sequence[Any], max_window: int, settings: dict, load: bool = False
) -> list[ServingRow]:
    """vLLM's own rows (target-only first: the reference; its draft-model decoding at fixed lengths), then
    each of compare's policy entries as disco's proposers inside vLLM: on vLLM's own draft ("vllm draft +
    POLICY", where the pair has a draft folder and the policy a batched form) and on the side engine ("vllm +
    POLICY"), as settings["proposers"] asks. The oracle needs the target's output in advance and has no vLLM row;
    the budget policies (PolicyKind.batch_budget: adaptive verification, the learned budget) run on vLLM's draft
    only, and only given a load profile (`load`: their cost tables), else left out in one line."""
    target = pair.target_engine
    shared = target.shared_draft(settings, max_window)
    rows = target.serving_rows(settings, shared)
    side = SpecConfig("custom_class", max_window, PROPOSER)
    draft = shared or (SpecConfig(DISCO_DRAFT, max_window, str(target.draft_folder)) if target.draft_folder else None)
    lengths = ((1, 1, max_window),) if shared else None  # the shared instance may draft further for vLLM's rows
    proposers = settings.get("proposers", DEFAULT_VLLM_PROPOSERS)
    unpriced = [e.label for e in entries if e.spec is not None and e.spec.kind.batch_budget and not load]
    if unpriced and draft is not None and "draft" in proposers:
        print(f"disco: no vLLM load profile, so no rows for {', '.join(unpriced)} (--load-profile)", file=sys.stderr)
    for e in entries:
        if e.spec is None or e.spec.kind.needs_target_tokens or e.variant is not None:
            continue
        if e.spec.kind.batch_budget:  # (a budget of the batch's draft slots: vLLM's draft, priced by the profile)
            if draft is not None and "draft" in proposers and load:
                rows.append(ServingRow(f"vllm draft + {e.label}", draft, policy=e.spec, lengths=lengths))
            continue
        if draft is not None and "draft" in proposers and e.spec.runs_batched:
            rows.append(ServingRow(f"vllm draft + {e.label}", draft, policy=e.spec, lengths=lengths))
        if "side" in proposers:
            rows.append(ServingRow(f"vllm + {e.label}", side, policy=e.spec))
    return rows


def _proposer(target: VllmTarget, row: ServingRow, profiles: LoadProfiles | None) -> Proposer | None:
    """disco's proposer for `row` (None: one of vLLM's own rows), built once, set to the row's policy and its own
    load profile: the one on vLLM's draft (draft.DiscoDraftProposer; on the shared draft instance also
    vLLM's own rows, policy None, each row at its own lengths by batch size) or the side-engine one
    (side.DiscoProposer, which registers itself in PROCESS.side)."""
    on_vllm_draft = row.spec.method == DISCO_DRAFT
    chosen = profiles is not None and row.policy is not None  # (vLLM's own rows decide nothing)
    load = profiles.choose(VLLM_DRAFT if on_vllm_draft else SIDE_ENGINE) if chosen else None
    if on_vllm_draft:
        proposer = target.proposer(row.spec)
        proposer.set_policy(row.policy, load)
        target.set_lengths(row.spec, row.lengths)
        return proposer if row.policy is not None else None
    if row.policy is None:
        return None
    target.llm(row.spec)  # built once; its proposer registers itself in PROCESS.side
    proposer = PROCESS.side.proposer
    assert proposer is not None
    proposer.set_policy(row.policy, load)
    return proposer


def _apportion(
    results: list[GenResult], prompts: list[list[int]], request_ids: list[str], wall: float, proposer: Proposer | None
) -> None:
    """Give each request of a group its share of the group's wall clock (by tokens) and, from disco's proposer,
    the counts of its windows."""
    total = sum(r.stats.new_tokens for r in results) or 1
    for ids, rid, res in zip(prompts, request_ids, results):
        res.stats.wall_s = wall * res.stats.new_tokens / total
        counted = proposer.stats_for(ids, rid) if proposer is not None else None
        if counted is not None:
            counted.new_tokens, counted.wall_s = res.stats.new_tokens, res.stats.wall_s
            counted.target_forwards = len(counted.windows)
            res.stats = counted


# --- disco profile --engine vllm: the target's step cost by the tokens in the step ----------------------


def step_costs(points: dict[int, float], top: int) -> list[float]:
    """C(1 .. top) from the step times measured at some widths: a step over more tokens never costs less, so
    the medians are first made non-decreasing (isotonic least squares: timing noise must not make an extra
    token look free, or cheaper than none, to the cost rules), then interpolated linearly between widths."""
    from sklearn.isotonic import IsotonicRegression

    widths = sorted(points)
    fitted = IsotonicRegression(increasing=True).fit_transform(widths, [points[w] for w in widths])
    return [float(v) for v in np.interp(np.arange(1, top + 1), widths, fitted)]


def profile_load(
    pair: Any, max_window: int, context: int, max_batch: int = DEFAULT_VLLM_MAX_SEQS, steps: int = 10, progress=True
) -> dict:
    """Measure vLLM's step time C(t) for steps of t = b x (k + 1) tokens (b requests, each verifying k
    drafts of disco's proposer at a constant length) for b up to max_batch, k up to max_window, and the
    proposer's draft cost. C(t) is the time from the end of one propose() to the start of the next:
    the target's batched forward, sampling and vLLM's scheduling, what a step costs beside the drafting.
    The proposer is the one on vLLM's own draft when the pair has a draft folder (its draft forward timed
    by batch size: c_draft[b - 1], one batched position for b requests), else the side-engine one (c_d, a
    draft token of one request). Returns a profile (CostModel fields: c_d, c_t = C(1 .. max_window + 1),
    c_step = C(1 .. T) by linear interpolation between the measured widths, c_draft) with the points measured."""
    import statistics

    from tqdm.auto import tqdm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    target = pair.target_engine
    SHARED = PROCESS.side
    SHARED.pair, SHARED.load, SHARED.keep_stats = pair, None, True
    on_vllm_draft = target.draft_folder is not None
    target.size(instance_seqs(max_batch=max_batch))
    if on_vllm_draft:
        spec = SpecConfig(DISCO_DRAFT, max_window, str(target.draft_folder))
        llm, proposer = target.llm(spec), target.proposer(spec)
    else:
        spec = SpecConfig("custom_class", max_window, PROPOSER)
        llm, proposer = target.llm(spec), SHARED.proposer
    assert proposer is not None
    marks: list[tuple[float, float]] = []  # (entry, exit) of every propose() call
    inner = proposer.propose

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = inner(*args, **kwargs)
        marks.append((t, time.perf_counter()))
        return out

    proposer.propose = timed  # type: ignore[method-assign]
    batches = [b for b in VLLM_PROFILE_BATCHES if b <= max_batch]
    windows = sorted({k for k in VLLM_PROFILE_WINDOWS if k <= max_window} | {max_window})
    points: dict[int, float] = {}
    draft_s, drafts = 0.0, 0
    per_batch: dict[int, list[float]] = {}  # vLLM's draft: seconds per batched draft position, by batch size
    grid = [(b, k) for b in batches for k in windows]
    for b, k in tqdm(grid, desc="timing vLLM steps", disable=not progress):
        proposer.set_policy(PolicySpec("constant", k=k) if k else PolicySpec("target"))
        marks.clear()
        prompts = [TokensPrompt(prompt_token_ids=context_ids(pair.tokenizer, context + i)) for i in range(b)]
        params = SamplingParams(temperature=0.0, max_tokens=(steps + 3) * (k + 1), ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)
        gaps = [nxt[0] - prev[1] for prev, nxt in zip(marks, marks[1:])][2 : 2 + steps]  # steady decode steps
        if gaps:
            t = b * (k + 1)
            points[t] = min(points.get(t, float("inf")), statistics.median(gaps))
        if on_vllm_draft:
            if k and proposer.n_positions:
                per_batch.setdefault(b, []).append(proposer.forward_s / proposer.n_positions)
        else:
            draft_s += proposer.forward_s
            running = [r.stats for r in proposer.requests.values()]
            drafts += sum(s.draft_forwards for s in [*proposer.finished.values(), *running])
    proposer.propose = inner  # type: ignore[method-assign]
    proposer.set_policy(SHARED.policy if not on_vllm_draft else PolicySpec("target"), None)
    c_step = step_costs(points, max_batch * (max_window + 1))
    widths = sorted(points)
    c_draft: tuple[float, ...] = ()
    if on_vllm_draft:  # one batched draft position for b = 1 .. max_batch requests (never cheaper for more)
        c_draft = tuple(step_costs({b: min(v) for b, v in per_batch.items()}, max_batch))
        c_d = c_draft[0]
    else:
        c_d = draft_s / max(drafts, 1)
    cost = CostModel(c_d, tuple(c_step[: max_window + 1]), "profile", tuple(c_step), c_draft)
    # what this profile cannot be: `vllm serve`'s process (its worker in a process of its own, on the cores vLLM
    # binds it to, beside the engine core and the API server): its steps cost otherwise (bench/results/closed-loop.md,
    # issue 47: 158 ms in-process, 248-286 ms served on a Zen 4), so the served proposer should seed its own
    # measurements with it (closed_loop), not decide by it alone
    process = f"in-process, {torch.get_num_threads()} threads (not vllm serve's worker)"
    print(
        f"disco: this profile times vLLM {process}; under `vllm serve` steps cost otherwise: give it as the seed "
        'of a closed loop ("closed_loop": true in DISCO_VLLM_POLICY), which measures the served process',
        file=sys.stderr,
    )
    return {
        "process": process,
        **cost.to_dict(),
        "proposer": VLLM_DRAFT if on_vllm_draft else SIDE_ENGINE,
        "unit": "s",
        "c_d_ratio": c_d / c_step[0],
        "c_t_ratio": [c / c_step[0] for c in c_step[: max_window + 1]],
        "measured_step_s": {str(w): points[w] for w in widths},  # C(t) at the widths timed
        "max_window": max_window,
        "max_batch": max_batch,
        "context_tokens": context,
        "steps": steps,
        "pair": pair.describe(),
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "machine": this_machine(),  # its step costs are this machine's (load_profiles.LoadProfiles warns elsewhere)
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# --- disco collect: every prompt's continuation from one batched run ------------------------------------


class VllmContinuations:
    """`disco collect --engine vllm` (docs/architecture.md, "vLLM", collection; engines.base.ContinuationSource):
    every prompt's target continuation from one target-only vLLM instance that runs at most `max_batch` requests
    at once (continuous batching: a finished request's place goes to the next prompt at the next step), handed
    to the collector as each request finishes, so the finished prompts are traced and written while the others run.

    The features come from the draft as vLLM's speculative decoding runs it: vLLM's `draft_model` method, and
    disco's proposer on it (draft.py), load the draft folder in the target's dtype; so the collector's
    draft is that folder on the torch engine in that dtype (bf16 on CPUs). vLLM's kernels round differently from
    torch's, but the weights and dtype are the proposer's, torch needs no second vLLM instance, and it gives the
    draft's hidden states. A GGUF draft (no folder) runs only in the side-engine proposer (side.DiscoProposer),
    on the pair's own llama.cpp draft: the features then come from that one.

    The target's distribution stays inside vLLM (its full-vocabulary log-probabilities per token would cost more
    than the generation). Greedy traces do without it: the labels need y alone, and the target-side columns and
    the TARGET_SIGNALS features are NaN (the manifest's collection.target_signals false), which a policy for vLLM
    never reads (train --no-target-signals; `disco train` refuses the signals such traces lack). Sampled traces
    need it for their labels (collect.coupled_draft): one teacher-forced forward of the target folder on torch in
    vLLM's dtype per prompt (`scorer`; the target is then loaded twice)."""

    def __init__(self, pair: Any, config: Any, max_batch: int) -> None:
        target: VllmTarget = pair.target_engine
        self.target, self.max_batch = target, max_batch
        target.size(instance_seqs(max_batch=max_batch))  # the instance (built on first use) runs this many at once
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # GPUs: untested (no GPU lent)
        dtype = torch.bfloat16 if target.dtype == "bfloat16" else torch.float32
        if target.draft_folder is not None:
            draft: Any = load_model(str(target.draft_folder), device, dtype)
            self.features = (
                f"torch {target.dtype} on {target.draft_folder}: the draft as vLLM's draft_model proposer loads it "
                "(in the target's dtype)"
            )
            self.pair = replace(pair, draft=draft, device=device, dtype=dtype)
        else:  # a GGUF draft: only the side-engine proposer runs it, on this engine
            self.features = f"{pair.draft.name} on {pair.draft_name}: the draft as the side-engine proposer runs it"
            self.pair, device = pair, pair.device
        self.scorer: Any = None
        self.target_distribution = "none: vLLM does not show it (no target-side columns, no target signals)"
        if config.temperature > 0:  # the labels of a sampled trace need p (collect.coupled_draft)
            self.scorer = load_model(str(target.folder), device, dtype)
            self.target_distribution = f"torch {target.dtype} teacher-forced forward of {target.folder}"

    def record(self) -> dict:
        return {
            "continuations": f"vllm: one batched run, at most {self.max_batch} requests at once",
            "features": self.features,
            "target_distribution": self.target_distribution,
            "target_signals": self.scorer is not None,
        }

    def continuations(
        self, prompts: Sequence[list[int]], configs: Sequence[Any]
    ) -> Generator[tuple[int, Continuation], None, None]:
        # the instance starts (once) here, before the collector asks for the first continuation: not timed as generation
        return self._stream(self.target.llm(SpecConfig()), prompts, configs)

    def _stream(
        self, llm: Any, prompts: Sequence[list[int]], configs: Sequence[Any]
    ) -> Generator[tuple[int, Continuation], None, None]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        eos = sorted(self.pair.eos_token_ids)
        params = [
            SamplingParams(
                max_tokens=c.max_new_tokens,
                temperature=c.temperature,
                top_p=c.top_p if c.temperature > 0 else 1.0,
                seed=c.seed if c.temperature > 0 else None,  # the prompt's own stream (collect.prompt_seed)
                stop_token_ids=eos,
                detokenize=False,  # token ids are all the collector reads
            )
            for c in configs
        ]
        # vLLM's scheduler takes them in this order, at most max_num_seqs at once; LLM.generate would return only
        # when all are done, so the engine is stepped here and each request handed over as it finishes
        ids = llm.enqueue([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        engine = llm.llm_engine
        pending = dict(zip(ids, range(len(ids))))  # vLLM's id (its own suffix added) -> index in prompts
        try:
            while pending:
                if not engine.has_unfinished_requests():
                    raise DiscoError(f"vLLM ended with {len(pending)} request(s) of this collection unanswered")
                for out in engine.step():
                    if not out.finished:
                        continue
                    rid = next((r for r in pending if is_request(r, out.request_id)), None)
                    if rid is not None:
                        yield pending.pop(rid), Continuation(list(out.outputs[0].token_ids))
        finally:  # closed early (an error, Ctrl-C, a kill): drop the requests still running
            if pending:
                with contextlib.suppress(Exception):  # never hiding the error that closed it
                    engine.abort_request(list(pending), internal=True)


KIND = EngineKind(
    load_pair,
    prepare_embedded,
    claims_auto=lambda target, draft, cuda: False,  # only when named: vLLM is an optional install
    check_device=check_device,
    anchor_names=("vllm",),  # --policies vllm: its own rows (target-only's is always there, the draft-model ones)
    owned_options=(("tensor_parallel_size", "--tensor-parallel-size"),),
    select_hint="--engine vllm",
    shares_options=("dtype", "threads", "draft_quant", "repack"),
    serving=True,
    continuations=VllmContinuations,  # collect: one batched run
    runner=lambda pair, load: VllmRunner(pair, load),  # generate, compare, profile, answers: groups of prompts
    no_session=NO_SESSION,
)
