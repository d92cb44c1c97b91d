"""vLLM 0.32's online acceptance estimator (PR #52228), re-implemented in torch (issue 45; ../shared/serving-anchors.md,
"Added 2026-12-03"): the confidence vLLM's adaptive verification (policies/adaptive_verification.py) budgets with.

vLLM 0.32 (V2 GPU model runner only; `vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`,
`OnlineAcceptanceEstimator`): per (request, draft position k) the feature f = logit(q*), q* the draft's top-1
probability after temperature (`_predict_kernel`: computed from the logits as -log sum_{z != m*} exp(z - m*),
clamped to +-40), and P(accept) = sigmoid(w f + b_k): one slope shared by every position, one intercept per
position; cold start w = 0.5, b_k = -0.2. After each verification (`step`) the judged drafts (the accepted ones and
the first rejected one, if admitted) are folded into Newton-IRLS statistics with the *predictions made at draft
time* (`_accumulate_kernel`); every REFIT_INTERVAL = 100 steps one damped, ridged Newton step is solved in closed
form on the arrowhead system (`_refit_kernel`), and the statistics are cleared. `OnlineAcceptanceEstimator` below
mirrors this, operation for operation, in float32.

Where it adapts: vLLM keeps features and predictions in slots keyed by the persistent request-state index
(`idx_mapping`); so does the estimator here (`idx_mapping` optional: the batch order is the slot). Traces hold q*
(p_top1, float32), not logits: `log_odds` of it, clamped at +-40 as vLLM clamps; a q* that rounded to 1 reads +40
where vLLM's logits would give its exact log-odds (> 16.6). `log_odds_from_logits` is the kernel's formula for a
proposer holding the logits.
"""

from __future__ import annotations

import torch

from disco.base.errors import DiscoError

MAX_LOG_ODDS = 40.0  # acceptance_estimator._MAX_LOG_ODDS
INIT_SLOPE = 0.5  # acceptance_estimator._INIT_SLOPE
INIT_BIAS = -0.2  # acceptance_estimator._INIT_BIAS


def log_odds(p_top1: torch.Tensor) -> torch.Tensor:
    """The estimator's feature from the draft's top-1 probability: log(q / (1 - q)), clamped at +-MAX_LOG_ODDS
    (`_predict_kernel`'s clamp; a q of exactly 1 reads +40). float32, as vLLM's features buffer."""
    q = p_top1.to(torch.float64)
    f = torch.log(q) - torch.log1p(-q)
    return f.nan_to_num(nan=0.0, posinf=MAX_LOG_ODDS, neginf=-MAX_LOG_ODDS).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS).float()


