"""The policy registry: a name -> how to build that policy for one generation (docs/architecture.md, "Policies").

Every policy the CLI, compare, the loop and the simulator can run is an entry of `POLICIES`, `target`
(no draft: target-only decoding) and `oracle` (knows the target's continuation) included, so no stage
above this one branches on a policy's name: it asks the entry what the policy needs.

A new policy: a class implementing policy.StoppingPolicy, and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from disco.base.defaults import (
    ADAEDL_LAMBDA,
    DEFAULT_K,
    DEFAULT_MAX_WINDOW,
    DEFAULT_POLICY,
    DEFAULT_RULE,
    DEFAULT_THRESHOLD,
    POLICY_NAMES,
    SVIP_H,
)
from disco.base.errors import DiscoError
from disco.base.settings import check_setting
from disco.policies.adaptive_verification import BatchAdaptiveVerification, BatchLearnedBudget
from disco.policies.batch_policy import BatchClassifier, BatchConstant, BatchPolicy, BatchTarget, BatchThreshold
from disco.policies.classifier import ClassifierPolicy, chosen_rule
from disco.policies.loop_budget import LoopAdaptiveVerification, LoopLearnedBudget
from disco.policies.policy import (
    AdaEDLPolicy,
    ConstantPolicy,
    HeuristicPolicy,
    OraclePolicy,
    StoppingPolicy,
    SVIPPolicy,
    ThresholdPolicy,
)
from disco.policies.rules import rule_named

if TYPE_CHECKING:
    from disco.core.cost import CostModel
    from disco.policies.classifier import Predictor


@dataclass
class PolicySpec:
    """A policy by name plus its knobs: what the CLI and `disco compare` pass around."""

    name: str = DEFAULT_POLICY  # one of POLICY_NAMES
    k: int = (
        DEFAULT_K  # constant: window length; heuristic: starting window length; the budget policies: the most drafted
    )
    threshold: float = DEFAULT_THRESHOLD  # threshold: stop after a token with draft probability below this
    adaptive: bool = False  # threshold: transformers' ROC update of the threshold after each window
    lam: float = ADAEDL_LAMBDA  # adaedl: (initial) lower bound on acceptance below which drafting stops
    lam_adaptive: bool = True  # adaedl: the paper's update of lambda after each round
    h: float = SVIP_H  # svip: stop when sqrt(c * entropy) exceeds this
    # classifier, learned-budget: path of the trained artifact (in disco's loop the budget policies price their
    # verification widths with its cost model)
    classifier: str | None = None
    # classifier: override the tuned setting of its rule (rules.py: a probability for token/cumulative, a rate for
    # the cost rules). One name: the CLI's --classifier-setting, the manifest's "setting", the rules' `setting`
    classifier_setting: float | None = None
    classifier_rule: str | None = None  # classifier: run this rule (rules.RULES) instead of the chosen one
    trust_pickle: bool = False  # classifier: allow a joblib (pickle) artifact, which can run code

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            others = ", ".join(n for n in POLICIES if n != self.name)
            raise DiscoError(f"unknown policy {self.name!r}: choose one of {others}")
        for name in self.kind.settings:  # the one check of a policy's knobs (their ranges: settings.RANGES)
            check_setting(name, getattr(self, name))
        if self.classifier_rule is not None:  # the one check of the rule, and of the setting under it
            rule_named(self.classifier_rule).check(self.classifier_setting)

    @property
    def kind(self) -> PolicyKind:
        return POLICIES[self.name]

    @property
    def runs_batched(self) -> bool:
        """Whether this policy, with these knobs, has a form for a whole batch on vLLM's own draft."""
        return self.kind.batched is not None and self.kind.batched_when(self)

    def build(
        self,
        target_tokens: Sequence[int] | None = None,
        pair: Any = None,
        max_window: int = DEFAULT_MAX_WINDOW,
        sampling: tuple[float, float] | None = None,
    ) -> StoppingPolicy | None:
        """A fresh policy for one generation (None: target-only decoding). The oracle needs `target_tokens`,
        the classifier `pair` (and `sampling`, the (temperature, top-p) it runs at, to warn when it was
        tuned for another)."""
        return self.kind.build(self, BuildContext(target_tokens, pair, max_window, sampling))


@dataclass(frozen=True)
class BuildContext:
    """What building a policy may need besides its spec, from the loop or the simulator."""

    target_tokens: Sequence[int] | None = None  # the oracle: the target's greedy continuation
    pair: Any = None  # the live classifier: the pair it runs on (artifact check, token classes)
    max_window: int = DEFAULT_MAX_WINDOW  # AdaEDL adapts toward windows shorter than this
    sampling: tuple[float, float] | None = None  # the live classifier: (temperature, top-p) it runs at
    model: Predictor | None = None  # the simulator's classifier: a trained model in memory
    cost: CostModel | None = None  # ... and the cost model its cost rules decide with


