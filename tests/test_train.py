"""The trainer and the classifier artifact: grouped split, threshold chosen by simulated speedup,
identical predictions after a round trip, refusal of tampered or mismatched artifacts, clear
errors on bad inputs, `disco train` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import PAIR, cli, counts, random_traces, synthetic_trace, write_traces

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TARGET_SIGNALS
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.policies.artifact import JoblibModel, load_artifact, rehash_artifact, save_artifact
from disco.policies.classifier import ClassifierPolicy
from disco.training.fitting import fit_model
from disco.training.simulate import replay_policy, simulate
from disco.training.train import TrainConfig, train
from disco.training.train_data import load_trace_data, split_by_prompt, traces_for
from disco.training.tuning import RULE_GRIDS, THRESHOLD_GRID, tune


@pytest.fixture(scope="module")
def traces_dir(tmp_path_factory):
    return write_traces(tmp_path_factory.mktemp("traces") / "t", random_traces(30, 50, seed=0))


@pytest.fixture(scope="module")
def data(traces_dir):
    d = load_trace_data([traces_dir])
    rows = d.rows
    train_mask, val_mask = split_by_prompt(rows["prompt_id"].to_numpy(), 0.25, 0)
    drafted = rows["oracle_drafted"].to_numpy(bool)
    X, y = rows[list(FEATURES)].to_numpy(float), rows["label"].to_numpy(int)
    return d, X, y, train_mask & drafted, val_mask & drafted, traces_for(d, val_mask)


# --- split and threshold -------------------------------------------------------------------------


def test_split_is_by_prompt(data):
    rows = data[0].rows
    ids = rows["prompt_id"].to_numpy()
    for seed in range(5):
        train_mask, val_mask = split_by_prompt(ids, 0.25, seed, rows["task"].to_numpy())
        assert (train_mask ^ val_mask).all()  # every row on exactly one side
        train_ids, val_ids = set(ids[train_mask]), set(ids[val_mask])
        assert not train_ids & val_ids
        assert len(val_ids) == 8 and len(train_ids | val_ids) == 30  # round(0.25 * 15) per task
        val_tasks = rows.loc[val_mask].groupby("task")["prompt_id"].nunique().to_dict()
        assert val_tasks == {"code": 4, "write": 4}  # stratified: every task measured
    with pytest.raises(DiscoError, match="val_fraction"):
        split_by_prompt(ids, 1.0, 0)


def test_mt_bench_prompts_keep_their_fixed_split_and_the_others_are_drawn_as_before(data):
    from disco.formats.mtbench import load_split

    rows = data[0].rows
    ids, tasks = rows["prompt_id"].to_numpy(), rows["task"].to_numpy()
    before = split_by_prompt(ids, 0.25, 3, tasks)
    split = load_split()
    train_q = sorted(q for q, (_, side) in split.items() if side == "train")[:3]
    val_q = sorted(q for q, (_, side) in split.items() if side == "val")[:2]
    extra = [f"mt-bench-{q}" for q in train_q + val_q] + [f"mt-bench-2-{val_q[0]}", f"mt-bench-2-{train_q[0]}"]
    all_ids = np.concatenate([ids, extra])
    all_tasks = np.concatenate([tasks, ["coding"] * len(extra)])
    train_mask, val_mask = split_by_prompt(all_ids, 0.25, 3, all_tasks)
    n = len(ids)
    assert (train_mask[:n] == before[0]).all() and (val_mask[:n] == before[1]).all()  # unchanged
    assert set(all_ids[n:][val_mask[n:]]) == {f"mt-bench-{q}" for q in val_q} | {f"mt-bench-2-{val_q[0]}"}
    assert set(all_ids[n:][train_mask[n:]]) == {f"mt-bench-{q}" for q in train_q} | {f"mt-bench-2-{train_q[0]}"}
    test_q = min(q for q, (_, side) in split.items() if side == "test")
    with pytest.raises(DiscoError, match=rf"1 MT-Bench test prompt\(s\) \(mt-bench-2-{test_q}\).*mt-bench:train\+val"):
        split_by_prompt(np.concatenate([ids, [f"mt-bench-2-{test_q}"]]), 0.25, 3, np.concatenate([tasks, ["x"]]))
    # an id that only looks like one (no question number MT-Bench has) is drawn like any other
    assert split_by_prompt(np.array(["mt-bench-9999", "mt-bench-x", "a", "b"]), 0.5, 0)[1].sum() == 2


def test_threshold_is_the_argmax_of_simulated_speedup(data):
    _, X, y, tr, _, val_traces = data
    model = fit_model("logistic", X[tr], y[tr])
    cost = CostModel.default(20)
    tuned = tune(
        val_traces, lambda t: replay_policy("classifier", classifier_setting=t, model=model), THRESHOLD_GRID, cost, 20
    )
    alone = {
        t: simulate(val_traces, replay_policy("classifier", classifier_setting=t, model=model), 20).speedup(cost)
        for t in THRESHOLD_GRID
    }
    assert tuned.speedups == pytest.approx(alone)
    assert tuned.best == max(THRESHOLD_GRID, key=lambda t: (alone[t], -t))
    assert len(set(np.round(list(alone.values()), 6))) > 3  # the threshold matters on this data


def test_best_constant_is_the_longest_window_when_everything_is_accepted():
    from disco.training.simulate import prompt_traces

    traces = prompt_traces(synthetic_trace("a", [1] * 40))
    tuned = tune(traces, lambda k: replay_policy("constant", k=k), list(range(1, 9)), CostModel.default(8), 8)
    assert tuned.best == 8
    assert list(tuned.speedups.values()) == sorted(tuned.speedups.values())


# --- artifacts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lightgbm", "logistic", "mlp"])
def test_artifact_round_trip_predicts_identically(data, tmp_path, kind):
    _, X, y, tr, va, val_traces = data
    model = fit_model(kind, X[tr], y[tr], seed=1)
    save_artifact(tmp_path / "m", model, {"setting": 0.6, "pair": PAIR})
    art = load_artifact(tmp_path / "m", expect_pair=PAIR)
    assert art.kind == kind and art.setting == 0.6
    assert np.array_equal(art.predict_proba(X[va]), model.predict_proba(X[va]))
    assert art.predict_proba(X[0]).shape == (1,)
    predict = art.torch_predictor("cpu")  # the live path: (F,) tensor -> 0-dim probability
    live = [float(predict(torch.tensor(row, dtype=torch.float32))) for row in X[va][:20]]
    assert np.allclose(live, art.predict_proba(X[va][:20].astype(np.float32)), atol=1e-5)
    # the classifier policy simulates the same with the artifact as with the in-memory model
    a = simulate(val_traces, replay_policy("classifier", classifier_setting=0.6, model=model), 20)
    b = simulate(val_traces, replay_policy("classifier", classifier_setting=0.6, model=art), 20)
    assert [counts(s) for s in a.stats] == [counts(s) for s in b.stats]


@pytest.fixture()
def artifact(data, tmp_path):
    _, X, y, tr, _, _ = data
    return save_artifact(tmp_path / "m", fit_model("logistic", X[tr], y[tr]), {"setting": 0.5, "pair": PAIR})


def test_tampered_model_is_refused(artifact):
    model = json.loads((artifact / "model.json").read_text())
    model["layers"][0]["b"][0] += 1.0
    (artifact / "model.json").write_text(json.dumps(model))
    with pytest.raises(DiscoError, match="modified after training"):
        load_artifact(artifact)


def test_unknown_feature_is_refused(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["columns"][-1] = "draft_mood"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiscoError, match=r"reads features this disco does not compute \(draft_mood\)"):
        load_artifact(artifact)


def test_artifact_of_an_older_feature_list_loads_by_name(data, tmp_path):
    """An artifact written when FEATURES had no target-side signals reads its features by name."""
    _, X, y, tr, va, _ = data
    old = [i for i, f in enumerate(FEATURES) if f not in TARGET_SIGNALS]
    model = fit_model("logistic", X[tr], y[tr], old)
    folder = save_artifact(tmp_path / "old", model, {"setting": 0.5, "pair": PAIR})
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["features"] = [FEATURES[i] for i in old]  # what the older disco wrote
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rehash_artifact(folder)  # as that disco would have hashed it
    art = load_artifact(folder)
    assert art.columns == old
    assert np.array_equal(art.predict_proba(X[va]), model.predict_proba(X[va]))


def test_other_pair_is_refused(artifact):
    assert load_artifact(artifact, expect_pair={**PAIR, "target": "/moved/tiny-target"}).setting == 0.5
    with pytest.raises(DiscoError, match="another tokenizer"):
        load_artifact(artifact, expect_pair={**PAIR, "tokenizer_hash": "def"})
    with pytest.raises(DiscoError, match="trained for draft /models/tiny-draft, not other"):
        load_artifact(artifact, expect_pair={**PAIR, "draft": "other"})


def test_damaged_or_missing_artifact_is_refused(artifact, tmp_path):
    with pytest.raises(DiscoError, match="not a classifier artifact"):
        load_artifact(tmp_path / "nothing")
    (artifact / "manifest.json").write_text("{")
    with pytest.raises(DiscoError, match="not valid JSON"):
        load_artifact(artifact)


def test_pickled_model_needs_trust(data, tmp_path):
    from sklearn.tree import DecisionTreeClassifier

    _, X, y, tr, va, _ = data
    model = JoblibModel(DecisionTreeClassifier(max_depth=3).fit(X[tr], y[tr]))
    with pytest.raises(DiscoError, match="trust-pickle"):
        save_artifact(tmp_path / "p", model, {"setting": 0.5})
    save_artifact(tmp_path / "p", model, {"setting": 0.5}, trust_pickle=True)
    with pytest.raises(DiscoError, match="pickled model.*--trust-pickle"):
        load_artifact(tmp_path / "p")
    art = load_artifact(tmp_path / "p", trust_pickle=True)
    assert np.array_equal(art.predict_proba(X[va]), model.predict_proba(X[va]))


def test_wrong_feature_width_is_a_clear_error(artifact):
    with pytest.raises(DiscoError, match=f"rows of {len(FEATURES)} features"):
        load_artifact(artifact).predict_proba(np.zeros((2, 3)))


# --- bad inputs --------------------------------------------------------------------------------


def test_bad_inputs_are_clear_errors(tmp_path):
    good = random_traces(4, 20, seed=5)
    with pytest.raises(DiscoError, match="no traces given"):
        load_trace_data([])
    with pytest.raises(DiscoError, match="no trace folder"):
        load_trace_data([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiscoError, match="no .parquet trace shards"):
        load_trace_data([tmp_path / "empty"])
    ones = synthetic_trace("a", [1] * 20)
    with pytest.raises(DiscoError, match="every drafted token in the traces is accepted"):
        load_trace_data([write_traces(tmp_path / "ones", ones.assign(prompt_id=["a", "b"] * 10))])
    with pytest.raises(DiscoError, match="lack columns training needs: copy_1, copy_2"):
        load_trace_data([write_traces(tmp_path / "cols", good.drop(columns=["copy_1", "copy_2"]))])
    with pytest.raises(DiscoError, match="no manifest.json"):
        load_trace_data([write_traces(tmp_path / "nomanifest", good, manifest=False)])
    other = write_traces(
        tmp_path / "other", good.assign(prompt_id=good["prompt_id"] + "x"), pair={**PAIR, "tokenizer_hash": "zzz"}
    )
    with pytest.raises(DiscoError, match="different pairs"):
        load_trace_data([write_traces(tmp_path / "good", good), other])
    with pytest.raises(DiscoError, match="single prompt"):
        load_trace_data([write_traces(tmp_path / "one", good[good["prompt_id"] == "p0"])])
    with pytest.raises(DiscoError, match="unknown model 'svm'"):
        train(TrainConfig([tmp_path / "good"], tmp_path / "out", model="svm"))
    with pytest.raises(DiscoError, match="profile not found"):
        train(TrainConfig([tmp_path / "good"], tmp_path / "out", profile=tmp_path / "nope.json"))
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"c_d": 0.01, "c_t": [0.03, 0.031]}))
    with pytest.raises(DiscoError, match="rerun disco profile with --max-window 20"):
        train(TrainConfig([tmp_path / "good"], tmp_path / "out", profile=short))


# --- end to end ---------------------------------------------------------------------------------


def test_disco_train_command(traces_dir, tmp_path, capsys):
    out = tmp_path / "models" / "clf"
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"c_d": 0.004, "c_t": [0.01 * (1 + 0.03 * k) for k in range(9)]}))
    code, stdout, err = cli(
        capsys,
        "train",
        "--traces",
        traces_dir,
        "--out",
        out,
        "--model",
        "logistic",
        "--profile",
        profile,
        "--max-window",
        8,
        "--ablate",
        "--cross-task",
    )
    assert code == 0, err
    for policy in (
        "| oracle |",
        "| classifier (logistic, token rule) | token = ",
        "| classifier (logistic, cumulative rule) | cumulative = ",
        "| classifier (logistic, cost rule) | cost = ",
        "| threshold | tau = 0.4 (transformers)",
        "| constant | k = ",
        "| adaedl | lambda0 = 0.9 (paper) |",
        "| svip | h = 0.3 (paper's code) |",
        "| adaedl | lambda0 = ",
        "| svip | h = ",
        "| heuristic |",
        "ROC-AUC",
        "| all − copy_* |",
        "| all − class_* |",
        "| all − last_* |",
        "| DISCO inputs only | 12 |",
        "`--policy classifier` runs",
    ):
        assert policy in stdout, policy
    manifest = json.loads((out / "manifest.json").read_text())
    art = load_artifact(out, expect_pair=PAIR)
    assert art.setting == manifest["tuned"]["classifier_setting"] in RULE_GRIDS[art.rule]
    # the choice: the fastest of the learned policies and the tuned threshold, with its margin
    rows = {(r["policy"], r["setting"]): r["speedup"] for r in manifest["speedups"]}
    learned = max(v for (p, _), v in rows.items() if p.startswith("classifier"))
    tuned_thr = rows[("threshold", f"tau = {manifest['tuned']['threshold']:g} (tuned)")]
    choice = manifest["choice"]
    assert choice["speedup"] == pytest.approx(max(learned, tuned_thr))
    assert choice["policy"] == ("classifier" if learned > tuned_thr else "threshold")
    assert choice["margin_vs_threshold"] == pytest.approx(choice["speedup"] / tuned_thr)
    assert manifest["cost_model"]["source"] == str(profile)
    assert set(manifest["validation_metrics"]) >= {"roc_auc", "pr_auc", "log_loss", "accuracy"}
    assert manifest["training"]["traces"][0]["pair"] == PAIR
    assert set(manifest["training"]["val_prompt_ids"]) < {f"p{i}" for i in range(30)}
    # the ablation's "all features" row is the logistic model under the token rule, tuned the same way
    token_row = next(r for r in manifest["speedups"] if r["policy"] == "classifier (logistic, token rule)")
    token_t = float(token_row["setting"].split("= ")[1].split(" ")[0])
    assert token_row["speedup"] == pytest.approx(manifest["ablation"][1]["speedup"])
    assert (out / "metrics.md").read_text().startswith("# disco classifier")
    # per task: both tasks, their validation prompts partition the validation set
    per_task = {r["task"]: r for r in manifest["per_task"]}
    assert set(per_task) == {"code", "write"}
    assert sum(r["prompts"] for r in per_task.values()) == manifest["training"]["val_prompts"]
    assert "| code |" in stdout and "Train on one task, test on another" in stdout
    # cross-task: {code, write, all tasks} x {code, write}; trained on all tasks = the saved model,
    # so its classifier speedup on each task equals the per-task table's
    cross = {(r["train_task"], r["test_task"]): r for r in manifest["cross_task"]}
    assert set(cross) == {(a, b) for a in ("code", "write", "all tasks") for b in ("code", "write")}
    for task in ("code", "write"):
        row = cross[("all tasks", task)]
        assert row["threshold"] == token_t
        if manifest["rule"] == "token":
            assert row["classifier"] == pytest.approx(per_task[task]["classifier"])
        assert row["ratio"] == pytest.approx(row["classifier"] / row["tuned_threshold"])
    code, _, err = cli(capsys, "train", "--traces", tmp_path / "nope", "--out", out)
    assert code == 2 and err.count("\n") == 1 and "no trace folder" in err


def test_cross_task_shows_what_adding_a_trace_folder_changes(tmp_path):
    """With two --traces folders, cross-task also fits and tunes without each one ("all but FOLDER") and
    tests on every task: tau of "all but B" is the threshold tuned on A's validation prompts alone."""
    a = write_traces(tmp_path / "a", random_traces(20, 40, seed=1))
    b_rows = random_traces(12, 40, seed=2)
    b_rows = b_rows.assign(prompt_id="b" + b_rows["prompt_id"], task="chat")
    b = write_traces(tmp_path / "b", b_rows)
    cost = CostModel.default(8)
    report = train(
        TrainConfig([a, b], tmp_path / "out", model="logistic", max_window=8, cross_task=True, progress=False)
    )
    cross = {(r["train_task"], r["test_task"]): r for r in report.cross_task}
    arms = {r["train_task"] for r in report.cross_task}
    assert arms == {"code", "write", "chat", "all tasks", f"all but {a}", f"all but {b}"}
    assert {t for (arm, t) in cross if arm == f"all but {b}"} == {"code", "write", "chat"}
    data = load_trace_data([a, b])
    _, val_mask = split_by_prompt(data.rows["prompt_id"].to_numpy(), 0.2, 0, data.rows["task"].to_numpy())
    from_a = traces_for(data, val_mask & (data.rows["_source"].to_numpy() == 0))
    tau = tune(from_a, lambda th: replay_policy("threshold", threshold=th), THRESHOLD_GRID, cost, 8).best
    assert all(r["tau"] == tau for (arm, _), r in cross.items() if arm == f"all but {b}")
    md = report.markdown()
    assert f"What adding {b} changes" in md and f"What adding {a} changes" in md
    without, with_ = cross[(f"all but {b}", "chat")], cross[("all tasks", "chat")]
    change = with_["classifier"] / without["classifier"] - 1
    assert f"| chat | {without['classifier']:.3f} | {with_['classifier']:.3f} | {change:+.1%} |" in md


