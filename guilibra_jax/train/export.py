"""A complete Hugging Face export of a run: weights, tokenizer and chat template, and
the files a server needs to prompt the model as it was trained.

    export_model(graphdef, params, model_config, tokenizer, out, config)

is the one function every launcher uses (``launch.train`` at the end of a run through
``loop.finish_run``, ``launch.convert``, and a future ``launch.merge``). It writes:

* ``config.json`` + safetensors (``models.save_hf``);
* the tokenizer files and chat template: copied from ``model.hf_path`` when the run
  started from a Hugging Face folder (and used its tokenizer), else saved from the
  run's tokenizer (the demo's BPE);
* ``preprocessor_config.json`` with the run's pixel bounds: Qwen2.5-VL answers in
  pixels of the *resized* image, so a model served with another ``max_pixels`` clicks
  in another coordinate frame. A file copied from ``model.hf_path`` keeps its other
  keys; only the bounds are overwritten (``min_pixels`` / ``max_pixels`` and
  transformers 5's ``size.shortest_edge`` / ``size.longest_edge``, both written);
* ``generation_config.json``: Qwen's stop ids (``<|im_end|>``, ``<|endoftext|>``) and
  the run's sampling defaults (greedy for ASFT runs, as their held-out evaluation
  decodes; ``rl.temperature`` / ``top_p`` / ``top_k`` for GRPO / MOPD runs). Keys our
  sampler has no equivalent of (Qwen's ``repetition_penalty``) are reset, so that
  ``generate`` on the export decodes what our sampler decodes;
* ``run_config.json``: the run's resolved config (prompt template, method, pixel
  budgets), which evaluation agents read to prompt the served model as in training.

The folder appears whole or not at all: written into ``<out>.tmp-<pid>`` and renamed when
complete, with the completion marker that readers check (``guilibra_jax.atomic``).

Per-platform pixel budgets (``data.pixels.<platform>``): a server has one image
processor, so ``preprocessor_config.json`` gets the widest bounds (the smallest
``min_pixels`` and the largest ``max_pixels`` over the platforms) and
``run_config.json`` keeps each platform's. A client then resizes each screenshot to
its platform's budget itself (``smart_resize``; the ``endpoint`` agent does): an image
whose sides are multiples of the patch factor and whose area lies within the server's
bounds passes the server's resize unchanged, so every platform is served in its own
training frame.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any, Mapping

from guilibra_jax import atomic
from guilibra_jax.data import images as I
from guilibra_jax.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_PLATFORM = "*"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.json", "chat_template.jinja")
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
                   "generation_config.json")
PROCESSOR_CLASS = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
RUN_CONFIG_FILE = "run_config.json"
# generation_config keys our sampler has no equivalent of: reset to "off"
_UNSUPPORTED_SAMPLING = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "length_penalty": 1.0,
                         "num_beams": 1, "min_p": None, "typical_p": 1.0}


# ----------------------------------------------------------------------------- pixel budgets

def _pair(value: Any, key: str) -> tuple[int, int]:
    if isinstance(value, Mapping) or hasattr(value, "keys"):   # a dict or an ml_collections ConfigDict
        return int(value.get("min_pixels", 0) or 0), int(value.get("max_pixels", 0) or 0)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return int(value[0] or 0), int(value[1] or 0)
    raise ConfigError(f"config key {key} = {value!r} is invalid: expected (min_pixels, max_pixels) or "
                      f"dict(min_pixels=..., max_pixels=...)")


def pixel_budgets(config: Any, family: str) -> dict[str, tuple[int, int]]:
    """platform -> (min_pixels, max_pixels) the run trained with: ``"*"`` for
    ``data.min_pixels`` / ``data.max_pixels`` (0 = the family's default), plus one
    entry per platform with its own budget under ``data.pixels`` (a mapping platform ->
    ``(min, max)`` or ``dict(min_pixels=, max_pixels=)``; 0 = the run's)."""
    d = config.data
    default = I.processor_config(family)
    lo = int(d.min_pixels) or default.min_pixels
    hi = int(d.max_pixels) or default.max_pixels
    out = {DEFAULT_PLATFORM: (lo, hi)}
    per = d.pixels
    for platform in per:
        p_lo, p_hi = _pair(per[platform], f"data.pixels.{platform}")
        out[str(platform)] = (p_lo or lo, p_hi or hi)
    return out


def serving_bounds(budgets: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """The one (min_pixels, max_pixels) a server gets: every budget's resized images
    pass it unchanged (module docstring)."""
    return min(b[0] for b in budgets.values()), max(b[1] for b in budgets.values())


def budget_for(budgets: Mapping[str, tuple[int, int]], platform: str) -> tuple[int, int]:
    return tuple(budgets.get(platform, budgets[DEFAULT_PLATFORM]))  # type: ignore[return-value]


# ----------------------------------------------------------------------------- files

def preprocessor_config(family: str, bounds: tuple[int, int], base: Mapping[str, Any] | None = None,
                        model_config: Any = None) -> dict:
    """``preprocessor_config.json`` content: ``base`` (a copied file) or the family's
    defaults, with the pixel bounds set in both spellings transformers reads."""
    cfg = I.processor_config(family, min_pixels=bounds[0], max_pixels=bounds[1], model_config=model_config)
    out = dict(base or {})
    if not base:
        out.update(image_processor_type="Qwen2VLImageProcessor", processor_class=PROCESSOR_CLASS[family],
                   do_resize=True, resample=3, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                   do_convert_rgb=True, image_mean=list(cfg.image_mean), image_std=list(cfg.image_std),
                   patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
                   merge_size=cfg.merge_size)
    out["min_pixels"], out["max_pixels"] = int(bounds[0]), int(bounds[1])
    size = dict(out.get("size") or {})
    size.update(shortest_edge=int(bounds[0]), longest_edge=int(bounds[1]))
    out["size"] = size
    return out


def sampling_defaults(config: Any) -> dict:
    """The run's decoding, as generation_config keys: greedy for ASFT (what its
    held-out evaluation decodes), the rollout sampling of GRPO / MOPD runs."""
    if config.method == "sft":
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                "max_new_tokens": int(config.train.eval_max_new_tokens)}
    r = config.rl
    return {"do_sample": True, "temperature": float(r.temperature), "top_p": float(r.top_p),
            "top_k": int(r.top_k) if r.top_k else None, "max_new_tokens": int(r.max_new_tokens)}


def stop_ids(tokenizer) -> list[int]:
    """Qwen's stop ids in Qwen's order: ``<|im_end|>``, then ``<|endoftext|>``."""
    ids = []
    for tok in ("<|im_end|>", "<|endoftext|>"):
        i = tokenizer.convert_tokens_to_ids(tok)
        if i is not None and i != tokenizer.unk_token_id and i not in ids:
            ids.append(int(i))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def generation_config(config: Any, tokenizer, base: Mapping[str, Any] | None = None) -> dict:
    out = dict(base or {})
    eos = stop_ids(tokenizer)
    out.update(eos_token_id=eos, pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                                  else eos[-1]))
    for k, v in _UNSUPPORTED_SAMPLING.items():
        if k in out:
            out[k] = v
    out.update({k: v for k, v in sampling_defaults(config).items()})
    return {k: v for k, v in out.items() if v is not None}


def _read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_serving_files(out: str, config: Any, tokenizer, family: str, *, source_dir: str = "",
                        model_config: Any = None) -> dict:
    """Tokenizer, chat template, preprocessor, generation and run config files of
    ``config``'s run into ``out`` (module docstring). ``source_dir``: the Hugging Face
    folder the run started from, whose files are copied first. Returns the pixel
    budgets written."""
    os.makedirs(out, exist_ok=True)
    for f in TOKENIZER_FILES + PROCESSOR_FILES + (RUN_CONFIG_FILE,):   # nothing stale from an earlier export
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    tok_dir = config.tokenizer.path or source_dir
    if tok_dir and os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        for f in TOKENIZER_FILES:
            if os.path.exists(os.path.join(tok_dir, f)):
                shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    else:
        tokenizer.save_pretrained(out)
    if source_dir:
        for f in PROCESSOR_FILES:
            if os.path.exists(os.path.join(source_dir, f)):
                shutil.copy(os.path.join(source_dir, f), os.path.join(out, f))
    if not any(os.path.exists(os.path.join(out, f)) for f in ("chat_template.jinja", "chat_template.json")) \
            and getattr(tokenizer, "chat_template", None):
        with open(os.path.join(out, "chat_template.jinja"), "w") as f:   # the processor's template
            f.write(tokenizer.chat_template)
    budgets = pixel_budgets(config, family)
    bounds = serving_bounds(budgets)
    pre = os.path.join(out, "preprocessor_config.json")
    _write_json(pre, preprocessor_config(family, bounds, _read_json(pre), model_config))
    gen = os.path.join(out, "generation_config.json")
    _write_json(gen, generation_config(config, tokenizer, _read_json(gen)))
    _write_json(os.path.join(out, RUN_CONFIG_FILE), config.to_dict() if hasattr(config, "to_dict") else dict(config))
    log.info("export %s: pixels %s (served with %s), stop ids %s", out, budgets, bounds, stop_ids(tokenizer))
    return budgets


def export_model(graphdef, params, model_config, tokenizer, out: str, config: Any) -> str:
    """Write ``params`` and every serving file of ``config``'s run as a Hugging Face
    folder ``out`` (module docstring), whole or not at all (``guilibra_jax.atomic``:
    written into ``<out>.tmp-<pid>`` and renamed); returns ``out``."""
    from flax import nnx

    from guilibra_jax import models as M
    model = nnx.merge(graphdef, params)
    with atomic.writing_folder(out) as tmp:
        M.save_hf(model, model_config, tmp)
        write_serving_files(tmp, config, tokenizer, model_config.family, source_dir=config.model.hf_path or "",
                            model_config=model_config)
    return out

