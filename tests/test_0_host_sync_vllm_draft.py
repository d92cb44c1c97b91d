"""disco's policy on vLLM's own draft (disco/vllm/draft.py) reads the draft's device at most once per draft position
and once per step (issue 44; docs/architecture.md, "vLLM's own draft"), and keeps each request's context there.

On a GPU, reading a device tensor into host values (.tolist(), .item(), .cpu(), .numpy(), bool(), int(), float(),
an `if t.any()`) waits for all the work queued before it, and vLLM's padded drafter path is written to make no such
wait. On a CPU nothing waits, so this test marks what would lie on the draft's device (DeviceMarks: vLLM's tensors
there, tensors made with device=, and whatever is computed from them) and counts the reads of marked tensors (and
the host data copied into them) while a stand-in for vLLM (its draft loop, model, runner and bookkeeping: `World`)
runs steps of the proposer's own code. `python tests/test_0_host_sync_vllm_draft.py` prints the counts per step
(bench/results/decision-cost.md, "2026-12-03: host waits of the decision on vLLM's draft").

Named to run first in the suite's worker process: once a real vLLM instance has run in a process (tests/test_vllm*.py,
test_collect_vllm.py), the stand-in's marking of device tensors miscounts (seen in the full suite, not found why),
so this file must run before any of them."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from disco.base.defaults import ONLINE_COST_REBUILD
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TOKEN_CLASSES, assemble_token_features, batch_logit_distribution
from disco.online.closed_loop import ClosedLoop
from disco.policies.artifact import DenseModel
from disco.policies.batch_policy import Batch, BatchClassifier, BatchTarget, BatchThreshold, RequestState
from disco.vllm.draft import _calibrated, _DiscoDraft

DEVICE = torch.device("cpu")  # "the draft's device" (this object: DeviceMarks tells it from a host tensor's)
V = 48  # the stand-in draft's vocabulary
K = 8  # vLLM's num_speculative_tokens

_READS = {
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__bool__,
    torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__array__,
}  # fmt: skip
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
_DEVICE_OF = torch._C.TensorBase.device


def _tensors(*values: Any) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _tensors(*v)
        elif isinstance(v, dict):
            out += _tensors(*v.values())
    return out


def _on_device(t: torch.Tensor) -> bool:
    return getattr(t, "_on_draft_device", False)


class DeviceMarks(TorchFunctionMode):
    """Marks the tensors that would lie on the draft's device (made with device=DEVICE, or computed from marked
    ones); counts, while `counting`, the reads of marked tensors into host values (d2h: each a wait on a GPU) and
    the host data brought into them (h2d: a copy, or on a GPU a device mismatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.d2h = self.h2d = 0
        self.where: list[str] = []  # where each counted read was made (file:line), for a failing assertion

    def mark(self, t: torch.Tensor) -> torch.Tensor:
        t._on_draft_device = True  # type: ignore[attr-defined]
        return t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_OF:  # t.device: DEVICE itself for a marked tensor
            return DEVICE if _on_device(args[0]) else func(*args, **kwargs)
        out = func(*args, **kwargs)
        ins = _tensors(args, kwargs)
        if func in _READS:
            if ins and _on_device(ins[0]) and self.counting:
                self.d2h += 1
                self.where.append(_caller())
            return out
        # made on the draft's device: DEVICE itself passed (host code passes a host tensor's device, or none)
        explicit = kwargs.get("device") is DEVICE or (func is torch.Tensor.to and any(a is DEVICE for a in args[1:]))
        marked = [t for t in ins if _on_device(t)]
        if self.counting:
            host_data = [t for t in ins if not _on_device(t) and t.dim() > 0]  # (0-dim host tensors are scalars)
            if (marked or explicit) and host_data:
                self.h2d += 1
            elif explicit and func in _FROM_DATA and not marked:
                self.h2d += 1  # (made from a Python list or number)
        if explicit and func is torch.Tensor.to and out is args[0]:
            out = out.view_as(out)  # (on a CPU .to() returns the host tensor itself: on a GPU it is another one)
        if marked or explicit:
            for t in _tensors(out):
                self.mark(t)
        return out


def _caller() -> str:
    """file:line of the disco code that made the read."""
    frame: Any = sys._getframe(2)
    while frame is not None and "/disco/" not in frame.f_code.co_filename:
        frame = frame.f_back
    return f"{frame.f_code.co_filename.split('/disco/')[-1]}:{frame.f_lineno}" if frame is not None else "?"


# --- a stand-in for vLLM ---------------------------------------------------------------------------------------


class _VllmDrafter:
    """vLLM's DraftModelProposer as DiscoDraftProposer's other base sees it: its draft loop (position 1, then k - 1
    more, each a batched forward and _sample_draft_tokens; vLLM's llm_base_proposer.propose). The stand-in model's
    hidden state is the last token; each call of _sample_draft_tokens is one position, its reads counted apart."""

    def propose(self, num_speculative_tokens: int, **kwargs: Any) -> None:
        hidden = kwargs["next_token_ids"]
        for _ in range(num_speculative_tokens):
            before = self.marks.d2h, self.marks.h2d
            try:
                hidden, _ = self._sample_draft_tokens(hidden, None)
            finally:  # (disco's proposer ends the loop by raising)
                self.per_position.append((self.marks.d2h - before[0], self.marks.h2d - before[1]))


class _Proposer(_DiscoDraft, _VllmDrafter):
    pass


@dataclass
class _Request:
    rid: str
    tokens: list[int]  # prompt and output so far (vLLM's token_ids_cpu row)
    prompt: int
    budget: int  # output tokens it stops at
    window: list[int] = field(default_factory=list)  # the drafts handed to vLLM last step
    fresh: bool = True  # its next step is a prefill (its first, or after preemption)

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt


class World:
    """vLLM's side of the steps, for `proposer`: continuous batching of `batch` requests out of `n_requests` (they
    finish at different steps, the last row moves into a finished one's place as vLLM's input batch condenses, one
    is preempted for a step and recomputed), a target whose greedy token often agrees with the draft's, and the
    bookkeeping after each step (what vLLM accepted and sampled joins the request's tokens)."""

    def __init__(
        self, proposer: Any, marks: DeviceMarks, batch: int, n_requests: int, reference: HostReference | None = None
    ) -> None:
        g = torch.Generator().manual_seed(0)
        scale = torch.tensor([0.5, 2.0, 6.0])[torch.arange(V) % 3, None]
        draft = torch.randn(V, V, generator=g) * scale
        self.target = draft + 0.6 * torch.randn(V, V, generator=g)  # (host: the stand-in target's own device)
        self.proposer, self.marks, self.batch = proposer, marks, batch
        proposer.model = NS(compute_logits=lambda h: self.logits[h])
        self.logits = marks.mark(draft.clone())
        self.queue = [
            _Request(str(i), p, len(p), 6 + 5 * i)
            for i, p in enumerate(torch.randint(0, V, (n_requests, 12), generator=g).tolist())
        ]
        for r, n in zip(self.queue, (5, 12, 3, 9, 7, 12, 4, 10)):
            del r.tokens[n:]
            r.prompt = n
        self.running: list[_Request] = []
        self.preempted: _Request | None = None
        self.steps = 0
        self.log: list[tuple[str, list[int]]] = []  # every window handed to vLLM, by request
        self.reference, self.unlike = reference, 0  # the host's windows, and the steps whose windows differ
        proposer._runner = NS(requests={}, input_batch=NS())

    def _next(self, tokens: list[int]) -> int:
        return int(self.target[tokens[-1]].argmax())

    def step(self) -> bool:
        """One step: schedule, verify the last windows, propose; False when every request is done."""
        runner = self.proposer._runner
        while len(self.running) < self.batch and self.queue:
            r = self.queue.pop(0)
            self.running.append(r)
            runner.requests[r.rid] = r
        if self.steps == 4 and len(self.running) > 2:  # one request preempted for a step (it stays in requests)
            self.preempted = self.running.pop(1)
            self.preempted.window, self.preempted.fresh = [], True
        elif self.preempted is not None:
            self.running.append(self.preempted)
            self.preempted = None
        if not self.running:
            return False
        n = len(self.running)
        qlen, sampled, rejected, accepted = [], [], [], []
        for r in self.running:
            if r.fresh:  # a prefill (the whole prompt, or everything after preemption): no window verified
                qlen.append(len(r.tokens))
                a = 0
            else:
                qlen.append(1 + len(r.window))
                a = 0
                while a < len(r.window) and r.window[a] == self._next(r.tokens + r.window[:a]):
                    a += 1
            accepted.append(a)
            rejected.append(len(r.window) - a if not r.fresh else 0)
            sampled.append(self._next(r.tokens + r.window[:a]))
        width = max(len(r.tokens) for r in self.running)
        ids = np.zeros((n, width + 64), dtype=np.int32)
        for i, r in enumerate(self.running):
            ids[i, : len(r.tokens)] = r.tokens
        runner.input_batch = NS(
            req_ids=[r.rid for r in self.running],
            num_tokens_no_spec=np.array([len(r.tokens) for r in self.running], dtype=np.int32),
            token_ids_cpu=ids,
        )
        cad = NS(batch_size=lambda: n, query_start_loc_cpu=torch.tensor(np.cumsum([0, *qlen]), dtype=torch.int32))
        kwargs = {
            "next_token_ids": torch.tensor(sampled, device=DEVICE),
            "num_rejected_tokens_gpu": torch.tensor(rejected, dtype=torch.int32, device=DEVICE),
            "common_attn_metadata": cad,
        }
        self.proposer.per_position = []
        self.marks.counting, self.marks.d2h, self.marks.h2d, self.marks.where = True, 0, 0, []
        windows = self.proposer.propose(K, **kwargs)
        self.marks.counting = False
        self.counts.append((len(self.proposer.per_position), self.marks.d2h, self.marks.h2d))
        self.where.append(list(self.marks.where))
        self.positions.append(list(self.proposer.per_position))
        if self.reference is not None:
            self.unlike += windows != self.reference.windows(self, accepted, sampled)
        for r, w, a, x in zip(self.running, windows, accepted, sampled):  # vLLM's bookkeeping
            r.tokens += r.window[:a] + [x]
            r.window, r.fresh = w, False
            self.log.append((r.rid, list(w)))
        for r in [r for r in self.running if len(r.tokens) - r.prompt >= r.budget]:  # finished
            i = self.running.index(r)
            self.running[i] = self.running[-1]  # vLLM's input batch condenses: the last row fills the hole
            self.running.pop()
            del runner.requests[r.rid]
        self.steps += 1
        return True

    def run(self) -> World:
        self.counts: list[tuple[int, int, int]] = []  # per step: positions, reads of the device, copies to it
        self.where: list[list[str]] = []
        self.positions: list[list[tuple[int, int]]] = []
        with self.marks:
            while self.step():
                pass
        return self


class HostReference:
    """The same policy deciding on the host, as the proposer did when it read the device every step (and as the
    simulator does): each request's RequestState updated with host counts, its context built from vLLM's tokens,
    the stand-in draft's positions run here. windows(): what it would have handed vLLM."""

    def __init__(self, label: str, classes: torch.Tensor) -> None:
        self.policy, self.load = POLICIES[label]()
        self.classes = classes
        self.states: dict[str, RequestState] = {}

    def windows(self, world: World, accepted: list[int], sampled: list[int]) -> list[list[int]]:
        rows, policy = world.running, self.policy
        states = [self.states.setdefault(r.rid, RequestState(r.rid)) for r in rows]
        for r, st, a in zip(rows, states, accepted):
            if r.window and not r.fresh:
                policy.update(st, len(r.window), a)
        batch = Batch.under(states, self.load, K)
        live = policy.drafts(batch)
        policy.start(batch, DEVICE)
        contexts = [r.tokens + r.window[:a] + [x] for r, a, x in zip(rows, accepted, sampled)]
        lengths = torch.tensor([len(c) for c in contexts])
        context = torch.full((len(rows), int(lengths.max()) + K), -1, dtype=torch.long)
        for i, c in enumerate(contexts):
            context[i, : len(c)] = torch.tensor(c)
        gen0 = lengths - torch.tensor([r.prompt for r in rows])
        last, drafted, tokens, pos = torch.tensor(sampled), torch.zeros(len(rows), dtype=torch.long), [], 0
        while bool(live.any()) and pos < K:
            pos += 1
            logits = world.logits[last]
            last = logits.argmax(-1)
            tokens.append(last)
            feats = None
            if policy.reads_features:
                dist = batch_logit_distribution(logits, last)
                p = dist[2]
                feats = assemble_token_features(dist, last, gen0 + pos - 1, context, lengths, self.classes)
                context[torch.arange(len(rows)), lengths] = last
                lengths = lengths + 1
            else:
                p = (logits.gather(1, last[:, None])[:, 0].float() - logits.float().logsumexp(-1)).exp()
            stop = policy.stops(pos, feats, p, live)
            drafted = torch.where(live, pos, drafted)
            live = live & ~stop
        table = torch.stack(tokens, 1).tolist() if tokens else [[] for _ in rows]
        return [row[:k] for row, k in zip(table, drafted.tolist())]


def _logistic() -> DenseModel:
    """P(accept) rising with the draft's confidence and the copy signal, falling along the window."""
    names = ("p_top1", "window_pos", "copy_1", "prev_accepted", "window_prob_prod")
    W = np.array([[5.0], [-0.35], [0.8], [0.15], [1.0]])
    return DenseModel(
        "logistic", np.zeros(5), np.ones(5), [(W, np.array([-2.2]))], "identity", [FEATURES.index(f) for f in names]
    )


COST = CostModel(0.15, tuple(1.0 + 0.08 * k for k in range(K + 1)), "stub")
C_STEP = tuple(1.0 if t <= 16 else 1.0 + 0.05 * (t - 16) for t in range(1, 8 * (K + 1) + 1))
LOAD = CostModel(0.2, C_STEP[: K + 1], "stub", C_STEP, (0.2, 0.22, 0.24, 0.26))
CLOSED_LOOP = "classifier, cost rule + closed loop"  # (seeded by the load profile)
POLICIES = {
    "threshold 0.5": lambda: (BatchThreshold(0.5), None),
    "classifier, token rule": lambda: (BatchClassifier(_logistic().torch_predictor(DEVICE), "token", 0.5, COST), None),
    "classifier, cost-adaptive rule": lambda: (
        BatchClassifier(_logistic().torch_predictor(DEVICE), "cost-adaptive", 1.0, COST),
        None,
    ),
    "classifier, cost rule + load profile (pooled)": lambda: (
        BatchClassifier(_logistic().torch_predictor(DEVICE), "cost", 1.0, COST),
        LOAD,
    ),
    CLOSED_LOOP: lambda: (BatchClassifier(_logistic().torch_predictor(DEVICE), "cost", 1.0, COST), LOAD),
}


def proposer_for(label: str, marks: DeviceMarks) -> Any:
    """DiscoDraftProposer's state as set_policy leaves it (without vLLM's __init__: no model to load)."""
    p = _Proposer.__new__(_Proposer)
    with marks:
        policy, load = POLICIES[label]()
        classes = marks.mark(torch.arange(V, device=DEVICE) % len(TOKEN_CLASSES))
        # the closed loop (its costs, the classifier's calibration on the device, the governor) as set_policy makes it
        loop = ClosedLoop(load, 8, K, DEVICE, True, True, lambda line: None, True) if label == CLOSED_LOOP else None
    p.own, p.marks, p.device, p.policy, p.load, p._classes = False, marks, DEVICE, policy, load, classes
    p.loop, p.decider, p._fixed = loop, policy, {0: BatchTarget()}
    if loop is not None:
        policy.predict = _calibrated(policy.predict, p)
    p.settings, p.requests, p.finished, p._step, p.never_drafts = NS(keep_stats=True), {}, {}, None, False
    p.decide_s = p.forward_s = 0.0
    p.n_positions, p.n_skipped, p._stale = 0, 0, set()
    p.vllm_config = NS(speculative_config=NS(num_speculative_tokens=K))
    return p


def run(label: str, batch: int, n_requests: int = 8, reference: bool = False) -> World:
    marks = DeviceMarks()
    proposer = proposer_for(label, marks)
    host = HostReference(label, proposer._classes) if reference else None
    return World(proposer, marks, batch, n_requests, host).run()


# --- the tests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("label", list(POLICIES))
def test_at_most_one_read_of_the_device_per_position_and_one_per_step(label, batch):
    """Each step reads the draft's device at most once per position it drafted and once more; a position brings
    no host data to the device (its caches filled by the first steps), a step at most twice."""
    world = run(label, batch)
    assert sum(c[0] for c in world.counts) > 20  # it did draft, over many steps
    for (positions, d2h, h2d), where, per_position in zip(world.counts, world.where, world.positions):
        assert d2h <= positions + 1, where
        assert h2d - sum(p[1] for p in per_position) <= 2
    steady = [p for step in world.positions[len(world.positions) // 2 :] for p in step]
    assert all(d2h <= 1 for d2h, _ in steady)
    copied = sum(h2d > 0 for _, h2d in steady)
    # the closed loop's running cost table is rebuilt every ONLINE_COST_REBUILD observations (a step and each timed
    # position one each): the rules' cost tensors (made once per cost model and position) are then copied to the
    # device at their first use, K at most per rebuild (and one rebuild begun in the first half)
    rebuilds = (len(world.positions) - len(world.positions) // 2 + len(steady)) // ONLINE_COST_REBUILD + 2
    assert copied == 0 if label != CLOSED_LOOP else copied <= K * rebuilds


@pytest.mark.parametrize("label", [label for label in POLICIES if label.startswith("classifier")])
def test_the_context_kept_on_the_device_is_the_hosts(label):
    """Every step, each row's context on the device (prompt, output, the accepted drafts and the sampled token)
    equals the one the host would build from vLLM's token_ids_cpu, with its length and generated index: through
    new requests, finished ones (rows moved), preemption and windows accepted in part. A step a fixed length
    decides (the closed loop's probes) builds none: the rows' tokens are sent again at the policy's next step."""
    marks = DeviceMarks()
    proposer = proposer_for(label, marks)
    world = World(proposer, marks, 4, 8)
    begin, checked, skipped = proposer._begin, [0], [0]

    def spy(n, k_max, next_token_ids, cad, kwargs):
        step = begin(n, k_max, next_token_ids, cad, kwargs)
        if step.context is None:  # (a fixed length decides: no features read)
            assert proposer.decider is not proposer.policy
            skipped[0] += 1
            return step
        counting, marks.counting = marks.counting, False
        ib, qlen = proposer._runner.input_batch, np.diff(cad.query_start_loc_cpu.numpy())
        sampled, rejected = next_token_ids.tolist(), kwargs["num_rejected_tokens_gpu"].tolist()
        for i, r in enumerate(world.running):
            done = int(ib.num_tokens_no_spec[i])
            verified = 0 if r.fresh else int(qlen[i]) - 1
            want = ib.token_ids_cpu[i, :done].tolist() + r.window[: verified - rejected[i]] + [sampled[i]]
            length = int(step.lengths[i])
            assert length == len(want) and step.context[i, :length].tolist() == want, (world.steps, r.rid)
            assert int(step.gen0[i]) == length - r.prompt
            checked[0] += 1
        marks.counting = counting
        return step

    proposer._begin = spy
    world.run()
    assert checked[0] > 20  # rows checked over the steps (the closed loop's probes check none)
    assert (skipped[0] > 0) == (label == CLOSED_LOOP)  # (its probes: the context checked again after them)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("label", [label for label in POLICIES if label != CLOSED_LOOP])  # (it recalibrates)
def test_the_windows_are_the_hosts(label, batch):
    """Every window the proposer hands vLLM is the one the same policy gives deciding on the host (HostReference:
    the proposer's way when it read the device every step): the policy's state kept on the device, updated there
    from vLLM's rejected counts, decides alike."""
    world = run(label, batch, reference=True)
    assert sum(len(w) for _, w in world.log) > 20 and len({len(w) for _, w in world.log}) > 2  # ragged windows
    assert world.unlike == 0


def digest(world: World) -> str:
    """Of every window handed vLLM, by request (to compare two versions of the proposer on the stand-in)."""
    return hashlib.sha256(repr(world.log).encode()).hexdigest()[:16]


if __name__ == "__main__":  # the counts per step, and the windows' digest (to compare two versions)
    columns = "steps | positions / step | reads of the device / step | most in a step | copies to it / step"
    print(f"| policy | requests at once | {columns} | windows' digest |")
    for label in POLICIES:
        for b in (1, 4):
            w = run(label, b)
            n = len(w.counts)
            positions, d2h, h2d = (sum(c[j] for c in w.counts) / n for j in range(3))
            most = max(c[1] for c in w.counts)
            print(f"| {label} | {b} | {n} | {positions:.2f} | {d2h:.2f} | {most} | {h2d:.2f} | {digest(w)} |")
