"""The trace schema: one Parquet row per draft position of a prompt's target continuation.

Written by `disco collect`, read by the simulator and the trainer. Rows of one prompt are
stored in generation order (gen_pos = 0, 1, ...), one row for EVERY position of the target's
greedy continuation y, so that any policy can be replayed: `oracle_drafted` marks the rows
the oracle loop actually drafts (it never drafts the bonus token after a window that was
accepted whole), and the window columns describe the oracle's windows.
"""

from __future__ import annotations

from disco.features import FEATURES

ID_COLUMNS = (
    "prompt_id",  # str: the prompt's id
    "task",  # str: the prompt's task (code, explain, write, ...)
    "gen_pos",  # int: index in the continuation y (also a feature)
    "window_id",  # int: index of the oracle window holding this position (-1: bonus position)
    "oracle_drafted",  # bool: the oracle loop drafts this position
)
LABEL_COLUMNS = (
    "label",  # int 0/1: the draft's greedy token equals y here (the target accepts it)
    "draft_token",  # int: the draft's greedy token
    "target_token",  # int: y at this position
    "draft_prob",  # float: the draft's probability of draft_token
    "target_prob",  # float: the target's probability of draft_token
    "accept_prob",  # float: min(1, target_prob / draft_prob), Leviathan's acceptance probability
    "overlap",  # float: 1 - TV(target, draft) = sum_x min(p(x), q(x)), acceptance rate when sampling
    "target_top1",  # float: the target's top-1 probability (analysis only: never a feature)
)
# gen_pos is both an id column and a feature: listed once.
COLUMNS = ID_COLUMNS + tuple(f for f in FEATURES if f not in ID_COLUMNS) + LABEL_COLUMNS
MANIFEST = "manifest.json"