@dataclass(frozen=True)
class PolicyKind:
    """How to build one registered policy, and what it needs from the caller."""

    build: Callable[[PolicySpec, BuildContext], StoppingPolicy | None]  # None: decode with the target alone
    needs_target_tokens: bool = False  # give it the target's own continuation (decode.generate computes it)
    greedy_only: bool = False  # defined for greedy decoding only
    needs_pair: bool = False  # reads the pair (its tokenizer's token classes, the artifact's pair check)
    settings: tuple[str, ...] = ()  # the PolicySpec knobs it reads, checked when a spec names it
    # its form for a whole batch on vLLM's own draft (batch_policy.py); None: not available there
    batched: Callable[[PolicySpec, BatchContext], BatchPolicy] | None = None
    # the knobs the batched form takes (PolicySpec.runs_batched: compare skips the row, the proposer refuses)
    batched_when: Callable[[PolicySpec], bool] = lambda spec: True
    # verifies a budget of the batch's best draft slots (adaptive_verification.BudgetPolicy): on vLLM's draft only
    # (not the side engine), and only under a load profile (its cost tables); in disco's loop `build` gives its
    # one-request form (loop_budget.py)
    batch_budget: bool = False


@dataclass(frozen=True)
class BatchContext:
    """What building a batched policy needs: the pair it runs on, as vLLM's proposer knows it."""

    pair: dict  # the Pair.describe()-like record the artifact check compares (models, tokenizer hash, engine)
    device: Any = None  # the draft's device (the classifier's model runs there)


def _oracle(spec: PolicySpec, ctx: BuildContext) -> StoppingPolicy:
    if ctx.target_tokens is None:
        raise DiscoError("the oracle policy needs the target's greedy continuation (target_tokens)")
    return OraclePolicy(ctx.target_tokens)


def _classifier(spec: PolicySpec, ctx: BuildContext) -> StoppingPolicy:
    if ctx.model is not None:  # the simulator: a model in memory, its rule and setting given
        setting = DEFAULT_THRESHOLD if spec.classifier_setting is None else spec.classifier_setting
        return ClassifierPolicy(ctx.model, setting, rule=spec.classifier_rule or DEFAULT_RULE, cost=ctx.cost)
    if spec.classifier is None:
        raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
    if ctx.pair is None:
        raise DiscoError("the classifier policy needs the pair it runs on")
    return ClassifierPolicy.for_pair(
        spec.classifier, ctx.pair, spec.classifier_setting, spec.trust_pickle, spec.classifier_rule, ctx.sampling
    )


def _vllm_artifact(spec: PolicySpec, ctx: BatchContext) -> Any:
    """The classifier artifact a batched policy on vLLM's draft decides with (checked against the pair; one that
    reads the draft's hidden state is refused: vLLM's draft does not give it to its proposer)."""
    from disco.policies.artifact import load_artifact

    if spec.classifier is None:
        raise DiscoError(f"the {spec.name} policy needs a trained artifact: name it (policy.classifier)")
    artifact = load_artifact(spec.classifier, expect_pair=ctx.pair, trust_pickle=spec.trust_pickle)
    if artifact.hidden_dim:
        raise DiscoError(
            f"{artifact.path} reads the draft's hidden state, which vLLM's draft does not give its proposer: "
            "train one without --hidden for vLLM"
        )
    return artifact


def _batched_classifier(spec: PolicySpec, ctx: BatchContext) -> BatchPolicy:
    artifact = _vllm_artifact(spec, ctx)
    rule, setting = chosen_rule(artifact, spec.classifier_setting, spec.classifier_rule)
    if rule == "threshold":
        return BatchThreshold(setting)
    return BatchClassifier(artifact.torch_predictor(ctx.device or "cpu"), rule, setting, artifact.cost_model())


def _budget(spec: PolicySpec, ctx: BatchContext) -> BatchPolicy:
    """vLLM 0.32's adaptive verification (adaptive-verification) or disco's learned budget (learned-budget: the
    classifier artifact as its estimator) on vLLM's draft: every request drafts up to spec.k positions."""
    if spec.name == "adaptive-verification":
        return BatchAdaptiveVerification(spec.k, ctx.device)
    artifact = _vllm_artifact(spec, ctx)
    return BatchLearnedBudget(artifact.torch_predictor(ctx.device or "cpu"), spec.k, ctx.device)


