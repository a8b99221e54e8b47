"""What the trainer needs from the data side: the tokenizer, an endless iterator of
fixed-shape device-ready batches with a resumable state, and the periodic held-out
evaluation (greedy decoding + the verifier reward)."""

from __future__ import annotations

import collections
import glob
import json
import logging
import os
import shutil
from typing import Any

import jax
import numpy as np

from guilibra_jax import actions as A
from guilibra_jax import rewards as R
from guilibra_jax.errors import ConfigError
from guilibra_jax.models.vision import device_vision_inputs

log = logging.getLogger(__name__)

TRAIN_KEYS = ("input_ids", "targets", "loss_segments", "segment_ids", "positions", "pixel_values", "vision")


def synthetic_dir(workdir: str) -> str:
    return os.path.join(workdir, "synthetic_data")


def once_on_main(done, make, what: str) -> None:
    """Run ``make()`` on process 0 unless ``done()``; the other processes wait for it (the
    workdir is shared storage). A collective when there are several processes."""
    if jax.process_count() == 1:
        if not done():
            make()
        return
    from jax.experimental import multihost_utils

    from guilibra_jax.train import multihost as MH
    if MH.agree_max(int(not done())):
        if jax.process_index() == 0:
            make()
        multihost_utils.sync_global_devices(what)


def synthetic_tasks(s) -> int | dict[str, int]:
    """The synthetic world's tasks per platform (``config.data.synthetic``): ``tasks``, or
    {platform: count} where ``platform_tasks`` names some."""
    if not s.platform_tasks:
        return s.tasks
    return {p: int(s.platform_tasks.get(p, s.tasks)) for p in s.platforms}


def ensure_synthetic_data(config, workdir: str) -> dict:
    """Export the synthetic world dataset into the workdir once (idempotent; process 0
    writes it, the others wait)."""
    from guilibra_jax.envs.export import export_dataset
    s = config.data.synthetic
    out = synthetic_dir(workdir)
    manifest_path = os.path.join(out, "manifest.json")

    def make():
        # Written aside and renamed when complete: a run killed mid-export leaves no
        # half dataset that a rerun would take for the whole one.
        partial = out + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        manifest = export_dataset(partial, platforms=tuple(s.platforms), n_tasks=synthetic_tasks(s), seed=s.seed,
                                  split_fraction=s.test_fraction, extra_formats=())
        shutil.rmtree(out, ignore_errors=True)
        os.replace(partial, out)
        log.info("synthetic dataset: %s", {k: v for k, v in manifest.items() if "count" in k or k == "seconds"})

    once_on_main(lambda: os.path.exists(manifest_path), make, "synthetic data export")
    with open(manifest_path) as f:
        return json.load(f)


def _expand(patterns, key: str) -> list[str]:
    files: list[str] = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        if not hits:
            raise ConfigError(f"config key {key}: pattern {p!r} matches no file")
        files.extend(hits)
    return files


def _mixing(config) -> bool:
    s = config.data.synthetic
    return bool(s.enabled and s.mix_with_files)


def train_files(config, workdir: str) -> list[str]:
    """The training files: the synthetic world's export (data.synthetic.enabled), then
    data.train_files when data.synthetic.mix_with_files; else data.train_files. (The
    config check refuses files given with the synthetic world and no mix_with_files.)"""
    if config.data.synthetic.enabled:
        ensure_synthetic_data(config, workdir)
        synthetic = [os.path.join(synthetic_dir(workdir), "train.jsonl")]
        return synthetic + (_expand(config.data.train_files, "data.train_files") if _mixing(config) else [])
    return _expand(config.data.train_files, "data.train_files")


def eval_files(config, workdir: str) -> list[str]:
    """The held-out files, chosen as :func:`train_files` chooses (the export's test split)."""
    if config.data.synthetic.enabled:
        synthetic = [os.path.join(synthetic_dir(workdir), "test.jsonl")]
        return synthetic + (_expand(config.data.eval_files, "data.eval_files") if _mixing(config) else [])
    return _expand(config.data.eval_files, "data.eval_files")