def test_no_target_signals_trains_a_model_that_does_not_read_them(traces_dir, tmp_path):
    """--no-target-signals (for vLLM, whose proposer never sees the target's probabilities): no last_*
    column among the model's inputs, so the live policy never asks for them."""
    assert load_trace_data([traces_dir]).features == list(range(len(FEATURES)))  # the traces hold them
    out = tmp_path / "clf"
    train(TrainConfig([traces_dir], out, model="logistic", max_window=8, progress=False, target_signals=False))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training"]["target_signals"] is False
    assert not set(manifest["columns"]) & set(TARGET_SIGNALS) and len(manifest["columns"]) == len(FEATURES) - 4
    art = load_artifact(out, expect_pair=PAIR)
    assert not ClassifierPolicy(art, 0.5).reads_signals
    train(TrainConfig([traces_dir], tmp_path / "with", model="logistic", max_window=8, progress=False))
    assert ClassifierPolicy(load_artifact(tmp_path / "with", expect_pair=PAIR), 0.5).reads_signals


def test_collect_train_and_decode_with_the_classifier(tmp_path):
    """The whole pipeline on a tiny pair: disco collect -> disco train -> the live classifier policy,
    lossless, and deciding as the simulator predicted on the validation prompts."""
    from tiny import char_tokenizer, tiny_pair

    from disco.formats.prompts import Prompt
    from disco.formats.trace import read_traces
    from disco.jobs.collect import collect
    from disco.loop.pair import pair_from_models
    from disco.training.simulate import prompt_traces

    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer(), "tiny")
    prompts = [Prompt(f"q{i}", "code", f"def f{i}(x): return x * {i} +") for i in range(16)]
    config = DecodeConfig(max_new_tokens=24, max_window=6)
    collect(pair, prompts, tmp_path / "traces", config, progress=False)
    report = train(
        TrainConfig(
            [tmp_path / "traces"], tmp_path / "clf", model="logistic", max_window=6, val_fraction=0.25, progress=False
        )
    )

    art = load_artifact(tmp_path / "clf", expect_pair=pair)
    chosen = ClassifierPolicy.for_pair(art, pair)  # what --policy classifier runs: what train chose
    if report.choice["policy"] == "classifier":
        assert (
            (chosen.rule, chosen.setting)
            == (art.rule, report.setting)
            == (report.choice["rule"], report.choice["setting"])
        )
    else:
        assert chosen.name == "threshold" and chosen.threshold == report.choice["setting"]
    assert art.hidden_dim == 0 or art.kind == "head"
    df = read_traces([tmp_path / "traces"])[0].rows
    val = set(report.split["val_prompt_ids"])
    # every rule, at a setting where it stops inside windows: lossless live, and the simulator's counts
    for rule, setting in (("token", 0.5), ("cumulative", 0.5), ("cost", 1.3), ("cost-adaptive", 1.3)):
        policy = ClassifierPolicy(
            art, setting, pair.token_classes(), rule, art.cost_model() or CostModel.default(6), art.projection()
        )
        exact = 0
        for prompt in prompts:
            if prompt.id not in val:
                continue
            ids = pair.encode(prompt.prompt)
            ref = target_generate(target, ids, config, pair.eos_token_ids).tokens
            real = speculative_generate(target, draft, ids, policy.fresh(), config, pair.eos_token_ids)
            assert real.tokens == ref
            sim = simulate(
                prompt_traces(df[df["prompt_id"] == prompt.id], 24),
                replay_policy(
                    "classifier", classifier_setting=setting, model=art, classifier_rule=rule, cost=policy.cost
                ),
                6,
            )
            s = sim.stats[0]
            assert (s.new_tokens, s.target_forwards) == (real.stats.new_tokens, real.stats.target_forwards)
            if sim.approx_drafts == 0 and len(ref) == 24:  # no draft past a mismatch or past EOS: exact
                assert counts(s) == counts(real.stats)
                exact += 1
        assert exact > 0, rule

    other = pair_from_models(target, draft, char_tokenizer(), "tiny")
    other.tokenizer.add_special_tokens({"bos_token": "<s>"})
    with pytest.raises(DiscoError, match="another tokenizer"):
        ClassifierPolicy.for_pair(tmp_path / "clf", other)


