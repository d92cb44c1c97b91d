"""Replay a stopping policy over oracle traces, without running a model (docs/architecture.md, "Simulator").

A trace (disco/formats/trace.py) holds, for every position j of the target's greedy continuation y,
the draft's features there, teacher-forced on prompt + y[:j], and the label "the draft's
token equals y_j". Under greedy decoding that is all the real loop (disco/loop/decode.py) ever
looks at while a window's drafts still agree with y, so `_replay` below runs the loop's own
round (rounds.py) on the trace:

    k_max = rounds.window_limit(...)                            (0: a target-only round)
    draft until the policy stops or k_max is reached            (rounds.draft_window)
    verify the first v of them                                  (rounds.verified_count: v = k but for a budget)
    accepted = leading run of label == 1 among the verified positions
    commit accepted + 1 tokens                                  (y's last position: EOS / budget)

and drives the *real* policy objects (policy.py, classifier.py): constant, heuristic,
threshold, AdaEDL, SVIP and oracle see a `TraceStep` carrying what they read from a DraftStep; the
classifier gets its full feature vector from its own `WindowState`, so the window features
(window_pos, window_prob_prod, prev_accepted, the target-side signals) are those of the simulated
policy's windows, not the oracle's windows stored in the trace. A policy's `drafts()` is asked
before each round, and `update` gets the target-side signals of the position where the round's
own target token lands (trace.signals_at), as the live loop computes them.

Approximations (the only places a simulated run can differ from a real greedy run):

1. Drafting past a mismatch. Once a window holds a draft token != y, the real draft
   continues from its own (wrong) token, but the trace only has rows teacher-forced on y.
   We reuse those rows. Those tokens cost draft forwards and are rejected whatever they are
   (acceptance stops at the first mismatch), so committed tokens, target forwards, accepted
   lengths and the policy's state updates are exact; only the policy's decision of *when to
   stop* after the mismatch is approximate, i.e. the draft forward count and window sizes
   (hence the verification cost) of such windows. `SimResult.approx_drafts` counts these
   tokens; a policy that never drafts past a mismatch (oracle, or any window that stops in
   time) is simulated exactly. Constant and heuristic do not read features: always exact.
2. Drafting past EOS. When y ended with EOS before max_new_tokens, a real window that
   reaches EOS may draft further tokens that are then discarded; the trace has no rows
   there, so the simulated window ends at y's last position (at most once per prompt).
3. A budget's trim (loop_budget.py, greedy). Its verified width B* reads the confidence of every drafted
   position, so one computed from the rows of 1 after a mismatch can differ from the live one, and with it the
   accepted run where B* falls short of the mismatch (a draft reading only its position is replayed exactly).

Sampled traces (`disco collect --temperature`, collect.coupled_draft) are one realisation of the
live loop's randomness: a replay follows their sampled labels, which gives a sampled run (the
check: its counts average to the live loop's). With `expected=True` (prompt_traces) the path still
follows the sampled labels (they decide where windows end and what the policy learns in `update`),
but each window counts the *expected* number of accepted tokens given its drafted tokens, the
product rule of sequential acceptance, sum_m prod_{i<=m} min(1, p(x_i)/q(x_i)): the same mean,
with the noise of the accept/reject draws removed (what tuning uses).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from disco.base.defaults import DEFAULT_MAX_WINDOW
from disco.base.errors import DiscoError
from disco.base.settings import check_setting
from disco.core.cost import CostModel
from disco.core.features import TOKEN_FEATURES
from disco.core.stats import GenStats
from disco.formats.trace import HIDDEN_COLUMN, signals_at
from disco.policies.acceptance_estimator import OnlineAcceptanceEstimator
from disco.policies.batch_policy import Batch, BatchPolicy, RequestState, never_drafts, verified
from disco.policies.policy import StoppingPolicy
from disco.policies.policy_registry import BuildContext, PolicySpec, as_spec
from disco.policies.rounds import Decisions, draft_window, end_round, leading_run, verified_count, window_limit
from disco.policies.verify_budget import ClassifierConfidence, LearnedBudget

if TYPE_CHECKING:
    import pandas as pd

# Columns the simulator reads (the trainer needs more: FEATURES and oracle_drafted).
SIM_COLUMNS = ("prompt_id", "gen_pos", "label", "draft_token", "target_token", *TOKEN_FEATURES)
_P_CHOSEN = TOKEN_FEATURES.index("p_chosen")
_ENTROPY = TOKEN_FEATURES.index("entropy")
_P_TOP1 = TOKEN_FEATURES.index("p_top1")
# The target-side signal columns (disco-trace/2); older traces lack them and get neutral values, so
# only models that do not read the signals can be trained on them (train.py checks). disco-trace/2
# lacks target_prob_target and gives target_top1, the same number under greedy decoding.
SIGNAL_COLUMNS = ("target_prob_target", "target_entropy", "draft_prob_target")


def signal_columns(df: pd.DataFrame) -> list[str] | None:
    """The columns that hold SIGNAL_COLUMNS in these traces (None: they have no target-side signals: older
    traces lack the columns, traces of an engine that does not show the target's distribution hold NaN there)."""
    cols = [c if c in df.columns or c != "target_prob_target" else "target_top1" for c in SIGNAL_COLUMNS]
    if not all(c in df.columns for c in cols) or df[cols].isna().to_numpy().any():
        return None
    return cols


# --- traces ----------------------------------------------------------------------------------


@dataclass
class PromptTrace:
    """One prompt's trace rows, as arrays the replay indexes by gen_pos."""

    prompt_id: str
    labels: np.ndarray  # (L,) bool: the draft's token at j equals y_j
    draft_tokens: list[int]  # the draft's greedy token at each position (teacher-forced)
    target_tokens: list[int]  # y, the target's greedy continuation (ends with EOS if it stopped early)
    token_feats: torch.Tensor  # (L, len(TOKEN_FEATURES)) float32, as features.token_features computes them
    max_new_tokens: int  # the generation budget; more than L when y ended at EOS
    signal_cols: np.ndarray | None = None  # (L, 3) SIGNAL_COLUMNS; None: neutral signals (old traces)
    hidden: torch.Tensor | None = None  # (L, H) float32 draft hidden states; None when the trace has none
    accept_probs: np.ndarray | None = None  # (L,) min(1, p/q) of each drafted token: count expected acceptance

    def __len__(self) -> int:
        return len(self.labels)

    def signals(self, j: int, rejected: bool):
        """What the target said at position j, where a window's own target token landed."""
        if self.signal_cols is None:
            return None
        return signals_at(*self.signal_cols[j], rejected)


def check_columns(df: pd.DataFrame, needed: Sequence[str], what: str = "the simulator") -> None:
    missing = [c for c in needed if c not in df.columns]
    if missing:
        shown = ", ".join(missing[:6]) + (f", … ({len(missing)} in all)" if len(missing) > 6 else "")
        raise DiscoError(f"the traces lack columns {what} needs: {shown}; recollect them with this disco version")


def prompt_traces(
    df: pd.DataFrame, max_new_tokens: int | None = None, with_hidden: bool = True, expected: bool = False
) -> list[PromptTrace]:
    """Split trace rows into per-prompt traces (in order of first appearance).

    max_new_tokens: the budget the traces were collected with (from their manifest). None:
    each prompt's length, i.e. y was cut by the budget, not by EOS. A smaller budget than a
    prompt's length simulates a shorter generation (y's prefix is still the greedy output).
    with_hidden: also decode the draft's hidden states (for a model that reads them).
    expected: count each window's expected accepted tokens (sampled traces only; module docstring)."""
    check_columns(df, SIM_COLUMNS)
    traces = []
    for pid, rows in df.groupby("prompt_id", sort=False):
        rows = rows.sort_values("gen_pos", kind="stable")
        pos = rows["gen_pos"].to_numpy()
        if not np.array_equal(pos, np.arange(len(rows))):
            raise DiscoError(
                f"prompt {pid!r}: gen_pos is not 0, 1, …, {len(rows) - 1} (rows duplicated or missing: "
                "the same prompt in two trace sets, or a damaged shard)"
            )
        budget = max_new_tokens if max_new_tokens is not None else len(rows)
        n = min(len(rows), budget)
        signals = signal_columns(rows)
        hidden = None
        if with_hidden and HIDDEN_COLUMN in rows.columns:
            blob = b"".join(rows[HIDDEN_COLUMN].to_numpy()[:n])
            hidden = torch.from_numpy(np.frombuffer(blob, np.float16).reshape(n, -1).astype(np.float32))
        traces.append(
            PromptTrace(
                prompt_id=str(pid),
                labels=rows["label"].to_numpy()[:n].astype(bool),
                draft_tokens=rows["draft_token"].to_numpy()[:n].astype(int).tolist(),
                target_tokens=rows["target_token"].to_numpy()[:n].astype(int).tolist(),
                token_feats=torch.tensor(rows[list(TOKEN_FEATURES)].to_numpy()[:n], dtype=torch.float32),
                max_new_tokens=budget,
                signal_cols=rows[signals].to_numpy(np.float64)[:n] if signals else None,
                hidden=hidden,
                accept_probs=rows["accept_prob"].to_numpy(np.float64)[:n] if expected else None,
            )
        )
    return traces


# --- replay ----------------------------------------------------------------------------------


@dataclass
class TraceStep:
    """The part of a policy.DraftStep that the trace can supply: what constant, heuristic, threshold,
    AdaEDL, SVIP, oracle, the classifier and the budget policies (loop_budget.py) read. A policy reading more (logits, context) fails loudly here."""

    token: int  # the draft's token (teacher-forced)
    window_pos: int  # 1-based index in the simulated window
    gen_pos: int  # index in the continuation
    probs: dict[int, float]  # {token: p_chosen}: the only entry of the draft distribution a threshold reads
    entropy_nats: float  # the draft distribution's entropy (what AdaEDL and SVIP read)
    feats: torch.Tensor  # (len(TOKEN_FEATURES),) the token's features as the trace holds them (the classifier)
    hidden: torch.Tensor | None = None  # the draft's (stored, projected) hidden state, if the trace has it

    def entropy(self) -> float:
        return self.entropy_nats

    def top1(self) -> float:
        return float(self.feats[_P_TOP1])

    def token_features(self, token_classes: torch.Tensor | None = None) -> torch.Tensor:
        return self.feats


PolicyFactory = Callable[[PromptTrace], StoppingPolicy]  # a fresh policy per prompt, as generate() builds


def replay_policy(
    spec: PolicySpec | str,
    *,
    model=None,
    cost: CostModel | None = None,
    max_window: int = DEFAULT_MAX_WINDOW,
    **knobs: Any,
) -> PolicyFactory:
    """A factory of the real policy `spec` (policy_registry.POLICIES) for each prompt (the oracle gets the trace's y);
    `replay_policy(name, **knobs)` is short for `replay_policy(PolicySpec(name, **knobs))`.
    classifier: `model` is a Predictor (artifact.py), the spec's classifier_setting its rule's setting."""
    spec = as_spec(spec, knobs)
    if spec.name == "classifier" and model is None:
        raise DiscoError("simulating the classifier policy needs a trained model")
    return lambda tr: spec.kind.build(spec, BuildContext(tr.target_tokens, None, max_window, None, model, cost))


# A replay yields a classifier's full feature vector whenever it needs P(accept), and gets the
# probability back: the driver batches those requests across prompts (and policies, e.g. every
# candidate threshold), since one LightGBM call costs ~80 us for one row but ~7 us a row in a batch.
Replay = Generator[torch.Tensor, float, tuple[GenStats, int]]


class _TraceDrafter:
    """The trace's side of a replayed round: the steps a policy decides on, teacher-forced rows of y."""

    def __init__(self, tr: PromptTrace) -> None:
        self.tr = tr
        self.p_chosen = tr.token_feats[:, _P_CHOSEN].tolist()
        self.entropy = tr.token_feats[:, _ENTROPY].tolist()
        self.approx = 0  # drafts simulated from teacher-forced rows after a mismatch (approximation 1)
        self.begin(0)

    def begin(self, out: int) -> None:
        self.out, self.mismatch = out, False

    def propose(self, pos: int) -> TraceStep | None:
        tr, j = self.tr, self.out + pos - 1
        if j >= len(tr):  # past y's EOS: no rows (approximation 2)
            return None
        self.approx += self.mismatch
        self.mismatch = self.mismatch or not tr.labels[j]
        token = tr.draft_tokens[j]
        return TraceStep(
            token,
            pos,
            j,
            {token: self.p_chosen[j]},
            self.entropy[j],
            tr.token_feats[j],
            tr.hidden[j] if tr.hidden is not None else None,
        )


def _replay(tr: PromptTrace, policy: StoppingPolicy, max_window: int) -> Replay:
    """One prompt under one policy, round by round as the live loop runs it (rounds.py): returns (stats as
    the real loop counts them, approx_drafts)."""
    stats, out, L, drafter = GenStats(), 0, len(tr), _TraceDrafter(tr)
    tokens: float = 0  # committed tokens as counted: out, or their expectation (PromptTrace.accept_probs)
    while out < L:
        # 1. Draft: up to k_max tokens, the policy deciding after each one.
        drafter.begin(out)
        decisions: Decisions = draft_window(
            policy, window_limit(max_window, tr.max_new_tokens, out), drafter.propose, stats
        )
        k = yield from decisions
        v = verified_count(policy, k)  # the first v drafts go to verification (a budget policy trims)
        # 2-3. Verify and accept: the leading agreeing run, then the target's own token.
        n = leading_run(tr.labels[out : out + v])
        counted = n if tr.accept_probs is None else float(np.cumprod(tr.accept_probs[out : out + v]).sum())
        # 4. Commit n + 1 tokens; y's last position is EOS or the budget's end.
        tokens += min(counted + 1, L - out)
        out += min(n + 1, L - out)
        # 5. Record: the target-side signals where the round's own target token landed.
        end = out - 1
        end_round(policy, stats, k, n, lambda: tr.signals(end, n < v), counted, verified=v)
    stats.new_tokens = tokens
    return stats, drafter.approx


def _drive(lanes: list[tuple[Replay, object]], progress: bool = False) -> list[tuple[GenStats, int]]:
    """Run replays in lockstep; each round, answer all pending P(accept) requests of lanes that
    share a model with one batched predict_proba call. lanes: (replay, model or None)."""
    from tqdm.auto import tqdm

    results: list = [None] * len(lanes)
    pending: dict[int, torch.Tensor] = {}

    def advance(i: int, value: float | None) -> None:
        try:
            pending[i] = lanes[i][0].send(value)
        except StopIteration as done:
            results[i] = done.value
            pending.pop(i, None)

    for i in range(len(lanes)):
        advance(i, None)
    with tqdm(desc="simulating", unit="decision", disable=not progress or not pending, leave=False) as bar:
        while pending:
            by_model: dict[int, list[int]] = {}
            for i in pending:
                by_model.setdefault(id(lanes[i][1]), []).append(i)
            for ids in by_model.values():
                X = torch.stack([pending[i] for i in ids]).numpy()
                probs = lanes[ids[0]][1].predict_proba(X)
                for i, p in zip(ids, probs):
                    advance(i, float(p))
                bar.update(len(ids))
    return results


@dataclass
class SimResult:
    """One policy replayed over a set of prompts."""

    stats: list[GenStats]  # per prompt, in trace order; counted exactly as decode.GenStats
    approx_drafts: int = 0  # drafted tokens simulated from teacher-forced rows after a mismatch
    totals: GenStats = field(init=False)  # all prompts summed

    def __post_init__(self) -> None:
        t = GenStats()
        for s in self.stats:
            t.new_tokens += s.new_tokens
            t.target_forwards += s.target_forwards
            t.draft_forwards += s.draft_forwards
            t.drafted += s.drafted
            t.accepted += s.accepted
            t.windows += s.windows
            t.accepted_per_window += s.accepted_per_window
        self.totals = t

    def speedup(self, cost: CostModel) -> float:
        """Cost-model speedup over target-only decoding (ratio of total times over all prompts)."""
        time = sum(cost.time(s) for s in self.stats)
        return sum(cost.baseline(s) for s in self.stats) / time if time > 0 else 1.0

    def summary(self, cost: CostModel) -> dict:
        t = self.totals
        tokens = max(t.new_tokens, 1)
        return {
            "speedup": self.speedup(cost),
            "target_forwards_per_token": t.target_forwards / tokens,
            "draft_forwards_per_token": t.draft_forwards / tokens,
            "mean_accepted": t.accepted / len(t.windows) if t.windows else 0.0,
            "mean_window": t.drafted / len(t.windows) if t.windows else 0.0,
            "approx_drafts": self.approx_drafts / max(t.draft_forwards, 1),  # share of drafts
        }


def simulate_many(
    traces: Sequence[PromptTrace],
    factories: dict[Hashable, PolicyFactory],
    max_window: int = DEFAULT_MAX_WINDOW,
    progress: bool = False,
) -> dict[Hashable, SimResult]:
    """Replay several policies over the same prompts in one batched pass."""
    check_setting("max_window", max_window)
    lanes, keys = [], []
    for name, factory in factories.items():
        for tr in traces:
            policy = factory(tr)
            lanes.append((_replay(tr, policy, max_window), getattr(policy, "model", None)))
            keys.append(name)
    results = _drive(lanes, progress)
    out: dict[Hashable, SimResult] = {}
    for name in factories:
        mine = [r for key, r in zip(keys, results) if key == name]
        out[name] = SimResult([s for s, _ in mine], sum(a for _, a in mine))
    return out


def simulate(
    traces: Sequence[PromptTrace], factory: PolicyFactory, max_window: int = DEFAULT_MAX_WINDOW, progress: bool = False
) -> SimResult:
    """Replay one policy (a fresh instance per prompt) over the traces."""
    return simulate_many(traces, {"policy": factory}, max_window, progress)["policy"]


# --- vLLM's batched draft, in lockstep ---------------------------------------------------------


@dataclass
class BatchedRun:
    """A batched policy replayed in lockstep at one concurrency (simulate_batched)."""

    tokens: int  # committed tokens, all prompts
    seconds: float  # the load profile's time of every step
    steps: int  # batched steps (one target verification each)
    positions: int  # batched draft positions run (vLLM's catch-up pass included)
    drafted: int  # draft tokens handed to verification
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def simulate_batched(
    traces: Sequence[PromptTrace],
    policy: BatchPolicy | None,
    load: CostModel,
    batch: int,
    max_window: int = DEFAULT_MAX_WINDOW,
) -> BatchedRun:
    """vLLM's draft_model decoding of the traces' prompts, `batch` at a time, as vllm/draft.py runs it:
    continuous batching (a finished prompt's place goes to the next one); each step the policy's drafts()
    and start(), then one batched draft position after another with stops() on every drafting request's
    trace features, until none drafts on or max_window; each request accepts the leading run of its labels
    and commits one more token. Costs (docs/architecture.md, "vLLM's own draft"): a step runs at least one
    draft position, vLLM's catch-up pass (none when `policy` is None, target-only with no draft configured, or
    never drafts: batch_policy.never_drafts), each costing load.c_draft at the step's batch size; verification
    costs c_step(sum of k_i + 1).
    RequestState.request_id is the prompt's index and its stats.new_tokens its committed tokens, so a
    policy may look at the trace (an oracle bound). Approximation 1 of the module docstring applies."""
    check_setting("max_window", max_window)
    if not load.c_step or not load.c_draft:
        raise DiscoError(f"the load profile ({load.source}) has no batched costs: profile with --engine vllm")
    if policy is not None and never_drafts(policy, load, batch, max_window):
        policy = None  # target-only: the proposer skips vLLM's draft loop, its catch-up pass too
    queue, active = list(range(len(traces))), []
    run = BatchedRun(0, 0.0, 0, 0, 0, 0)
    while queue or active:
        while len(active) < batch and queue:
            active.append(RequestState(str(queue.pop(0))))
        n = len(active)
        trs = [traces[int(s.request_id)] for s in active]
        room = torch.tensor([len(tr) - int(s.stats.new_tokens) - 1 for tr, s in zip(trs, active)])
        positions, drafted = 0, torch.zeros(n, dtype=torch.long)
        if policy is not None:
            view = Batch.under(active, load, max_window)
            live = policy.drafts(view).cpu() & (room > 0)
            policy.start(view, torch.device("cpu"))
            while bool(live.any()) and positions < max_window:
                positions += 1
                rows = [int(s.stats.new_tokens) + min(positions, int(r)) - 1 for s, r in zip(active, room.clamp(1))]
                feats = torch.stack([tr.token_feats[j] for tr, j in zip(trs, rows)])
                stop = policy.stops(positions, feats, feats[:, _P_CHOSEN], live).cpu()
                drafted = torch.where(live, positions, drafted)
                live = live & ~stop & (room > positions)
            if positions:  # what goes to verification (batch_policy.verified: a budget policy's trim)
                drafted = verified(policy, drafted).cpu()
            run.seconds += float(load.draft_position(n)) * max(positions, 1)  # (c_draft: checked above)
        run.seconds += load.c_step[min(int(drafted.sum()) + n, len(load.c_step)) - 1]
        run.steps, run.positions = run.steps + 1, run.positions + max(positions, policy is not None)
        for s, tr, k in zip(active, trs, drafted.tolist()):
            out = int(s.stats.new_tokens)
            a = leading_run(tr.labels[out : out + k])
            if k and policy is not None:
                policy.update(s, k, a)
                s.stats.record_window(k, a)
            s.stats.new_tokens += a + 1
            run.tokens, run.drafted, run.accepted = run.tokens + a + 1, run.drafted + k, run.accepted + a
        active = [s for s, tr in zip(active, trs) if s.stats.new_tokens < len(tr)]
    return run


# --- vLLM's adaptive verification, in lockstep ----------------------------------------------------


@dataclass
class AdaptiveRun(BatchedRun):
    """A run of simulate_adaptive_verification: BatchedRun's counts (drafted: the draft tokens verified) and the
    draft tokens proposed, verified or not."""

    proposed: int = 0


_P_TOP1 = TOKEN_FEATURES.index("p_top1")


def simulate_adaptive_verification(
    traces: Sequence[PromptTrace],
    load: CostModel,
    batch: int,
    k: int,
    confidence: str | OnlineAcceptanceEstimator | ClassifierConfidence = "online",
    *,
    stop_drafting: bool = False,
    stale_budget: bool | None = None,
) -> AdaptiveRun:
    """vLLM 0.32's adaptive verification of the traces' prompts, `batch` at a time (continuous batching, as
    simulate_batched), in lockstep (adaptive_verification.py, module docstring):

    each step every request drafts k positions (one batched draft forward each, load.c_draft at the step's batch
    size); each slot gets a confidence; the budget B* = argmax of expected tokens over the cost tables, the B*
    slots of highest survival are verified (c_step(sum admitted + b)); each request accepts the leading run of its
    labels within its admitted slots and commits one more token. A request's slots are its first min(k, tokens
    left - 1) positions (past y's end there are no rows: approximation 2 of the module docstring).

    confidence: "online" (a fresh acceptance_estimator.OnlineAcceptanceEstimator: vLLM's anchor, from the trace's
    p_top1, refitted from the verdicts on its schedule), an estimator of your own (kept as it ends), "oracle"
    (each slot's label: the bound of verifying the best slots of a k-position draft), or disco's classifier
    (verify_budget.ClassifierConfidence). stale_budget: B* from each request's confidences of the
    previous step (1.0 for a new request), as vLLM's `get_num_tokens` reads them; default: for the online
    estimator only. stop_drafting: disco's draft stopping (verify_budget.LearnedBudget: requests stop
    when their survival no longer pays, the batch when no request drafts on; at least one position, vLLM's
    catch-up pass, is charged)."""
    check_setting("max_window", k)
    if not load.c_step or not load.c_draft:
        raise DiscoError(f"the load profile ({load.source}) has no batched costs: profile with --engine vllm")
    estimator = OnlineAcceptanceEstimator(k, len(traces)) if confidence == "online" else confidence
    online = isinstance(estimator, OnlineAcceptanceEstimator)
    stale = online if stale_budget is None else stale_budget
    learned = LearnedBudget(load, k, stop_drafting)
    queue, active = list(range(len(traces))), []
    previous: dict[str, torch.Tensor] = {}  # each request's confidences of its last step (stale budget)
    run = AdaptiveRun(0, 0.0, 0, 0, 0, 0)
    while queue or active:
        while len(active) < batch and queue:
            active.append(RequestState(str(queue.pop(0))))
            previous[active[-1].request_id] = torch.ones(k)
        n = len(active)
        trs = [traces[int(s.request_id)] for s in active]
        slots = torch.tensor([int(s.request_id) for s in active])
        room = torch.tensor([len(tr) - int(s.stats.new_tokens) - 1 for tr, s in zip(trs, active)])
        capacities = room.clamp(0, k)
        if isinstance(estimator, ClassifierConfidence):
            estimator.start(active, torch.device("cpu"))
        learned.start(capacities)
        positions = 0
        for pos in range(1, k + 1):
            rows = [int(s.stats.new_tokens) + min(pos, max(int(r), 1)) - 1 for s, r in zip(active, room)]
            feats = torch.stack([tr.token_feats[j] for tr, j in zip(trs, rows)])
            if online:
                p = estimator.predict(feats[:, _P_TOP1], pos - 1, slots)
            elif confidence == "oracle":
                p = torch.tensor([float(tr.labels[j]) for tr, j in zip(trs, rows)])
            else:
                p = estimator(pos, feats)
            positions = pos
            live = learned.after_position(pos, p)
            if stop_drafting and not bool(live.any()):
                break
        budget_conf = torch.stack([previous[s.request_id] for s in active]) if stale else None
        counts = learned.select(budget_conf)
        for s, row in zip(active, learned.conf):
            previous[s.request_id] = row.clone()
        admitted = counts.tolist()
        run.seconds += float(load.draft_position(n)) * max(positions, 1)
        run.seconds += load.c_step[min(sum(admitted) + n, len(load.c_step)) - 1]
        run.steps, run.positions = run.steps + 1, run.positions + max(positions, 1)
        run.proposed += int(learned.drafted.sum())
        accepted = []
        for s, tr, a_k in zip(active, trs, admitted):
            out = int(s.stats.new_tokens)
            a = leading_run(tr.labels[out : out + a_k])
            accepted.append(a)
            if a_k:
                s.stats.record_window(a_k, a)
            if isinstance(estimator, ClassifierConfidence):
                estimator.update(s, a_k, a)
            s.stats.new_tokens += a + 1
            run.tokens, run.drafted, run.accepted = run.tokens + a + 1, run.drafted + a_k, run.accepted + a
        if online:
            estimator.step(torch.tensor(accepted), counts, slots)
        active = [s for s, tr in zip(active, trs) if s.stats.new_tokens < len(tr)]
    return run