def prepare_tokenizer(config, workdir: str):
    """The model folder's tokenizer, ``tokenizer.path``, or (random-init demo models
    without one) a small BPE trained on the training records, saved in the workdir."""
    from guilibra_jax.train.model_factory import load_tokenizer
    path = config.tokenizer.path or config.model.hf_path
    if path:
        return load_tokenizer(path)
    out = os.path.join(workdir, "tokenizer")
    files = train_files(config, workdir)

    def make():
        from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer, demo_corpus
        records = readable_records(config, files)
        partial = out + ".partial"  # renamed when complete (a killed run leaves no half tokenizer)
        shutil.rmtree(partial, ignore_errors=True)
        build_demo_tokenizer(demo_corpus(records, config.model.tiny.family, (config.data.method,),
                                         spell_quoted=config.data.synthetic.tokenizer_spell_quoted),
                             config.data.synthetic.tokenizer_vocab, partial)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(partial, out)

    once_on_main(lambda: os.path.exists(os.path.join(out, "tokenizer.json")), make, "demo tokenizer")
    return load_tokenizer(out)


def per_process_batch(config) -> int:
    """Rows (SFT) or prompts (RL) each process draws per batch: ``data.batch_size`` is the
    whole batch over all processes."""
    n = jax.process_count()
    if config.data.batch_size % n:
        from guilibra_jax.errors import ConfigError
        raise ConfigError(f"config key data.batch_size = {config.data.batch_size} is invalid: expected a multiple "
                          f"of the process count {n} (it is the batch over all processes)")
    return config.data.batch_size // n


def pixel_pairs(cfg_data) -> dict[str, tuple[int, int]]:
    """``data.pixels`` as {platform: (min, max)} (0: data.min_pixels / data.max_pixels)."""
    return {str(k): (int(v[0]), int(v[1])) for k, v in dict(cfg_data.pixels).items()}


def pixel_budgets(cfg_data):
    """The run's :class:`data.images.PixelBudgets`: the one answer to "which pixel bounds
    for this platform", for training, RL prompts, the evaluator and the eval agent."""
    from guilibra_jax.data.images import PixelBudgets
    return PixelBudgets.from_config(cfg_data.min_pixels, cfg_data.max_pixels, pixel_pairs(cfg_data))


def think_opened(config, tokenizer) -> bool:
    """Whether the run's prompts open the think block (``data.open_think``; "auto": the
    tokenizer's chat template), so responses may lack ``<think>``."""
    from guilibra_jax.data import prompts as P
    return P.opens_think(P.generation_prefix(config.data.open_think, tokenizer))


def readable_records(config, files: list[str], key: str = "data.train_files") -> list:
    """The records of ``files`` (in ``data.format``; named by config ``key``) that parse;
    bad ones are skipped here (the training loader counts them when it meets them)."""
    from guilibra_jax.data import bad_records as B
    from guilibra_jax.data import readers
    source = readers.open_source(files, config.data.format, image_root=config.data.image_root or None,
                                 config_key=key)
    return [r for r in source if not isinstance(r, B.Dropped)]


def _pipeline_iterator(loader):
    """The data.pipeline iterator of ``loader`` (itself, or held as ``.loader``), or None."""
    for it in (loader, getattr(loader, "loader", None)):
        if it is not None and hasattr(it, "bad_records"):
            return it
    return None


def excluded_at_index(loader) -> dict[str, int]:
    """Records left out before reading, by reason: Uni-GUI steps marked unused or deleted,
    and records the RL rebalancing dropped (counts from the loader's ``info``)."""
    info = getattr(_pipeline_iterator(loader), "info", None) or {}
    out = {f"uni_gui_{k}": int(v) for k, v in (info.get("uni_gui_skipped") or {}).items() if v}
    if info.get("rebalance"):
        out["rebalanced_out"] = int(info["rebalance"]["before"]["n"] - info["rebalance"]["after"]["n"])
    return out