def test_train_on_a_batched_vllm_profile_chooses_the_rule_that_holds_up_under_load(traces_dir, tmp_path):
    """A load profile of vLLM's batched draft (c_step, c_draft): the choice is the learned rule whose worst ratio
    to the best fixed draft length over the concurrencies the profile covers is the highest, in lockstep
    simulation; every rule's ratios are recorded and reported."""
    c_step = [0.01 * (1 + 0.01 * t) for t in range(64)]
    profile = tmp_path / "load.json"
    profile.write_text(json.dumps({"c_d": 0.004, "c_t": c_step[:9], "c_step": c_step, "c_draft": [0.004] * 4}))
    out = tmp_path / "clf"
    report = train(TrainConfig([traces_dir], out, model="logistic", profile=profile, max_window=8))
    choice = json.loads((out / "manifest.json").read_text())["choice"]
    serving = choice["serving"]
    assert serving["levels"] == [1, 2, 4]  # c_draft covers 4 requests; 8 would need a wider profile
    ratios = {label: [r[str(b)] if str(b) in r else r[b] for b in serving["levels"]] for label, r in
              serving["x_best_fixed_length"].items()}  # fmt: skip
    assert set(ratios) == {f"logistic, {rule} rule" for rule in ("token", "cumulative", "cost", "cost-adaptive")}
    chosen = f"{choice['model']}, {choice['rule']} rule"
    assert min(ratios[chosen]) == max(min(r) for r in ratios.values())
    assert choice["policy"] == "classifier" and load_artifact(out, expect_pair=PAIR).rule == choice["rule"]
    assert "Chosen for vLLM's batched draft" in report.markdown() and f"| {chosen} |" in report.markdown()


def test_train_without_a_batched_profile_records_no_serving_choice(traces_dir, tmp_path):
    train(TrainConfig([traces_dir], tmp_path / "clf", model="logistic", max_window=8))
    assert "serving" not in json.loads((tmp_path / "clf" / "manifest.json").read_text())["choice"]
