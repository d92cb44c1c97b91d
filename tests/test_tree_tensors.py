"""LightGBM's trees as tensor ops (disco/policies/tree_tensors.py): every row reaches the leaf booster.predict reaches, and
P(accept) equals the booster's, NaN and zero handling included; what the form cannot hold is left to LightGBM."""

from __future__ import annotations

import lightgbm
import numpy as np
import pytest
import torch

from disco.core.features import FEATURES
from disco.policies.artifact import load_artifact
from disco.policies.tree_tensors import TreeTensors

F = len(FEATURES)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    """Feature rows in the ranges disco computes (probabilities, positions, flags), float32 as the proposer's."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, F))
    X[:, FEATURES.index("gen_pos")] *= 300
    X[:, FEATURES.index("window_pos")] = rng.integers(1, 9, n)
    X[:, FEATURES.index("prev_accepted")] = rng.integers(0, 9, n)
    return X.astype(np.float32).astype(np.float64)


def _booster(X: np.ndarray, **params) -> lightgbm.Booster:
    y = (X[:, 0] + 0.3 * np.nan_to_num(X[:, 1]) > 0.6).astype(int)
    base = {"objective": "binary", "num_leaves": 15, "verbose": -1, "min_data_in_leaf": 5, "seed": 0}
    return lightgbm.train({**base, **params}, lightgbm.Dataset(X, y), num_boost_round=30)


def _same(booster: lightgbm.Booster, columns: list[int], X: np.ndarray) -> None:
    trees = TreeTensors.from_booster(booster, columns)
    assert trees is not None
    x = torch.tensor(X)
    sub = X[:, columns]
    assert np.array_equal(trees.leaves(x).numpy(), booster.predict(sub, pred_leaf=True))
    np.testing.assert_allclose(trees(x).numpy(), booster.predict(sub), rtol=0, atol=1e-12)


def test_the_shipped_vllm_artifact_on_random_rows():
    model = load_artifact("models/embedded-qwen2.5-coder-vllm").model
    _same(model.booster, model.columns, _rows(3000))


def test_one_row_gives_a_scalar():
    model = load_artifact("models/embedded-qwen2.5-coder-vllm").model
    trees = TreeTensors.from_booster(model.booster, model.columns)
    assert trees is not None
    x = torch.tensor(_rows(1)[0])
    assert trees(x).shape == () and float(trees(x)) == pytest.approx(model.predict_proba(x.numpy())[0], abs=1e-12)


def test_missing_values_nan_and_zero():
    X = _rows(2000, seed=1)
    rng = np.random.default_rng(2)
    holes = rng.random(X.shape) < 0.15
    X_nan = np.where(holes, np.nan, X)
    columns = list(range(F))
    _same(_booster(X_nan), columns, X_nan)  # missing type NaN: NaN goes the split's default way
    X_zero = np.where(holes, 0.0, X)
    _same(_booster(X_zero, zero_as_missing=True), columns, X_zero)  # missing type Zero
    _same(_booster(X), columns, np.where(holes, np.nan, X))  # no missing values in training: NaN reads as 0


def test_a_column_subset():
    X = _rows(1500, seed=3)
    columns = [0, 1, 10, 11, 12, 22, 23]
    _same(_booster(X[:, columns]), columns, X)


def test_categorical_splits_stay_with_lightgbm():
    X = _rows(1000, seed=4)
    X[:, 2] = np.random.default_rng(5).integers(0, 6, len(X))
    y = (X[:, 2] % 2 == 0).astype(int)
    data = lightgbm.Dataset(X, y, categorical_feature=[2])
    booster = lightgbm.train({"objective": "binary", "verbose": -1, "num_leaves": 7}, data, num_boost_round=5)
    assert TreeTensors.from_booster(booster, list(range(F))) is None
    regression = lightgbm.train({"objective": "regression", "verbose": -1}, lightgbm.Dataset(X, y), num_boost_round=3)
    assert TreeTensors.from_booster(regression, list(range(F))) is None
