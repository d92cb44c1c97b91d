"""A running cost table measured where the decision runs (docs/architecture.md, "Closed loop").

An offline profile (`disco profile`) is a property of one machine, thread layout, process structure and engine
setting; the serving process is the truth. It times its own steps and feeds them here:

    observe_step(tokens, seconds)   one target step over `tokens` tokens in all (the batch's requests together)
    observe_draft(batch, seconds)   one batched draft position for `batch` requests
    observe_first(batch, seconds)   a decode step's first draft position for `batch` requests (vLLM's catch-up
                                    forward, with the proposer's own work: what drafting at all costs a step)
    observe_plain(batch, seconds)   a target step of `batch` requests that verified no draft (`batch` tokens):
                                    target-only's own step at that batch, every speedup's reference

and asks `cost_model()` for a CostModel (c_step, c_draft, c_d, c_t) the cost rules read as they read a profile
(`at_load` works on it).

How a bucket's cost is estimated (one rule for target steps by tokens and draft positions by batch size):
- prior shape: the seed's (an offline profile: c_step / c_draft, or c_t for a batch-of-one profile), else the
  default cost model's linear-in-tokens one (cost.CostModel.default, in units of a target step), a draft position
  by batch size shaped like a target step by tokens; extended linearly past what the seed covers;
- the measurements correct the prior by a ratio, in log. A bucket's own ratio is the median of its last
  ONLINE_COST_WINDOW observations, from its third on (decode steps are noisy, ±15 %, and some are far off: a page
  fault, a first use of a shape; a median ignores anything short of half its window); it is pooled with its
  neighbours' (sizes within ~10 %, by their counts) and with the global ratio (the median log(seconds / prior) of
  the kind's last observations, whatever their bucket) at two observations' worth; the buckets in between take
  the ratio interpolated, those past the observed sizes the nearest one's (target steps: never less than the
  measured trend continued, a line fitted to the upper observed sizes' medians), and with no bucket at three
  observations yet every bucket takes the global ratio. So a seed wrong by any factor (×3 from another machine,
  ×⅓ from an in-process profile) is corrected in every bucket, observed or not, at the first observation of each
  kind, and keeps only its shape; a kind with no observation yet (no draft position timed) takes the other kind's
  global ratio (the seed's draft-to-target proportion holds until measured). Measured with ±15 % noise
  (tests/test_closed_loop.py): within 15 % of the truth in every bucket after one step, within 10 % after 20;
- a prior shape this process refutes is replaced: once a kind has two sizes timed three times each, the larger at
  least twice the smaller, and their measured cost ratio is off the prior's by more than SEED_SHAPE_TOLERANCE either
  way, that kind's prior becomes the line through its timed sizes' medians (weighted least squares, never
  decreasing): a seed from another process (an AVX2 CPU's bf16 step grows 8x from 1 to 9 tokens where this one's
  is flat), or the default's shallow shape on a CPU whose step is compute-bound (a Zen 4's `vllm serve` worker:
  40 tokens cost 2.7x 8 tokens there, the default says 1.6x; shrunk toward its global ratio, the table put the
  widest steps 15-20 % too cheap and the governor chose k = 3 at 8 requests where it ran 0.83x target-only:
  bench/results/closed-loop.md, "2026-12-04, fifth sweep"). A seed refuted in one kind is dropped from both (the
  other takes the default's shape, until its own timings refute that too), and `say` tells the process why, once.
  Past the timed sizes the refuted shape would otherwise price what no step has timed;
- monotone: a step over more tokens (a position over more rows) never costs less (stages.step_costs's reason:
  noise must not make an extra token look free to the cost rules), so the table is made non-decreasing by
  weighted isotonic regression (pool adjacent violators; observed buckets weigh their observation count,
  unobserved ones almost nothing); except a bump, a timed bucket slower than a larger timed one by more than
  ONLINE_COST_BUMP and by more than ONLINE_COST_BUMP_SE standard errors of the two medians' difference (the noise
  measured as the buckets' median absolute deviation): a shape this process measured (a CPU kernel slower over 2
  tokens than over 4), kept as measured, and the others fitted without it (its weight would lift its neighbours).

Target-only's step at b requests (c_step(b), every speedup's reference: the governor's, the cost rules' rate of a
target-only step) is the median of its own last ONLINE_COST_WINDOW timings at that batch wherever it was timed three
times (closed_loop times it where nothing else does: a band's k = 0 probes), not the fitted bucket of b tokens:
that bucket pools steps of fewer requests and longer windows, and its fit leans on its neighbours and the prior's
shape (at 4 chat requests on a Zen 4 it priced target-only's 0.157 s step at 0.178-0.211 s, and the policy at 0.8x
target-only was judged 1.09-1.18x: bench/results/closed-loop.md, "2026-12-07, fourteenth sweep").

Memory is fixed (a (buckets, window) ring per kind); observe_* is O(1); the cost model is rebuilt after 1, 2, 4,
8, ... observations, then every ONLINE_COST_REBUILD (numpy over the buckets: ~1 ms on a 2-core CPU for 8 requests
x 21 tokens, so ~0.1 ms a step at a step and a few draft positions timed each), and the same CostModel object is
handed out in between (CostModel.at_load caches its views by it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from disco.base.defaults import (
    ONLINE_COST_BUMP,
    ONLINE_COST_BUMP_SE,
    ONLINE_COST_REBUILD,
    ONLINE_COST_WARMUP,
    ONLINE_COST_WINDOW,
    SEED_SHAPE_TOLERANCE,
)
from disco.core.cost import CostModel

_UNSEEN_WEIGHT = 1e-3  # an unobserved bucket's weight in the isotonic fit: the measured ones decide


def _extend(values: tuple[float, ...] | list[float], n: int) -> np.ndarray:
    """values[0 .. n-1], continued past its end along the straight line through its first and last entries (a
    cost grows at most linearly with the tokens once compute-bound; never downwards)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) >= n:
        return v[:n].copy()
    slope = max(0.0, (v[-1] - v[0]) / (len(v) - 1)) if len(v) > 1 else 0.0
    extra = v[-1] + slope * np.arange(1, n - len(v) + 1)
    return np.concatenate([v, extra])