def drop_metrics(loader) -> dict[str, int]:
    """Counters of the records ``loader`` (a data.pipeline iterator, or anything holding
    one as ``.loader``) skipped or filtered so far, by reason, for a metrics row:
    ``data/kept``, ``data/bad``, ``data/bad/<reason>``, ``data/filtered``,
    ``data/filtered/<reason>``, and ``data/excluded/<reason>`` for records left out when
    the index was built; {} for a loader that keeps no counts."""
    it = _pipeline_iterator(loader)
    if it is None:
        return {}
    out = it.bad_records.as_metrics()
    out.update({f"data/excluded/{k}": v for k, v in excluded_at_index(loader).items()})
    return out


def drop_report(loader) -> str:
    """One line for the end of a run: samples used, bad records and filtered ones by reason."""
    it = _pipeline_iterator(loader)
    if it is None:
        return "no record counts (the data source keeps none)"
    excluded = excluded_at_index(loader)
    tail = f"; left out when indexing: {', '.join(f'{k}={v}' for k, v in excluded.items())}" if excluded else ""
    return it.bad_records.report() + tail


def data_config(config, files: list[str], *, for_eval: bool = False) -> dict:
    d = config.data
    mix: Any = d.mix
    if mix not in ("both", "reasoning", "direct"):
        mix = float(mix)
    buckets = tuple(d.seq_buckets) or (d.max_length,)
    return dict(
        inputs=tuple(files), inputs_key="data.eval_files" if for_eval else "data.train_files", format=d.format,
        method=d.method, image_root=d.image_root or None,
        system_prompt=d.system_prompt or None,
        batch_size=d.batch_size if for_eval else per_process_batch(config), seq_buckets=buckets,
        max_length=d.max_length, patch_bucket=d.patch_bucket,
        min_pixels=d.min_pixels or None, max_pixels=d.max_pixels or None, pixels=pixel_pairs(d),
        open_think=d.open_think, loss_weighting=config.loss.weighting, mix=mix if not for_eval else "reasoning",
        pack=d.pack and not for_eval, seed=d.seed, shuffle=True, num_epochs=1 if for_eval else None,
        drop_remainder=not for_eval, num_workers=0 if for_eval else d.workers,
        bad_record_threshold=d.max_bad_fraction, splits=None if for_eval else ("train",),
        **({} if for_eval else rebalance_args(d)))


def rebalance_args(cfg_data) -> dict:
    """``data.rebalance`` as the loader's rebalance_* arguments (nothing when it is off)."""
    rb = cfg_data.rebalance
    if not rb.step_keep and not rb.max_share:
        return {}
    return dict(rebalance_step_keep={i: float(p) for i, p in enumerate(rb.step_keep)} or None,
                rebalance_max_share={str(k): float(v) for k, v in dict(rb.max_share).items()} or None,
                rebalance_key=rb.key)