def _budget_loop(spec: PolicySpec, ctx: BuildContext) -> StoppingPolicy:
    """vLLM 0.32's adaptive verification or disco's learned budget in disco's one-request loop (loop_budget.py),
    drafting up to spec.k (at most the loop's max window) and pricing each verification width by the loop's cost
    model: the simulator's (ctx.cost), else the artifact's (the profile `disco train` priced with, as the
    classifier's cost rules read it). The learned budget's estimator: the simulator's model (ctx.model), else the
    artifact's."""
    from disco.policies.artifact import load_artifact

    sampled = ctx.sampling is not None and ctx.sampling[0] > 0
    live = ctx.model is None
    if live and spec.name == "learned-budget" and spec.classifier is None:
        raise DiscoError(f"the {spec.name} policy needs a trained artifact: pass --classifier models/NAME")
    artifact: Any = None  # (an Artifact: a Predictor, as ClassifierPolicy.for_pair passes it)
    if live and spec.classifier is not None:
        artifact = load_artifact(spec.classifier, expect_pair=ctx.pair, trust_pickle=spec.trust_pickle)
    cost = ctx.cost if ctx.cost is not None else artifact.cost_model() if artifact is not None else None
    if cost is None:
        fix = (
            f"{artifact.path} records none: retrain it with disco train --profile"
            if artifact is not None
            else "give --classifier ARTIFACT (the profile it was trained with prices them)"
        )
        raise DiscoError(f"the {spec.name} policy prices its verification widths with a cost model: {fix}")
    k = max(1, min(spec.k, ctx.max_window))  # (the loop drafts no further than its max window)
    if spec.name == "adaptive-verification":
        return LoopAdaptiveVerification(cost, k, sampled)
    if artifact is not None and ctx.sampling is not None:
        artifact.check_sampling(*ctx.sampling)
    # the classifier's features, model and window state; its rule (token at 0.5) is never asked: the budget decides
    if artifact is not None:
        clf = ClassifierPolicy(artifact, 0.5, ctx.pair.token_classes(), "token", None, artifact.projection())
    else:
        assert ctx.model is not None, "live, the artifact is required above"
        clf = ClassifierPolicy(ctx.model, 0.5, rule="token")
    return LoopLearnedBudget(clf, cost, k, sampled)


POLICIES: dict[str, PolicyKind] = {
    "target": PolicyKind(lambda spec, ctx: None, batched=lambda spec, ctx: BatchTarget()),
    "constant": PolicyKind(
        lambda spec, ctx: ConstantPolicy(spec.k), settings=("k",), batched=lambda spec, ctx: BatchConstant(spec.k)
    ),
    "heuristic": PolicyKind(lambda spec, ctx: HeuristicPolicy(spec.k), settings=("k",)),
    "threshold": PolicyKind(
        lambda spec, ctx: ThresholdPolicy(spec.threshold, adaptive=spec.adaptive),
        settings=("threshold",),
        batched=lambda spec, ctx: BatchThreshold(spec.threshold),
        batched_when=lambda spec: not spec.adaptive,  # transformers' ROC update is one sequence's
    ),
    "adaedl": PolicyKind(
        lambda spec, ctx: AdaEDLPolicy(spec.lam, adaptive=spec.lam_adaptive, max_window=ctx.max_window),
        settings=("lam",),
    ),
    "svip": PolicyKind(lambda spec, ctx: SVIPPolicy(spec.h), settings=("h",)),
    "oracle": PolicyKind(_oracle, needs_target_tokens=True, greedy_only=True),
    "classifier": PolicyKind(
        _classifier, needs_pair=True, settings=("classifier_setting",), batched=_batched_classifier
    ),
    "adaptive-verification": PolicyKind(_budget_loop, settings=("k",), batched=_budget, batch_budget=True),
    "learned-budget": PolicyKind(_budget_loop, needs_pair=True, settings=("k",), batched=_budget, batch_budget=True),
}
assert tuple(POLICIES) == POLICY_NAMES, "defaults.POLICY_NAMES lists the registry's keys, for --help"


def make_policy(
    spec: PolicySpec | str,
    *,
    target_tokens: Sequence[int] | None = None,
    max_window: int = DEFAULT_MAX_WINDOW,
    **knobs: Any,
) -> StoppingPolicy | None:
    """Build a policy from its spec; `make_policy(name, **knobs)` is short for `make_policy(PolicySpec(name,
    **knobs))` (tests, the simulator). The oracle needs the target's greedy tokens, the classifier an artifact
    (PolicySpec.classifier) or a model (simulate.replay_policy)."""
    return as_spec(spec, knobs).build(target_tokens, max_window=max_window)


def as_spec(spec: PolicySpec | str, knobs: dict[str, Any]) -> PolicySpec:
    """`spec` itself, or a spec of the policy named `spec` with `knobs` (PolicySpec's fields)."""
    if isinstance(spec, PolicySpec):
        if knobs:
            raise TypeError(f"knobs {', '.join(knobs)} beside a PolicySpec: set them in the spec")
        return spec
    return PolicySpec(spec, **knobs)