def _isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of y (pool adjacent violators)."""
    means: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for v, wt in zip(y.tolist(), w.tolist()):
        means.append(v)
        weights.append(wt)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, s2 = means.pop(), weights.pop(), sizes.pop()
            total = weights[-1] + w2
            means[-1] = (means[-1] * weights[-1] + m2 * w2) / total
            weights[-1] = total
            sizes[-1] += s2
    return np.repeat(np.asarray(means), sizes)


def _median(ring: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Each row's median of its n valid values (NaN past them; np.nanmedian is ~10x slower)."""
    ordered = np.sort(ring, axis=1)  # NaN last
    lo = np.take_along_axis(ordered, ((n - 1) // 2)[:, None], 1)[:, 0]
    hi = np.take_along_axis(ordered, (n // 2)[:, None], 1)[:, 0]
    return 0.5 * (lo + hi)


@dataclass
class CostTable:
    """One kind of cost (target steps by tokens, or draft positions by batch size): bucket i is size i + 1."""

    prior: np.ndarray  # (n,) the prior shape, > 0
    window: int = ONLINE_COST_WINDOW
    shrink: float = 2.0  # observations' worth of the global ratio in a bucket's estimate
    bandwidth: float = 0.1  # the neighbourhood a bucket's estimate pools, in log size (~10 % more or fewer tokens)
    # sizes past the observed ones follow the measured trend if steeper than the prior's: target steps by tokens
    # (the windows reach past the probed widths; draft positions by batch are timed at every band's probes)
    trend: bool = False
    ring: np.ndarray = field(init=False)  # (n, window) the last observations of each bucket, NaN where none yet
    # the last observations of any bucket (bucket, seconds): the global correction, log(seconds / prior) against
    # the prior of the moment (a dropped seed's shape is replaced under them)
    recent: np.ndarray = field(init=False)
    recent_at: np.ndarray = field(init=False)
    count: np.ndarray = field(init=False)  # (n,) observations of each bucket so far
    observed: int = 0  # observations of this kind so far
    skipped: int = 0  # observations outside the table (a prefill chunk's hundreds of tokens): not decode steps

    def __post_init__(self) -> None:
        self.ring = np.full((len(self.prior), self.window), np.nan)
        self.count = np.zeros(len(self.prior), dtype=np.int64)
        self.recent = np.ones(4 * self.window + 1)
        self.recent_at = np.zeros(len(self.recent), dtype=np.int64)

    def observe(self, size: int, seconds: float) -> bool:
        """Keep one observation; True when its bucket just got its third (a size newly timed enough to judge by)."""
        i = size - 1
        if not 0 <= i < len(self.prior) or not seconds > 0:
            self.skipped += 1
            return False
        self.ring[i, self.count[i] % self.window] = seconds
        self.count[i] += 1
        self.recent[self.observed % len(self.recent)], self.recent_at[self.observed % len(self.recent)] = seconds, i
        self.observed += 1
        return bool(self.count[i] == 3)

    def log_ratio(self) -> float | None:
        """The global correction: the median log(seconds / prior) of the last observations of any bucket (None:
        none yet)."""
        n = min(self.observed, len(self.recent))
        return float(np.median(np.log(self.recent[:n] / self.prior[self.recent_at[:n]]))) if n else None

    def misfit(self) -> str | None:
        """How this process's costs refute the prior's shape (None: they don't, or too little is timed to say): the
        smallest and largest sizes timed three times, the larger at least twice the smaller, whose measured ratio
        is off the prior's by more than SEED_SHAPE_TOLERANCE either way."""
        seen = np.flatnonzero(self.count >= 3)
        if len(seen) < 2 or seen[-1] + 1 < 2 * (seen[0] + 1):
            return None
        lo, hi = int(seen[0]), int(seen[-1])
        medians = self.medians(np.array([lo, hi]))
        measured, prior = medians[1] / medians[0], self.prior[hi] / self.prior[lo]
        if abs(np.log(measured / prior)) <= np.log(SEED_SHAPE_TOLERANCE):
            return None
        return f"size {hi + 1} costs {measured:.2f}x size {lo + 1} here, {prior:.2f}x in the prior"

    def fitted_line(self) -> np.ndarray:
        """(n,) the weighted least-squares line through the medians of the sizes timed three times or more (their
        counts weigh), never decreasing, floored at half the smallest median (a cost is never 0); misfit() says
        when there are enough of them."""
        seen = np.flatnonzero(self.count >= 3)
        m = np.minimum(self.count[seen], self.window)
        y = _median(self.ring[seen], m)
        x = seen + 1.0
        xm, ym = np.average(x, weights=m), np.average(y, weights=m)
        var = float(np.sum(m * (x - xm) ** 2))
        slope = max(0.0, float(np.sum(m * (x - xm) * (y - ym))) / var) if var > 0 else 0.0
        return np.maximum(ym + slope * (np.arange(1, len(self.prior) + 1) - xm), 0.5 * float(y.min()))

    def medians(self, buckets: np.ndarray) -> np.ndarray:
        """These buckets' medians over their last `window` observations (each bucket observed at least once)."""
        return _median(self.ring[buckets], np.minimum(self.count[buckets], self.window))

    def spread(self) -> float:
        """The noise of one timing, in log: 1.4826 x the median absolute deviation of the log timings from their
        bucket's median, over the buckets timed three times or more (a normal's standard deviation, robust to the
        outliers a page fault or a first use of a shape makes)."""
        seen = np.flatnonzero(self.count >= 3)
        logs = np.log(self.ring[seen])  # (NaN past each bucket's n)
        dev = np.abs(logs - np.log(self.medians(seen))[:, None])
        return 1.4826 * float(np.median(dev[np.isfinite(dev)]))

    def estimate(self, glob: float | None, fallback_log_ratio: float | None) -> np.ndarray:
        """(n,) seconds (or the prior's units, when nothing of either kind was observed), non-decreasing but for a
        measured bump (the module docstring, "monotone"). glob: this kind's log_ratio(), fallback: the other
        kind's."""
        if glob is None:
            return self.prior * np.exp(fallback_log_ratio or 0.0)
        # a bucket speaks for itself from its third observation (the median of three outvotes one outlier, and a
        # shape's first step is often one: a first use, a compilation); before, its neighbours and the global ratio
        seen = np.flatnonzero(self.count >= 3)
        if len(seen) == 0:
            return _isotonic(self.prior * np.exp(glob), np.ones(len(self.prior)))
        m = np.minimum(self.count[seen], self.window)
        medians = _median(self.ring[seen], m)
        own = np.log(medians / self.prior[seen])
        # each observed bucket's log ratio: its neighbours' medians too (sizes within ~bandwidth of its own, by their
        # counts) and the global ratio at `shrink` observations' worth; the others' interpolated between them
        size = np.log(np.arange(1, len(self.prior) + 1))
        near = m * np.exp(-0.5 * ((size[seen][:, None] - size[seen][None, :]) / self.bandwidth) ** 2)
        ratios = (near @ own + self.shrink * glob) / (near.sum(1) + self.shrink)
        est = self.prior * np.exp(np.interp(size, size[seen], ratios))  # between them; past them the nearest's
        last = int(seen[-1])
        if self.trend and last + 1 < len(est):
            # past the largest observed size, a size costs at least what the measured trend says: the line fitted
            # to the observed medians of the upper two thirds of the observed sizes, if they span a quarter of the
            # largest (a prior shallower than this process, such as the default's, makes the tokens past the probed
            # widths look cheap to the cost rules; two neighbouring sizes' noise would make any slope)
            upper = seen >= (last + 1) / 3
            if upper.sum() >= 2 and seen[upper][-1] - seen[upper][0] >= (last + 1) / 4:  # (1 token alone: none)
                x, y, w = seen[upper].astype(np.float64), medians[upper], m[upper]
                xm, ym = np.average(x, weights=w), np.average(y, weights=w)
                slope = max(0.0, float(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2)))
                est[last + 1 :] = np.maximum(est[last + 1 :], est[last] + slope * np.arange(1, len(est) - last))
        weights = np.full(len(est), _UNSEEN_WEIGHT)
        weights[seen] = m
        # a bump: a timed bucket slower than a larger timed one by more than ONLINE_COST_BUMP and by more than
        # ONLINE_COST_BUMP_SE standard errors of the two medians' difference. That is this process's shape, not
        # noise, and keeps its own estimate; the others are made monotone without it. On a Zen 4's `vllm serve`
        # worker a target step over 2 tokens took 0.251 s and over 4 tokens 0.187 s; made monotone, 1-6 tokens were
        # pooled at 0.213 s and target-only at 4 requests priced 9-12 % slower than it ran
        # (bench/results/closed-loop.md, "2026-12-06, tenth sweep"). A bucket that kept its estimate only once timed
        # a full window (25 timings), pooled with the rest otherwise, let the warm-up's 20 steps over 2 tokens at
        # 0.240 s lift 3-6 tokens, timed at 0.157-0.175 s, to 0.211 s through a level at 4 requests, and the
        # policy, at 0.8x target-only, was judged 1.09-1.18x there ("2026-12-07, fourteenth sweep")
        se = 1.2533 * self.spread() * np.sqrt(1.0 / m[:, None] + 1.0 / m[None, :])  # (a median's SE / a mean's: 1.2533)
        slower = np.log(est[seen][:, None] / est[seen][None, :]) > np.maximum(
            np.log1p(ONLINE_COST_BUMP), ONLINE_COST_BUMP_SE * se
        )
        bump = np.zeros(len(est), dtype=bool)
        bump[seen] = np.triu(slower, 1).any(1)  # (slower than a larger size: the pairs above the diagonal)
        fitted = est.copy()
        fitted[~bump] = _isotonic(est[~bump], weights[~bump])
        return fitted


class OnlineCosts:
    """The serving process's running cost table: target steps of 1 .. max_batch x (max_window + 1) tokens, draft
    positions of 1 .. max_batch requests. seed: an offline profile (only its shape survives the first
    observations, and not even that where this process refutes it), None: the default cost model's shape (a short
    warm-up sets the scale). say: told once, if the seed's shape is dropped."""

    def __init__(
        self,
        max_batch: int,
        max_window: int,
        seed: CostModel | None = None,
        window: int = ONLINE_COST_WINDOW,
        rebuild: int = ONLINE_COST_REBUILD,
        warmup: int = ONLINE_COST_WARMUP,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.max_batch, self.max_window, self.rebuild, self.warmup = max_batch, max_window, rebuild, warmup
        self.seed, self.say = seed, say
        step_prior, draft_prior = self._priors(seed)
        self.steps = CostTable(step_prior, window, trend=True)
        self.drafts = CostTable(draft_prior, window)
        # a step's first position: the same rule on the draft positions' prior, read only by the governor (untimed:
        # the later positions' estimate). k = 1 times no later position: at 4 chat requests on a Zen 4 its steps
        # drafted for a median 0.119 s that no bucket had timed
        # (bench/results/closed-loop.md, "2026-12-07, twelfth sweep")
        self.firsts = CostTable(draft_prior, window)
        self.plain = CostTable(np.ones(max_batch), window)  # target-only's own steps by batch (only their medians read)
        self.dropped: str | None = None  # why the seed's shape was dropped (None: it holds, or there is none)
        self.fitted: set[str] = set()  # the kinds whose prior is the line through this process's own timings
        self._model: CostModel | None = None
        self._next_build = 0  # observations (both kinds) at which the cached model is rebuilt

    def _priors(self, seed: CostModel | None) -> tuple[np.ndarray, np.ndarray]:
        """The prior shapes: the seed's, or the default cost model's (a batched draft position over b rows shaped
        like a target step over b tokens, at c_d for one, where the seed times no batched position)."""
        base = seed if seed is not None else CostModel.default(self.max_window)
        step_prior = _extend(base.c_step or base.c_t, self.max_batch * (self.max_window + 1))
        if base.c_draft:
            draft_prior = _extend(base.c_draft, self.max_batch)
        else:
            draft_prior = base.c_d * step_prior[: self.max_batch] / step_prior[0]
        return np.maximum(step_prior, 1e-12), np.maximum(draft_prior, 1e-12)

    def observe_step(self, tokens: int, seconds: float) -> None:
        """One target step (verification, sampling, scheduling) over `tokens` tokens, all requests together."""
        if self.steps.observe(tokens, seconds):
            self._refute()

    def observe_draft(self, batch: int, seconds: float) -> None:
        """One batched draft position for `batch` requests."""
        if self.drafts.observe(batch, seconds):
            self._refute()

    def observe_first(self, batch: int, seconds: float) -> None:
        """A decode step's first draft position for `batch` requests, with the proposer's work around it."""
        self.firsts.observe(batch, seconds)

    def observe_plain(self, batch: int, seconds: float) -> None:
        """A target step of `batch` requests that verified no draft (also observe_step's, over `batch` tokens)."""
        if self.plain.observe(batch, seconds):
            self._next_build = 0  # (the reference at this batch is timed now: the next cost_model() has it)

    @property
    def observed(self) -> int:
        return self.steps.observed + self.drafts.observed

    @property
    def warm(self) -> bool:
        """Both kinds observed `warmup` times: the table is in this process's seconds (before, a kind may still
        be the seed's or the default's)."""
        return self.steps.observed >= self.warmup and self.drafts.observed >= self.warmup

    def cost_model(self) -> CostModel:
        """The cost model of the table now: rebuilt after 1, 2, 4, 8, ... observations, then every `rebuild`."""
        n = self.observed
        if self._model is None or n >= self._next_build:
            self._model = self._build()
            self._next_build = n + min(max(n, 1), self.rebuild)
        return self._model

    def _refute(self) -> None:
        """A prior shape this process refutes (CostTable.misfit) gives way to the line through its timings of that
        kind (CostTable.fitted_line). If it was the seed's, the seed is dropped from both kinds first (the other
        takes the default's shape unless its own timings refute that too) and `say` tells why, once. Checked
        whenever a size is newly timed three times; the next cost_model() is rebuilt."""
        tables = (("target steps", self.steps), ("draft positions", self.drafts))
        why = next((f"{kind}: {m}" for kind, table in tables if (m := table.misfit()) is not None), None)
        if why is None:
            return
        if self.seed is not None and self.dropped is None:
            self.dropped = why
            self.steps.prior, self.drafts.prior = self._priors(None)
            if self.say is not None:
                self.say(
                    f"the profile's cost shape does not fit this process ({why.replace('the prior', 'the profile')}):"
                    " its costs are dropped for this process's own timings"
                )
        for kind, table in tables:
            if table.misfit() is not None:
                table.prior = table.fitted_line()
                self.fitted.add(kind)
        self.firsts.prior = self.drafts.prior  # (a step's first position is shaped by batch as the later ones)
        self._next_build = 0

    def _build(self) -> CostModel:
        step_ratio, draft_ratio = self.steps.log_ratio(), self.drafts.log_ratio()
        c_step = self.steps.estimate(step_ratio, draft_ratio)
        plain = np.flatnonzero(self.plain.count >= 3)  # target-only's step as timed at its batch (the docstring)
        c_step[plain] = self.plain.medians(plain)
        c_draft = self.drafts.estimate(draft_ratio, step_ratio)
        first_ratio = self.firsts.log_ratio()
        c_first = self.firsts.estimate(first_ratio, draft_ratio) if first_ratio is not None else c_draft
        dropped = "; the profile's shape dropped" if self.dropped else ""
        dropped += "".join(f"; {kind}' shape fitted here" for kind in sorted(self.fitted))
        source = f"online ({self.steps.observed} steps, {self.drafts.observed} draft positions timed{dropped})"
        return CostModel(
            float(c_draft[0]),
            tuple(float(x) for x in c_step[: self.max_window + 1]),
            source,
            tuple(float(x) for x in c_step),
            tuple(float(x) for x in c_draft),
            tuple(float(x) for x in c_first),
        )