def record_data_info(workdir: str, info: dict) -> None:
    """Write the loader's index summary (records, samples, and with data.rebalance the
    distributions by platform, source and step before / after) to ``data_info.json``."""
    if jax.process_index() != 0:
        return
    if "rebalance" in info:
        log.info("rebalanced data: before %s -> after %s", info["rebalance"]["before"], info["rebalance"]["after"])
    with open(os.path.join(workdir, "data_info.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)


class TrainData:
    """Endless iterator of device-ready SFT batches (only the arrays the step uses)."""

    MAX_EMPTY_BATCHES = 3

    def __init__(self, loader, max_length: int):
        self.loader = loader
        self.max_length = max_length
        self._empty = 0

    def __next__(self) -> dict:
        batch = next(self.loader)
        if batch.get("num_samples", 1) == 0:
            self._empty += 1
            if self._empty >= self.MAX_EMPTY_BATCHES:
                summary = getattr(getattr(self.loader, "bad_records", None), "summary", lambda: {})()
                raise RuntimeError(
                    f"{self._empty} consecutive training batches hold no sample: every record was dropped "
                    f"(bad or filtered: {summary}). If 'filtered' counts 'too_long', raise data.max_length "
                    f"(now {self.max_length}).")
        else:
            self._empty = 0
        out = {k: batch[k] for k in TRAIN_KEYS if k in batch and k != "vision"}
        if "vision" in batch and batch.get("pixel_values") is not None:
            out["vision"] = device_vision_inputs(batch["vision"])
        return out

    def get_state(self):
        return self.loader.get_state()

    def set_state(self, state):
        self.loader.set_state(state)

    def close(self):
        close = getattr(self.loader, "close", None)
        if close:
            close()


def make_train_data(config, tokenizer, model_config, process_index: int, process_count: int, workdir: str):
    from guilibra_jax.data.pipeline import make_sft_loader
    files = train_files(config, workdir)
    loader = make_sft_loader(data_config(config, files), tokenizer, model_config, shard_index=process_index,
                             shard_count=process_count)
    record_data_info(workdir, loader.info)
    return TrainData(loader, config.data.max_length)


# ----------------------------------------------------------------------------- evaluation

def _family_coords(model_config, cfg_data):
    """(coordinate space, resized(size, platform=None) -> (w, h)) of the model family under
    the run's pixel budgets."""
    family = model_config.family
    space = A.FAMILY_COORD_SPACE[family]
    budgets = pixel_budgets(cfg_data)

    def resized(size, platform=None):
        lo, hi = budgets.bounds(platform)
        return A.resized_size_for(size, family, min_pixels=lo, max_pixels=hi)
    return space, resized


def constant_baseline(train_targets: list[R.Target], eval_targets: list[R.Target], space: str, resized,
                      eval_platforms: list[str | None] | None = None) -> float:
    """Best step accuracy of answering every held-out step with one fixed action: the
    most frequent training actions (type, value, rounded point), each tried.
    ``resized(size, platform)`` sizes each held-out image (``eval_platforms``)."""
    platforms = eval_platforms or [None] * len(eval_targets)
    counts = collections.Counter(
        (t.action_type, t.value, None if t.point is None else (round(t.point[0], 2), round(t.point[1], 2)))
        for t in train_targets)
    best = 0.0
    for (atype, value, point), _ in counts.most_common(20):
        accs = []
        for t, plat in zip(eval_targets, platforms):
            rs = resized(t.image_size, plat)
            p = None if point is None else A.from_unit(point, space, resized_size=rs)
            text = A.render_response(A.Action(atype, "", value, p))
            accs.append(R.guilibra_reward(text, t, coord_space=space, resized_size=rs).accuracy)
        best = max(best, float(np.mean(accs)) if accs else 0.0)
    return best


def make_evaluator(config, tokenizer, model_config, graphdef, workdir: str, mesh=None):
    """A callable (params, step) -> metrics: greedy responses on held-out steps scored
    with the GUI-Libra verifier (step accuracy = r_act * r_val * r_g), per platform,
    next to the best constant-action baseline. With several processes (``mesh`` given)
    each process decodes its share of the held-out prompts as rows of global arrays and
    the results are gathered (a collective: every process calls it)."""
    from guilibra_jax import generate as G
    from guilibra_jax.data.pipeline import make_rl_loader

    if config.data.method != "guilibra":
        log.warning("offline eval hook scores GUI-Libra responses only; data.method=%s: disabled",
                    config.data.method)
        return None
    files = eval_files(config, workdir)
    space, resized = _family_coords(model_config, config.data)
    opened = think_opened(config, tokenizer)
    eval_cfg = data_config(config, files, for_eval=True)
    eval_cfg["batch_size"] = min(config.data.batch_size, config.train.eval_samples)
    eval_cfg["seq_buckets"] = (config.data.max_length,)
    stop = tuple(i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id)
                 if i is not None)
    sampling = G.SamplingConfig(temperature=0.0, max_new_tokens=config.train.eval_max_new_tokens,
                                stop_token_ids=stop, pad_token_id=tokenizer.pad_token_id or 0, logprobs=False)
    train_targets = [r.reward_target() for r in readable_records(config, train_files(config, workdir))]
    baseline_cache: dict[str, float] = {}

    procs = jax.process_count()
    if procs > 1:
        eval_cfg["batch_size"] = max(1, eval_cfg["batch_size"] // procs)

    def decode(params, batch):
        """(tokens, lengths) of this process's rows, greedy."""
        inputs = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "positions", "rope_deltas")}
        vision = device_vision_inputs(batch["vision"]) if batch.get("vision") else None
        if procs == 1:
            out = G.generate(graphdef, params, *inputs.values(), batch.get("pixel_values"), vision,
                             jax.random.PRNGKey(0), sampling)
            return jax.device_get((out.tokens, out.lengths))
        from guilibra_jax.train import multihost as MH
        from guilibra_jax.train.batching import put_batch
        if batch.get("pixel_values") is not None:
            inputs.update(pixel_values=batch["pixel_values"], vision=vision)
        g = put_batch(inputs, mesh, micro_axis=False, model_config=model_config)
        out = G.generate(graphdef, params, g["prompt_ids"], g["prompt_mask"], g["positions"], g["rope_deltas"],
                         g.get("pixel_values"), g.get("vision"), jax.random.PRNGKey(0), sampling)
        return MH.local_rows(out.tokens, mesh), MH.local_rows(out.lengths, mesh)

    def evaluate(params, step: int) -> dict:
        from guilibra_jax.train import multihost as MH
        loader = make_rl_loader(eval_cfg, tokenizer, model_config, shard_index=jax.process_index(),
                                shard_count=procs)
        rows: list[tuple[str, R.GuiLibraReward, str, R.Target]] = []
        for batch in loader:
            tokens, lengths = decode(params, batch)
            for i, target in enumerate(batch["reward_targets"]):
                if target is None or not batch["row_valid"][i]:
                    continue
                text = G.decode_response(tokenizer, tokens[i, :lengths[i]], stop)
                r = R.guilibra_reward(text, target, coord_space=space,
                                      resized_size=resized(target.image_size, batch["platform"][i]),
                                      think_opened=opened)
                rows.append((batch["platform"][i], r, text, target))
            if MH.gather_counts(len(rows)).sum() >= config.train.eval_samples:
                break
        local_targets = [r[3] for r in rows]    # the constant baseline: this process's share
        local_platforms = [r[0] for r in rows]
        if procs > 1:   # every process's rows, in process order (texts: process 0's only)
            scores = MH.gather_rows(np.array([[r[1].accuracy, r[1].action_type, r[1].format] for r in rows],
                                             np.float64).reshape(-1, 3))
            platforms = MH.gather_strings([r[0] for r in rows])
            rows = [(p, R.GuiLibraReward(format=s[2], action_type=s[1], value=0.0, grounding=0.0, accuracy=s[0],
                                         total=0.0), rows[i][2] if i < len(rows) else "", None)
                    for i, (p, s) in enumerate(zip(platforms, scores))]
        rows = rows[:config.train.eval_samples]
        if "value" not in baseline_cache:
            baseline_cache["value"] = constant_baseline(train_targets, local_targets[:config.train.eval_samples],
                                                        space, resized, local_platforms[:config.train.eval_samples])
        metrics = {"eval/samples": len(rows), "eval/constant_baseline_step_acc": baseline_cache["value"]}
        for name, group in [("all", rows)] + [(p, [r for r in rows if r[0] == p]) for p in sorted({r[0] for r in rows})]:
            if not group:
                continue
            prefix = "eval/" if name == "all" else f"eval/{name}/"
            metrics[prefix + "step_acc"] = float(np.mean([r[1].accuracy for r in group]))
            metrics[prefix + "action_type_acc"] = float(np.mean([r[1].action_type for r in group]))
            metrics[prefix + "format"] = float(np.mean([r[1].format for r in group]))
        if rows and jax.process_index() == 0:
            with open(os.path.join(workdir, f"eval_samples_step{step}.jsonl"), "w") as f:
                for platform, r, text, _ in rows[:16]:
                    f.write(json.dumps({"platform": platform, "response": text, "accuracy": r.accuracy}) + "\n")
        return metrics

    return evaluate
