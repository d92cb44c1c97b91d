"""The trace schema: one Parquet row per draft position of a prompt's target continuation.

Written by `disco collect`, read by the simulator and the trainer. Rows of one prompt are
stored in generation order (gen_pos = 0, 1, ...), one row for EVERY position of the target's
continuation y (greedy, or sampled: see disco/collect.py), so that any policy can be replayed: `oracle_drafted` marks the rows
the oracle loop actually drafts (it never drafts the bonus token after a window that was
accepted whole), and the window columns describe the oracle's windows.
"""

from __future__ import annotations

from disco.features import FEATURES, TargetSignals

ID_COLUMNS = (
    "prompt_id",  # str: the prompt's id
    "task",  # str: the prompt's task (code, explain, write, ...)
    "gen_pos",  # int: index in the continuation y (also a feature)
    "window_id",  # int: index of the oracle window holding this position (-1: bonus position)
    "oracle_drafted",  # bool: the oracle loop drafts this position
)
LABEL_COLUMNS = (
    "label",  # int 0/1: the target accepts draft_token here (greedy: it equals y; sampled: collect.coupled_draft)
    "draft_token",  # int: the draft's token (greedy: its argmax; sampled: drawn given y, collect.coupled_draft)
    "target_token",  # int: y at this position
    "draft_prob",  # float: the draft's probability of draft_token
    "target_prob",  # float: the target's probability of draft_token
    "accept_prob",  # float: min(1, target_prob / draft_prob), Leviathan's acceptance probability (the soft label)
    "overlap",  # float: 1 - TV(target, draft) = sum_x min(p(x), q(x)), acceptance rate when sampling
    "target_top1",  # float: the target's top-1 probability (its probability of target_token under greedy)
    "target_entropy",  # float: the target's entropy here (nats); with the next two, the target-side signals
    "target_prob_target",  # float: the target's probability of target_token (= target_top1 under greedy)
    "draft_prob_target",  # float: the draft's probability of target_token
)
HIDDEN_COLUMN = "draft_hidden"  # bytes: the draft's last hidden state here, float16 (manifest "hidden")
# gen_pos is both an id column and a feature: listed once.
COLUMNS = ID_COLUMNS + tuple(f for f in FEATURES if f not in ID_COLUMNS) + LABEL_COLUMNS + (HIDDEN_COLUMN,)
MANIFEST = "manifest.json"


def signals_at(target_prob_target: float, target_entropy: float, draft_prob_target: float,
               rejected: bool) -> TargetSignals:
    """The TargetSignals a window ending at a trace position hands to the next one: the live loop's
    features.target_signals at the target's own token (traces older than disco-trace/3 give the
    target's top-1 probability, the same number under greedy decoding)."""
    return TargetSignals(rejected, float(target_prob_target), float(target_entropy),
                         float(target_prob_target) - float(draft_prob_target) if rejected else 0.0)
