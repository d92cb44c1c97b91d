"""A LightGBM booster's trees as tensor operations (docs/architecture.md, "vLLM's own draft"): P(accept) of a batch
of feature rows in a few tensor ops on the rows' device, with no call to LightGBM and no copy to the host.

Each tree's path to each of its leaves is a set of required directions: leaf l of tree t is reached when all of
the depth(l) decisions on its path go its way. With go_left[b, t, n] the decision of node n for row b, the number
of decisions that go leaf l's way is go_left @ (W_left - W_right) + (the number of right turns on its path), an
exact small integer in float64: a row reaches the leaf where that count equals the leaf's depth (the GEMM form of
tree evaluation, as in Hummingbird). The decision itself is LightGBM's (tree.h, NumericalDecision): fval <=
threshold in double, NaN read as 0 unless the split sends missing values its default way. Categorical splits,
linear trees, random forests and objectives other than binary: `from_booster` returns None (the booster's own
predict runs them).
"""

from __future__ import annotations

from typing import Any

import torch

_ZERO = 1e-35  # LightGBM's kZeroThreshold: |x| at most this is "zero" for a split whose missing type is Zero
_MISSING = {"None": 0, "Zero": 1, "NaN": 2}
Walked = tuple[list[dict], list[tuple[dict, tuple]]]  # a tree's internal nodes; its leaves with their paths


class TreeTensors:
    """The trees of a binary LightGBM booster over `columns` of the feature rows, on one device."""

    def __init__(self, nodes: list[Walked], sigmoid: float, columns: list[int], device: Any = "cpu") -> None:
        """nodes: each tree's internal nodes and leaves with their paths (_walk)."""
        n_max = max(1, max(len(inner) for inner, _ in nodes))
        l_max = max(len(leaves) for _, leaves in nodes)
        T = len(nodes)
        feat = torch.zeros(T, n_max, dtype=torch.long)
        thr = torch.zeros(T, n_max, dtype=torch.float64)
        default_left = torch.zeros(T, n_max, dtype=torch.bool)
        missing = torch.zeros(T, n_max, dtype=torch.long)
        turns = torch.zeros(T, n_max, l_max, dtype=torch.float64)  # +1: the leaf needs left there, -1: right
        rights = torch.zeros(T, l_max, dtype=torch.float64)
        depth = torch.full((T, l_max), -1.0, dtype=torch.float64)  # padding: never reached
        value = torch.zeros(T, l_max, dtype=torch.float64)
        leaf_id = torch.zeros(T, l_max, dtype=torch.long)
        for t, (inner, leaves) in enumerate(nodes):
            for n, node in enumerate(inner):
                feat[t, n], thr[t, n] = node["split_feature"], node["threshold"]
                default_left[t, n], missing[t, n] = bool(node["default_left"]), _MISSING[node["missing_type"]]
            for j, (leaf, path) in enumerate(leaves):
                value[t, j], leaf_id[t, j], depth[t, j] = leaf["leaf_value"], leaf.get("leaf_index", 0), len(path)
                for n, left in path:
                    turns[t, n, j] = 1.0 if left else -1.0
                    rights[t, j] += 0.0 if left else 1.0
        self.sigmoid = sigmoid
        to = lambda a: a.to(device)  # noqa: E731
        self.columns = torch.as_tensor(columns, dtype=torch.long, device=device)
        self.feat, self.thr, self.default_left, self.missing = to(feat), to(thr), to(default_left), to(missing)
        self.turns, self.rights, self.depth, self.value, self.leaf_id = (
            to(turns),
            to(rights),
            to(depth),
            to(value),
            to(leaf_id),
        )

    @classmethod
    def from_booster(cls, booster: Any, columns: list[int], device: Any = "cpu") -> TreeTensors | None:
        """The booster's trees (as its predict() uses them), or None where they hold what this form does not."""
        model = booster.dump_model()
        objective = str(model.get("objective", "")).split()
        if not objective or objective[0] != "binary" or model.get("average_output") or not model.get("tree_info"):
            return None
        sigmoid = next((float(o.split(":")[1]) for o in objective[1:] if o.startswith("sigmoid:")), 1.0)
        nodes = [_walk(tree["tree_structure"]) for tree in model["tree_info"]]
        for inner, leaves in nodes:
            if any(n.get("decision_type") != "<=" or n.get("missing_type") not in _MISSING for n in inner):
                return None  # categorical splits
            if any("leaf_coeff" in leaf for leaf, _ in leaves):
                return None  # linear trees
        return cls(nodes, sigmoid, columns, device)

    def _hits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, L) bool: the leaf each row reaches in each tree. x: (B, F) rows, FEATURES order."""
        v = x.double()[:, self.columns][:, self.feat]  # (B, T, N): each node's feature value
        nan = v.isnan()
        v = torch.where(nan & (self.missing != 2), 0.0, v)  # NaN reads as 0 unless missing values are NaN here
        left = v <= self.thr
        to_default = ((self.missing == 1) & (v.abs() <= _ZERO)) | ((self.missing == 2) & nan)
        left = torch.where(to_default, self.default_left, left)
        matches = torch.einsum("btn,tnl->btl", left.double(), self.turns) + self.rights
        return matches == self.depth

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(F,) or (B, F) rows -> 0-dim or (B,) P(accept) in float64, on x's device."""
        rows = x.reshape(-1, x.shape[-1])
        raw = (self._hits(rows) * self.value).sum((1, 2))
        return torch.sigmoid(self.sigmoid * raw).reshape(x.shape[:-1])

    def leaves(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) the index of the leaf each row reaches in each tree (= booster.predict(pred_leaf=True))."""
        hits = self._hits(x.reshape(-1, x.shape[-1]))
        return (hits * self.leaf_id).sum(2)


def _walk(node: dict) -> Walked:
    """A dumped tree's internal nodes (in the order numbered here) and its leaves with their paths ((node
    number, went left), ...)."""
    inner: list[dict] = []
    leaves: list[tuple[dict, tuple]] = []

    def visit(n: dict, path: tuple) -> None:
        if "split_feature" not in n:
            leaves.append((n, path))
            return
        i = len(inner)
        inner.append(n)
        visit(n["left_child"], (*path, (i, True)))
        visit(n["right_child"], (*path, (i, False)))

    visit(node, ())
    return inner, leaves
