"""Weight merging of models of one architecture: weighted averaging, task arithmetic and TIES.

    params = merge_params("average", [p_a, p_b], names=["a", "b"], weights=[0.5, 0.5])
    params = merge_params("task_arithmetic", [p_a, p_b], names=["a", "b"], base=p_0, scale=2.0)
    params = merge_params("ties", [p_a, p_b], names=["a", "b"], base=p_0, density=0.2)
    merge_folders("average", ["runs/a", "runs/b/export"], "runs/avg")   # launch.merge

Parameters are nested dicts of arrays (``nnx.to_pure_dict`` of the models); both merges
are pure functions of them, computed in float64 on the host.

* **average**: ``sum_i w_i x_i`` with the weights normalised to sum 1, written as
  ``x_0 + sum_i w_i (x_i - x_0)`` so that the average of identical models is the model,
  bit for bit.
* **task arithmetic** (Ilharco et al., 2023, "Editing Models with Task Arithmetic"):
  ``base + scale * sum_i w_i (x_i - base)``, the weights normalised to sum 1: the
  weighted mean task vector, scaled. ``scale`` 1 is the weighted average of the inputs;
  above 1 it extrapolates along the inputs' shared update (runs from one start whose
  individual updates are partly noise average that noise down, and ``scale`` restores
  the size of what they share).
* **TIES** (Yadav et al., 2023, "TIES-Merging"): task vectors ``t_i = x_i - base``;
  *trim* each to its ``density`` fraction of largest magnitudes per tensor (the others
  set to 0); *elect* a sign per entry, the sign of the weighted sum ``sum_i w_i t_i``
  (the side with more mass); *disjoint mean*: the weighted mean of the trimmed ``t_i``
  whose sign agrees with the elected one (entries where none agrees stay 0); add back
  to the base. ``k = max(1, round(density * n))`` entries are kept per tensor of ``n``
  entries; equal magnitudes are kept in index order.

Inputs (:func:`resolve_input`) are Hugging Face folders (``config.json`` +
safetensors) or training workdirs of ours: the workdir's ``export/`` when the run
finished, else its latest complete checkpoint (``model_factory.load_frozen``). The
merged folder is written with ``models.save_hf`` in the first input's dtype, with the
first input's tokenizer, processor, generation and run-config files (an export's are
copied; a workdir's are written by ``train.export.write_serving_files``), plus
``merge.json`` naming the method, inputs and weights. The folder appears whole or not at
all (``guilibra_jax.atomic``), and a half-written export or merge given as an input is
refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from typing import Any, Mapping, Sequence

import numpy as np

from guilibra_jax import atomic
from guilibra_jax.errors import UserError

log = logging.getLogger(__name__)

METHODS = ("average", "task_arithmetic", "ties")
NEEDS_BASE = ("task_arithmetic", "ties")
MERGE_FILE = "merge.json"
VOCAB_TENSORS = ("embed", "lm_head")   # tensors whose rows are the vocabulary


# ----------------------------------------------------------------------------- pure merges

def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a.b": x}`` (the tensor names of error messages)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def unflatten(flat: Mapping[str, Any], like: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The inverse of :func:`flatten`, in the structure (and key types) of ``like``."""
    return {k: unflatten(flat, v, f"{prefix}{k}.") if isinstance(v, Mapping) else flat[f"{prefix}{k}"]
            for k, v in like.items()}


def _weights(weights: Sequence[float] | None, n: int, normalise: bool) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (n,):
        raise UserError(f"--weights has {w.size} values for {n} inputs: give one weight per input")
    if (w < 0).any() or w.sum() <= 0:
        raise UserError(f"--weights={list(w)}: weights must be >= 0 with a positive sum")
    return w / w.sum() if normalise else w