def log_odds_from_logits(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """`_local_max_sumexp_kernel` + `_predict_kernel`'s feature of each row of draft logits (N, V): the logits
    divided by the request's temperature (a temperature <= 0 drafts greedily and leaves them alone), then
    logit(q(m*)) = -log(sum_{z != m*} exp(z - m*)) (the complement sum clamped at 0), clamped at +-40."""
    x = logits.float()
    if temperature is not None:
        t = temperature.float()
        x = x / torch.where(t > 0, t, torch.ones_like(t))[:, None]
    m = x.amax(1, keepdim=True)
    complement = ((x - m).exp().sum(1) - 1.0).clamp_min(0.0)
    return (-torch.log(complement)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


class OnlineAcceptanceEstimator:
    """vLLM 0.32's `OnlineAcceptanceEstimator` (acceptance_estimator.py), in torch on any device.

    Per step, as vLLM's runner drives it (`speculator.py`: `sample_draft` -> `_maybe_predict_acceptance`; after
    verification `observe_verification` -> `step`, which must run before the next propose):
      predict(p_top1)                     the drafts' confidences (B, K) or one position (B,) with `step`
      step(num_accepted, num_admitted)    fold the verdict in; every REFIT_INTERVAL calls, refit()
    (`step_sampled(num_sampled, num_rejected)` takes vLLM's own sampler counts.)
    """

    REFIT_INTERVAL = 100  # OnlineAcceptanceEstimator.REFIT_INTERVAL
    DAMPING_OBSERVATIONS = 50.0  # OnlineAcceptanceEstimator.DAMPING_OBSERVATIONS
    L2 = 1e-3  # OnlineAcceptanceEstimator.L2

    def __init__(self, num_speculative_steps: int, max_num_reqs: int = 256, device: torch.device | None = None):
        if num_speculative_steps < 1:
            raise DiscoError("the acceptance estimator needs at least one draft position")
        K, dev = num_speculative_steps, torch.device("cpu") if device is None else torch.device(device)
        self.num_speculative_steps, self.device = K, dev
        self._steps_since_refit = 0
        self.refits = 0
        self.converged = False  # (fit: whether the last refit moved nothing)
        self.slope = torch.full((1,), INIT_SLOPE, dtype=torch.float32, device=dev)
        self.intercepts = torch.full((K,), INIT_BIAS, dtype=torch.float32, device=dev)
        # stable slots keyed by the persistent request index (vLLM's req_state_idx)
        self.features = torch.zeros(max_num_reqs, K, dtype=torch.float32, device=dev)
        self.predictions = torch.zeros(max_num_reqs, K, dtype=torch.float32, device=dev)
        # per-round Newton-IRLS statistics: info[k] = (a_k, b_k, c_k), grad[k] = (g0_k, g1_k), counts[k]
        self.info = torch.zeros(K, 3, dtype=torch.float32, device=dev)
        self.grad = torch.zeros(K, 2, dtype=torch.float32, device=dev)
        self.counts = torch.zeros(K, dtype=torch.float32, device=dev)

    def _slots(self, idx_mapping: torch.Tensor | None, n: int) -> torch.Tensor:
        if idx_mapping is None:
            idx_mapping, need = torch.arange(n, device=self.device), n
        else:  # a host tensor's largest slot is known without a sync; a device one must fit max_num_reqs
            need = int(idx_mapping.max()) + 1 if n and idx_mapping.device.type == "cpu" else 0
        if need > self.features.shape[0]:  # (vLLM sizes these by max_num_reqs; grown here, on the host)
            grow = need - self.features.shape[0]
            pad = torch.zeros(grow, self.num_speculative_steps, dtype=torch.float32, device=self.device)
            self.features, self.predictions = torch.cat([self.features, pad]), torch.cat([self.predictions, pad])
        return idx_mapping.to(self.device, torch.long)

    def reserve(self, slots: int) -> None:
        """Room for slots 0 .. slots - 1 (vLLM sizes its buffers by max_num_reqs once; a caller that hands device
        idx_mappings grows them here first, on the host)."""
        self._slots(torch.tensor([slots - 1]), 1 if slots > 0 else 0)

    def confidence(self, feature: torch.Tensor, step: torch.Tensor | int | slice) -> torch.Tensor:
        """sigmoid(w f + b_step) with the current coefficients (`_predict_kernel`)."""
        return torch.sigmoid(self.slope * feature + self.intercepts[step])

    def predict(
        self, p_top1: torch.Tensor, step: int | None = None, idx_mapping: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The drafts' confidences from their top-1 probabilities: (B, K') for positions 0 .. K' - 1 at once, or
        (B,) for position `step` (0-based) as vLLM's draft loop asks after each position. Stores the features
        and predictions in the requests' slots (idx_mapping; default: the batch order), for `step`."""
        return self.predict_features(log_odds(p_top1.to(self.device)), step, idx_mapping)

    def predict_logits(
        self,
        logits: torch.Tensor,
        step: int,
        idx_mapping: torch.Tensor | None = None,
        temperature: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`predict` from one position's draft logits (B, V), as vLLM's `predict` takes them."""
        return self.predict_features(log_odds_from_logits(logits, temperature), step, idx_mapping)

    def predict_features(
        self, feature: torch.Tensor, step: int | None = None, idx_mapping: torch.Tensor | None = None
    ) -> torch.Tensor:
        feature = feature.to(self.device, torch.float32)
        slots = self._slots(idx_mapping, feature.shape[0])
        if step is None:
            cols = slice(0, feature.shape[1])
            prob = self.confidence(feature, cols)
            self.features[slots, cols], self.predictions[slots, cols] = feature, prob
        else:
            prob = self.confidence(feature, step)
            self.features[slots, step], self.predictions[slots, step] = feature, prob
        return prob

    def observe(
        self, num_accepted: torch.Tensor, num_admitted: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> None:
        """Fold one verification into the statistics (`_accumulate_kernel`), with the features and predictions
        stored when the drafts were made: per position k < K, a request's draft there is judged when k <=
        accepted and k < admitted (the accepted ones and the first rejected one), labelled 1 when k < accepted."""
        acc = num_accepted.to(self.device, torch.long)
        slots = self._slots(idx_mapping, acc.shape[0])
        adm = num_admitted.to(self.device, torch.long)
        k = torch.arange(self.num_speculative_steps, device=self.device)
        observed = (k[None, :] <= acc[:, None]) & (k[None, :] < adm[:, None])
        label = (k[None, :] < acc[:, None]).float()
        self.accumulate(self.features[slots], self.predictions[slots], label, observed)

    def accumulate(self, feature: torch.Tensor, pred: torch.Tensor, label: torch.Tensor, observed: torch.Tensor):
        """(B, K) judged drafts into the per-position sums: a_k = sum w f^2, b_k = sum w f, c_k = sum w,
        g0_k = sum r f, g1_k = sum r, counts_k, with w = p (1 - p), r = y - p over the observed ones."""
        w = torch.where(observed, pred * (1.0 - pred), 0.0)
        resid = torch.where(observed, label - pred, 0.0)
        f = torch.where(observed, feature, 0.0)
        self.info += torch.stack([(w * f * f).sum(0), (w * f).sum(0), w.sum(0)], 1)
        self.grad += torch.stack([(resid * f).sum(0), resid.sum(0)], 1)
        self.counts += observed.float().sum(0)

    def step(
        self, num_accepted: torch.Tensor, num_admitted: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> bool:
        """`OnlineAcceptanceEstimator.step`: observe, and refit every REFIT_INTERVAL calls. True: it refitted."""
        self.observe(num_accepted, num_admitted, idx_mapping)
        self._steps_since_refit += 1
        if self._steps_since_refit < self.REFIT_INTERVAL:
            return False
        self._steps_since_refit = 0
        self.refit()
        return True

    def step_sampled(
        self, num_sampled: torch.Tensor, num_rejected: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> bool:
        """`step` from vLLM's sampler counts: accepted = max(num_sampled - 1, 0) (the bonus token subtracted),
        admitted = accepted + num_rejected (`_accumulate_kernel`)."""
        acc = (num_sampled.long() - 1).clamp_min(0)
        return self.step(acc, acc + num_rejected.long(), idx_mapping)

    def refit(self) -> None:
        """`_refit_kernel`: one Newton step on (X^T W X + L2 I) d = X^T (y - p) for theta = [w, b_0 .. b_K-1],
        solved on its arrowhead; the slope's step damped by N / (N + 50) (N: the round's judged drafts) and
        dropped if NaN or if it would make the slope negative; each intercept's step, taken with the damped
        slope step, damped by n_k / (n_k + 50) and dropped if NaN. Then the statistics are cleared."""
        a_k, b_k, c_k = self.info[:, 0], self.info[:, 1], self.info[:, 2] + self.L2
        a = a_k.sum() + self.L2
        g0, g1_k, n = self.grad[:, 0].sum(), self.grad[:, 1], self.counts
        w = self.slope[0]
        shrink = b_k * b_k / c_k
        coupling = b_k * g1_k / c_k
        step_w = (g0 - coupling.sum()) / (a - shrink.sum())
        total_n = n.sum()
        step_w = step_w * (total_n / (total_n + self.DAMPING_OBSERVATIONS))
        step_w = torch.where((step_w == step_w) & (w + step_w >= 0.0), step_w, torch.zeros_like(step_w))
        step_bias = (g1_k - b_k * step_w) / c_k
        step_bias = step_bias * (n / (n + self.DAMPING_OBSERVATIONS))
        step_bias = torch.where(step_bias == step_bias, step_bias, torch.zeros_like(step_bias))
        self.slope[0] = w + step_w
        self.intercepts += step_bias
        self.info.zero_()
        self.grad.zero_()
        self.counts.zero_()
        self.refits += 1

    def fit(self, feature: torch.Tensor, step: torch.Tensor, label: torch.Tensor, max_refits: int = 200) -> int:
        """Fit to a fixed set of judged drafts (feature, 0-based position, label; each a row) by the estimator's
        own refit, repeated to its fixed point: each round accumulates every row with the current predictions
        and refits once (as serving would, were the same traffic replayed every REFIT_INTERVAL steps). The fixed
        point is the unpenalised maximum-likelihood fit of sigmoid(w f + b_k) (the ridge enters only the
        Newton matrix), unless the slope would be negative; a position whose rows are all of one class has
        none (its intercept drifts on until max_refits). Returns the rounds run; `converged` says whether the
        last refit moved no coefficient by 1e-6 or more."""
        K = self.num_speculative_steps
        keep = (step >= 0) & (step < K)
        f = feature[keep].to(self.device, torch.float32)
        k = step[keep].to(self.device, torch.long)
        y = label[keep].to(self.device, torch.float32)
        onehot = torch.nn.functional.one_hot(k, K).bool()
        for rounds in range(1, max_refits + 1):
            before = torch.cat([self.slope, self.intercepts])
            pred = self.confidence(f, k)
            self.accumulate(f[:, None].expand(-1, K), pred[:, None].expand(-1, K), y[:, None].expand(-1, K), onehot)
            self.refit()
            self.converged = float((torch.cat([self.slope, self.intercepts]) - before).abs().max()) < 1e-6
            if self.converged:
                return rounds
        return max_refits
