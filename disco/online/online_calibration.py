"""Online calibration of the acceptance model, per draft position, on the device (docs/architecture.md, "Closed
loop").

The classifier's P(accept) was fitted offline, on another process's traffic; what the verifier reports each step
(how many of each request's drafts were accepted) is the truth of this one. For each position j = 1 .. K
(positions beyond K share K's), a logistic on the model's logit (Platt scaling, on top of disco's model, per
position as vLLM's own acceptance estimator keeps its rates):

    calibrated(j, p) = sigmoid(a_j * logit(p) + b_j)

identity (a = 1, b = 0) until the position has CALIBRATION_MIN outcomes, refitted every CALIBRATION_REFIT
observe() calls by a few Newton (IRLS) steps from the last fit, over a ring of the last CALIBRATION_BUFFER
outcomes of the position, each weighted 2^(-age / CALIBRATION_HALF_LIFE) so a shift in traffic shows within a
bounded number of outcomes (`outcomes_to_cross`), with a weak L2 pull toward the identity (CALIBRATION_PRIOR
outcomes' worth: a position whose buffer is all accepted stays finite), and a >= 0 (a calibration keeps the
model's order; a = 0 says the model knows nothing here and the position's base rate is the answer).

Only tokens the verifier judged are outcomes: the accepted ones and the first rejected one of each window (the
model predicts a token's acceptance given the window so far accepted, as the oracle traces label it); the tokens
after the first rejection say nothing (`observe_windows` masks them).

Everything stays on the device: observe() scatters into the rings with no host sync (an outcome to ignore goes to
position 0, written to a spare column no fit reads), the refit decides per position with torch.where whether it
has enough outcomes, and the refit cadence counts calls on the host. Memory: two (K + 1, N + 1) tensors.
"""

from __future__ import annotations

import math

import torch

from disco.base.defaults import (
    CALIBRATION_BUFFER,
    CALIBRATION_HALF_LIFE,
    CALIBRATION_MIN,
    CALIBRATION_NEWTON,
    CALIBRATION_PRIOR,
    CALIBRATION_REFIT,
)

_EPS = 1e-6  # probabilities are clipped to [eps, 1 - eps] before the logit
_MAX_STEP = 4.0  # a Newton step moves a or b by at most this (a near-separable buffer must not jump to infinity)


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(_EPS, 1.0 - _EPS)
    return torch.log(p) - torch.log1p(-p)


def outcomes_to_cross(
    old: float,
    new: float,
    threshold: float,
    buffer: int = CALIBRATION_BUFFER,
    half_life: float = CALIBRATION_HALF_LIFE,
) -> int:
    """After acceptance at a position shifts from `old` to `new` (the model's p unchanged), how many outcomes of
    the position until the calibrated probability (the weighted mean outcome of the ring, which the logistic's
    intercept matches) falls below `threshold`: the new outcomes' share of the weight, (1 - 2^(-n/h)) /
    (1 - 2^(-N/h)), must pass (old - threshold) / (old - new). Add CALIBRATION_REFIT calls for the refit."""
    share = (old - threshold) / (old - new)
    full = 1.0 - 2.0 ** (-buffer / half_life)
    if not 0.0 < share < 1.0 or share * full >= 1.0:
        raise ValueError("the threshold must lie strictly between the old and the new acceptance")
    return math.ceil(-half_life * math.log2(1.0 - share * full))