def average_tensors(xs: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """Weighted mean of same-shape arrays, in the first one's dtype (module docstring)."""
    w = _weights(weights, len(xs), normalise=True)
    x0 = np.asarray(xs[0], np.float64)
    out = x0.copy()
    for wi, x in zip(w[1:], xs[1:]):
        out += wi * (np.asarray(x, np.float64) - x0)
    return out.astype(np.asarray(xs[0]).dtype)


def task_arithmetic_tensors(xs: Sequence[np.ndarray], base: np.ndarray, scale: float = 1.0,
                            weights: Sequence[float] | None = None) -> np.ndarray:
    """``base + scale * sum_i w_i (x_i - base)`` (weights normalised), in the base's dtype."""
    if not np.isfinite(scale) or scale <= 0:
        raise UserError(f"--scale={scale}: expected a finite number > 0")
    w = _weights(weights, len(xs), normalise=True)
    b = np.asarray(base, np.float64)
    tau = sum(wi * (np.asarray(x, np.float64) - b) for wi, x in zip(w, xs))
    return (b + scale * tau).astype(np.asarray(base).dtype)


def trim(tau: np.ndarray, density: float) -> np.ndarray:
    """``tau`` with all but its ``max(1, round(density * n))`` largest magnitudes zeroed."""
    flat = np.asarray(tau).reshape(-1)
    k = max(1, int(round(density * flat.size)))
    if k >= flat.size:
        return np.asarray(tau).copy()
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(np.shape(tau))


def ties_tensors(xs: Sequence[np.ndarray], base: np.ndarray, density: float = 0.2,
                 weights: Sequence[float] | None = None) -> np.ndarray:
    """TIES merge of same-shape arrays ``xs`` against ``base`` (module docstring)."""
    if not 0.0 < density <= 1.0:
        raise UserError(f"--ties_density={density}: expected a fraction in (0, 1]")
    w = _weights(weights, len(xs), normalise=False)
    b = np.asarray(base, np.float64)
    taus = np.stack([trim(np.asarray(x, np.float64) - b, density) for x in xs])   # [n, ...]
    wb = w.reshape((-1,) + (1,) * b.ndim)
    elected = np.sign((wb * taus).sum(0))
    agree = (np.sign(taus) == elected) & (taus != 0)
    num = (wb * taus * agree).sum(0)
    den = (wb * agree).sum(0)
    merged = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return (b + merged).astype(np.asarray(base).dtype)


def merge_params(method: str, params: Sequence[Mapping[str, Any]], *, names: Sequence[str],
                 weights: Sequence[float] | None = None, base: Mapping[str, Any] | None = None,
                 base_name: str = "--base", density: float = 0.2, scale: float = 1.0) -> dict[str, Any]:
    """Merge parameter trees (nested dicts of arrays) of one architecture; ``names``
    label the inputs in errors (UserError naming the tensor and the inputs)."""
    if method not in METHODS:
        raise UserError(f"--method={method!r} is invalid: expected one of {METHODS}")
    if method in NEEDS_BASE and base is None:
        raise UserError(f"--method={method} needs --base (the model the inputs were fine-tuned from)")
    flats = [flatten(p) for p in params]
    trees, labels = list(flats), list(names)
    if base is not None:
        trees.append(flatten(base))
        labels.append(base_name)
    check_same_tensors(trees, labels)
    out = {}
    for name in flats[0]:
        xs = [np.asarray(f[name]) for f in flats]
        if method == "average":
            out[name] = average_tensors(xs, weights)
        elif method == "task_arithmetic":
            out[name] = task_arithmetic_tensors(xs, np.asarray(trees[-1][name]), scale, weights)
        else:
            out[name] = ties_tensors(xs, np.asarray(trees[-1][name]), density, weights)
    return unflatten(out, params[0])


def check_same_tensors(flats: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
    """UserError naming the first tensor that some input lacks or holds in another shape."""
    first = flats[0]
    for f, n in zip(flats[1:], names[1:]):
        for t in sorted(set(first) ^ set(f)):
            has, lacks = (names[0], n) if t in first else (n, names[0])
            raise UserError(f"tensor {t} is in {has} but not in {lacks}: the inputs are not one architecture")
        for t in first:
            if np.shape(first[t]) != np.shape(f[t]):
                what = ("have different vocabularies" if any(v in t for v in VOCAB_TENSORS)
                        else "are not one architecture")
                raise UserError(f"tensor {t} has shape {tuple(np.shape(first[t]))} in {names[0]} but "
                                f"{tuple(np.shape(f[t]))} in {n}: the inputs {what}")


# ----------------------------------------------------------------------------- folders

@dataclasses.dataclass
class Input:
    """One model to merge: ``path`` as given, ``weights`` the folder loaded (an HF
    folder, or a workdir for its latest checkpoint), ``files`` the folder whose
    tokenizer / serving files describe it (an HF folder) or "" (a workdir: written)."""

    path: str
    weights: str
    files: str


def _has_weights(path: str) -> bool:
    return os.path.isdir(path) and any(f.endswith(".safetensors") for f in os.listdir(path))


def resolve_input(path: str, flag: str = "--inputs") -> Input:
    """An HF folder; a training workdir's ``export/`` (a finished run) or its latest
    checkpoint. UserError for anything else, and for a half-written output of ours."""
    atomic.check_complete(path, flag)
    if _has_weights(path):
        return Input(path, path, path)
    if os.path.isdir(os.path.join(path, "checkpoints")) and os.path.exists(os.path.join(path, "config.json")):
        export = os.path.join(path, "export")
        if _has_weights(export):
            return Input(path, export, export)
        return Input(path, path, "")
    raise UserError(f"{flag}: {path!r} is neither a Hugging Face folder (config.json + *.safetensors) nor a "
                    f"training workdir (config.json + checkpoints/)")


def _load(inp: Input, flag: str):
    from guilibra_jax.train import model_factory
    try:
        return model_factory.load_frozen(inp.weights, dtype="float32", param_dtype="float32")
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"{flag}: {inp.path}: {e}") from None


def _stored_dtype(inp: Input) -> str:
    """The dtype the input's weights are stored in (the merged folder is written in it)."""
    if inp.files:
        with open(os.path.join(inp.files, "config.json")) as f:
            cfg = json.load(f)
        return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    from guilibra_jax.train import config as run_config
    return str(run_config.load_run_config(inp.path).model.param_dtype)


def _tokenizer_digest(folder: str) -> str | None:
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        tok = json.load(f)
    vocab = {"vocab": (tok.get("model") or {}).get("vocab"), "added": tok.get("added_tokens")}
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest()


def _tokenizer_folder(inp: Input) -> str:
    if inp.files:
        return inp.files
    from guilibra_jax.train import config as run_config
    run = run_config.load_run_config(inp.path)
    return run.tokenizer.path or run.model.hf_path or os.path.join(inp.path, "tokenizer")


def check_families(configs: Sequence[Any], labels: Sequence[str]) -> None:
    for c, label in zip(configs[1:], labels[1:]):
        if c.family != configs[0].family:
            raise UserError(f"{labels[0]} is a {configs[0].family} model but {label} is a {c.family} model: the "
                            f"inputs are not one architecture")


def check_architectures(configs: Sequence[Any], inputs: Sequence[Input], labels: Sequence[str]) -> None:
    """UserError naming what differs (after the tensors matched): the vocabulary (the
    tokenizer's tokens) or another architecture field."""
    c0, t0 = configs[0], _tokenizer_digest(_tokenizer_folder(inputs[0]))
    for c, inp, label in zip(configs[1:], inputs[1:], labels[1:]):
        if c.text.vocab_size != c0.text.vocab_size:
            raise UserError(f"tensor embed_tokens (vocab_size) has {c0.text.vocab_size} rows in {labels[0]} but "
                            f"{c.text.vocab_size} in {label}: the inputs have different vocabularies")
        t = _tokenizer_digest(_tokenizer_folder(inp))
        if t0 is not None and t is not None and t != t0:
            raise UserError(f"the tokenizer.json of {labels[0]} and of {label} hold different tokens: the inputs "
                            f"have different vocabularies")
        if c != c0:
            diff = [f"{part}.{f.name}" for part in ("text", "vision")
                    for f in dataclasses.fields(getattr(c0, part))
                    if getattr(getattr(c0, part), f.name) != getattr(getattr(c, part), f.name)]
            diff += [f.name for f in dataclasses.fields(c0) if f.name not in ("text", "vision")
                     and getattr(c0, f.name) != getattr(c, f.name)]
            raise UserError(f"{labels[0]} and {label} differ in architecture ({', '.join(diff)}): the inputs are "
                            f"not one architecture")


def write_files(out: str, inp: Input, model_config) -> None:
    """The first input's tokenizer and serving files into ``out``."""
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source
    from guilibra_jax.train import export as E
    if inp.files:
        for f in E.TOKENIZER_FILES + E.PROCESSOR_FILES + (E.RUN_CONFIG_FILE,):
            if os.path.exists(os.path.join(inp.files, f)):
                shutil.copy(os.path.join(inp.files, f), os.path.join(out, f))
        return
    config = run_config.load_run_config(inp.path)
    tokenizer = data_source.prepare_tokenizer(config, inp.path)
    E.write_serving_files(out, config, tokenizer, model_config.family, source_dir=config.model.hf_path or "",
                          model_config=model_config)


def merge_folders(method: str, inputs: Sequence[str], out: str, *, weights: Sequence[float] | None = None,
                  base: str = "", density: float = 0.2, scale: float = 1.0) -> str:
    """Merge the models ``inputs`` (HF folders or workdirs) into the HF folder ``out``."""
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train import model_factory

    if method not in METHODS:
        raise UserError(f"--method={method!r} is invalid: expected one of {METHODS}")
    least = 1 if method == "task_arithmetic" else 2    # (one run's own update, scaled)
    if len(inputs) < least:
        raise UserError(f"--inputs={','.join(inputs)!r}: --method={method} needs at least {least} input models")
    if method in NEEDS_BASE and not base:
        raise UserError(f"--method={method} needs --base (the model the inputs were fine-tuned from)")
    if method == "task_arithmetic" and (not np.isfinite(scale) or scale <= 0):
        raise UserError(f"--scale={scale}: expected a finite number > 0")
    atomic.check_replaceable(out)   # before the models are loaded
    resolved = [resolve_input(p) for p in inputs] + ([resolve_input(base, "--base")] if base else [])
    labels = [f"--inputs {p}" for p in inputs] + ([f"--base {base}"] if base else [])
    _weights(weights, len(inputs), normalise=False)
    loaded = [_load(r, lab.split()[0]) for r, lab in zip(resolved, labels)]
    configs = [mc for _, _, mc in loaded]
    check_families(configs, labels)
    params = [p for _, p, _ in loaded]
    check_same_tensors([flatten(p) for p in params], labels)
    check_architectures(configs, resolved, labels)
    merged = merge_params(method, params[:len(inputs)], names=labels[:len(inputs)], weights=weights,
                          base=params[-1] if base else None, base_name=labels[-1], density=density,
                          scale=scale)
    graphdef, _, model_config = loaded[0]
    dtype = model_factory.dtype_of(_stored_dtype(resolved[0]), "dtype")
    model = nnx.merge(graphdef, merged)
    with atomic.writing_folder(out) as tmp:   # whole or not at all: <out>.tmp-<pid>, renamed when complete
        M.save_hf(model, model_config, tmp, dtype=dtype)
        write_files(tmp, resolved[0], model_config)
        with open(os.path.join(tmp, MERGE_FILE), "w") as f:
            json.dump({"method": method, "inputs": list(inputs), "loaded_from": [r.weights for r in resolved],
                       "weights": list(weights) if weights is not None else None, "base": base or None,
                       "ties_density": density if method == "ties" else None,
                       "scale": scale if method == "task_arithmetic" else None}, f, indent=2)
            f.write("\n")
    log.info("merged %s (%s) into %s", inputs, method, out)
    return out
