"""What one generation did, counted alike by the live loop (decode.py), the simulator (simulate.py) and
compare: tokens, forward calls, windows, time (docs/architecture.md, "Rounds")."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenStats:
    """Counts of one generation. Live they are whole numbers; the simulator's expected-acceptance mode
    (simulate.prompt_traces(expected=True)) counts new and accepted tokens as expectations."""

    new_tokens: float = 0  # tokens generated (including a final EOS)
    target_forwards: int = 0  # target calls after the prompt prefill (one per round)
    draft_forwards: int = 0  # draft calls after the prompt prefill (one per drafted token)
    drafted: int = 0  # draft tokens sent to verification
    accepted: float = 0  # draft tokens the target accepted
    windows: list[int] = field(default_factory=list)  # drafted tokens per round
    accepted_per_window: list[float] = field(default_factory=list)  # accepted tokens per round
    prefill_s: float = 0.0  # the target's prompt prefill (and encoding); the draft's runs at its first window
    # tokens re-run because a KV cache could not be rolled back (crop failed); 0 when rollback is a crop
    recomputed_tokens: int = 0
    # filler tokens that padded forwards up to a captured width (torch --compile): the cost of a
    # verify is its bucket's, not its width's
    padded_tokens: int = 0
    wall_s: float = 0.0  # the whole call, prefill included

    def record_window(self, drafted: int, accepted: float) -> None:
        """One verified window (the loop and the simulator count alike; the simulator may count an
        expected number of accepted tokens)."""
        self.windows.append(drafted)
        self.accepted_per_window.append(accepted)
        self.drafted += drafted
        self.accepted += accepted

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.2f}s ({self.tokens_per_s:.2f} tok/s); "
            f"target forwards {self.target_forwards}, draft forwards {self.draft_forwards}, "
            f"accepted {self.accepted}/{self.drafted} drafted ({100 * self.acceptance_rate:.0f}%)"
            + (
                f"; {self.recomputed_tokens} tokens re-run (a cache could not be cropped)"
                if self.recomputed_tokens
                else ""
            )
            + (f"; {self.padded_tokens} filler tokens padded forwards to captured widths" if self.padded_tokens else "")
        )

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "windows": self.windows,
            "accepted_per_window": self.accepted_per_window,
            "prefill_s": self.prefill_s,
            "cache_rollback": "recompute" if self.recomputed_tokens else "crop",
            "recomputed_tokens": self.recomputed_tokens,
            "padded_tokens": self.padded_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass
class GenResult:
    tokens: list[int]  # generated token ids (prompt excluded)
    stats: GenStats