class OnlineCalibration:
    """Per-position Platt scaling of P(accept), fitted online from verified outcomes (positions 1 .. `positions`)."""

    def __init__(
        self,
        positions: int,
        device: torch.device | str = "cpu",
        buffer: int = CALIBRATION_BUFFER,
        half_life: float = CALIBRATION_HALF_LIFE,
        min_count: int = CALIBRATION_MIN,
        refit_every: int = CALIBRATION_REFIT,
        newton: int = CALIBRATION_NEWTON,
        prior: float = CALIBRATION_PRIOR,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.positions, self.buffer, self.half_life = positions, buffer, half_life
        self.min_count, self.refit_every, self.newton, self.prior = min_count, refit_every, newton, prior
        self.device = device if isinstance(device, torch.device) else torch.device(device)
        shape = (positions + 1, buffer + 1)  # row 0 and column `buffer`: where ignored outcomes land
        self.x = torch.zeros(shape, dtype=dtype, device=self.device)  # logit(p) of each outcome
        self.y = torch.zeros(shape, dtype=dtype, device=self.device)  # 1: accepted
        self.seen = torch.zeros(positions + 1, dtype=torch.long, device=self.device)  # outcomes per position, ever
        self.fit_a = torch.ones(positions, dtype=dtype, device=self.device)  # the last fit (warm start)
        self.fit_b = torch.zeros(positions, dtype=dtype, device=self.device)
        self.a = self.fit_a.clone()  # in use: the fit where a position has min_count outcomes, else identity
        self.b = self.fit_b.clone()
        self.calls = 0  # observe() calls (host count: the refit cadence needs no sync)
        self.refits = 0

    # --- outcomes ----------------------------------------------------------------------------------------

    def observe(self, position: torch.Tensor, p: torch.Tensor, accepted: torch.Tensor) -> None:
        """(n,) verified outcomes: the window position (1-based; 0 = ignore this entry), the model's P(accept) of
        the token, whether the target accepted it. Device tensors; no host sync."""
        n_rows = self.positions + 1
        row = position.to(self.device, torch.long).clamp(0, self.positions)
        onehot = torch.nn.functional.one_hot(row, n_rows)  # (n, K + 1)
        rank = (onehot.cumsum(0) - 1).gather(1, row[:, None])[:, 0]  # its place among this call's of its row
        added = onehot.sum(0)
        slot = (self.seen[row] + rank) % self.buffer
        # ignored, or overwritten later in this same call (more than `buffer` of one row): the spare column
        spare = (row == 0) | (rank < added[row] - self.buffer)
        slot = torch.where(spare, torch.full_like(slot, self.buffer), slot)
        self.x[row, slot] = _logit(p.to(self.device, self.x.dtype))
        self.y[row, slot] = accepted.to(self.device, self.y.dtype)
        self.seen += added
        self.calls += 1
        if self.calls % self.refit_every == 0:
            self.refit()

    def observe_windows(self, p: torch.Tensor, drafted: torch.Tensor, accepted: torch.Tensor) -> None:
        """One verification of a batch of windows: p (B, W) the model's P(accept) of each request's draft tokens
        (any value past its window), drafted / accepted (B,) each window's length and accepted length. Judged:
        the accepted tokens and the first rejected one."""
        j = torch.arange(1, p.shape[1] + 1, device=p.device)[None, :]
        drafted, accepted = drafted.to(p.device)[:, None], accepted.to(p.device)[:, None]
        judged = (j <= drafted) & (j <= accepted + 1)
        position = torch.where(judged, j.expand_as(p), torch.zeros_like(j))
        self.observe(position.reshape(-1), p.reshape(-1), (j <= accepted).expand_as(p).reshape(-1))

    # --- the fit -----------------------------------------------------------------------------------------

    def weights(self) -> torch.Tensor:
        """(K, N) each stored outcome's weight in the fit: 2^(-age / half-life), 0 for empty slots."""
        n = self.buffer
        seen = self.seen[1:, None]
        slots = torch.arange(n, device=self.device)[None, :]
        age = (seen - 1 - slots) % n  # the newest outcome of a row sits at slot (seen - 1) % n
        valid = age < seen.clamp(max=n)
        return torch.where(
            valid, torch.exp2(-age.to(self.x.dtype) / self.half_life), torch.zeros((), dtype=self.x.dtype)
        )

    def refit(self) -> None:
        """A few Newton steps of the weighted, L2-to-identity logistic per position, from the last fit, all
        positions at once; then the positions with min_count outcomes use it."""
        x, y, w = self.x[1:, : self.buffer], self.y[1:, : self.buffer], self.weights()
        a, b, lam = self.fit_a.clone(), self.fit_b.clone(), self.prior
        for _ in range(self.newton):
            mu = torch.sigmoid(a[:, None] * x + b[:, None])
            r, s = w * (y - mu), w * mu * (1.0 - mu)
            ga, gb = (r * x).sum(1) - lam * (a - 1.0), r.sum(1) - lam * b  # the log-likelihood's gradient
            haa, hab, hbb = (s * x * x).sum(1) + lam, (s * x).sum(1), s.sum(1) + lam  # minus its Hessian
            det = (haa * hbb - hab * hab).clamp(min=1e-12)
            a = (a + ((hbb * ga - hab * gb) / det).clamp(-_MAX_STEP, _MAX_STEP)).clamp(min=0.0)  # (projected)
            b = b + ((haa * gb - hab * ga) / det).clamp(-_MAX_STEP, _MAX_STEP)
        self.fit_a, self.fit_b = a, b
        ready = self.seen[1:] >= self.min_count
        self.a = torch.where(ready, self.fit_a, torch.ones_like(a))
        self.b = torch.where(ready, self.fit_b, torch.zeros_like(b))
        self.refits += 1

    # --- the answer --------------------------------------------------------------------------------------

    def calibrate(self, position: int | torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The calibrated P(accept) of tokens at `position` (one int for all, or (n,) per token; 1-based), p (n,)."""
        if isinstance(position, int):
            i = min(max(position, 1), self.positions) - 1
            a, b = self.a[i], self.b[i]
        else:
            i = position.to(self.device, torch.long).clamp(1, self.positions) - 1
            a, b = self.a[i], self.b[i]
        z = a * _logit(p.to(self.device, self.x.dtype)) + b
        return torch.sigmoid(z).to(p.dtype)
