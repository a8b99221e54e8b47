"""``run_curation(config, workdir)``: what ``python -m launch.curate`` runs.

Workdir layout::

    config.json                 the resolved config of the first run
    stages/<stage>.jsonl        per-record results, appended block by block (stage_log)
    stages/<stage>.settings.json  what the stage's results depend on (checked on resume)
    inputs.json                 the inputs (checked on resume)
    data/                       synthetic inputs (data.synthetic.enabled): the world's export,
                                the corrupted input and corruption.json
    curated/sft.*               steps kept by consistency + box (boxes set, reasoning added),
                                in native JSONL and the input's format
    curated/rl.*                the rebalanced RL subset of them
    curated/match_frequency.jsonl  per-step match frequencies (every step stage 1 saw)
    curation_report.json / .md, match_frequency.png

Re-running the same command continues: finished blocks are not sampled again, and the
outputs and report are rewritten from the stage logs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any

import jax

from guilibra_jax import actions as A
from guilibra_jax import choices as CH
from guilibra_jax.curate import corrupt as CR
from guilibra_jax.curate import report as REP
from guilibra_jax.curate import stages as ST
from guilibra_jax.curate.samplers import EndpointSampler, ModelSampler, SamplingParams
from guilibra_jax.curate.stage_log import StageLog
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import readers as RD
from guilibra_jax.data import writers as W
from guilibra_jax.errors import ConfigError, UserError

log = logging.getLogger(__name__)

SAMPLERS = ("model", "endpoint", "oracle")
EXTENSIONS = {"native": ".jsonl", "guilibra_sft": ".json", "guilibra_rl": ".parquet"}
SAMPLED = ("consistency", "box", "reasoning")


# ----------------------------------------------------------------------------- config

def sampler_name(cfg, stage: str) -> str:
    name = cfg[stage].sampler
    if name == "auto":
        return "endpoint" if cfg.generator.url else "model"
    return name


def _need(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key} = {value!r} is invalid: expected {expected}")


def validate(cfg) -> None:
    """Raise ConfigError (naming the key) on a bad value, before anything heavy runs."""
    stages = tuple(cfg.stages)
    _need(bool(stages) and set(stages) <= set(ST.STAGES), "stages", stages, f"a non-empty subset of {ST.STAGES}")
    d = cfg.data
    if not d.synthetic.enabled:
        _need(bool(d.inputs), "data.inputs", d.inputs, "input files, folders or globs (or data.synthetic.enabled)")
        _need(d.format in RD.FORMATS, "data.format", d.format, f"one of {RD.FORMATS}")
    else:
        _need(d.synthetic.format in EXTENSIONS, "data.synthetic.format", d.synthetic.format,
              f"one of {tuple(EXTENSIONS)}")
        _need(0.0 <= d.synthetic.corrupt_fraction <= 1.0, "data.synthetic.corrupt_fraction",
              d.synthetic.corrupt_fraction, "a fraction in [0, 1]")
        _need(set(d.synthetic.corrupt_kinds) <= set(CR.KINDS), "data.synthetic.corrupt_kinds",
              d.synthetic.corrupt_kinds, f"a subset of {CR.KINDS}")
    _need(cfg.batch_size >= 1, "batch_size", cfg.batch_size, "an integer >= 1")
    c = cfg.consistency
    _need(c.samples >= 1, "consistency.samples", c.samples, "an integer >= 1")
    _need(0.0 <= c.threshold <= 1.0, "consistency.threshold", c.threshold, "a frequency in [0, 1]")
    _need(cfg.box.samples >= 1, "box.samples", cfg.box.samples, "an integer >= 1")
    _need(cfg.box.on_unparsed in ("drop", "keep"), "box.on_unparsed", cfg.box.on_unparsed, "'drop' or 'keep'")
    _need(cfg.box.target_fallback in ("action_description", "none"), "box.target_fallback",
          cfg.box.target_fallback, "'action_description' or 'none'")
    _need(cfg.reasoning.tries >= 1, "reasoning.tries", cfg.reasoning.tries, "an integer >= 1")
    for stage in SAMPLED:
        if stage not in stages:
            continue
        _need(cfg[stage].sampler in SAMPLERS + (("auto",) if stage == "reasoning" else ()), f"{stage}.sampler",
              cfg[stage].sampler, f"one of {SAMPLERS}" + (" or 'auto'" if stage == "reasoning" else ""))
        name = sampler_name(cfg, stage)
        if name == "model":
            _need(bool(cfg.model.path), "model.path", cfg.model.path,
                  f"a training workdir or Hugging Face folder ({stage}.sampler is 'model')")
        if name == "endpoint":
            _need(bool(cfg.generator.url), "generator.url", cfg.generator.url,
                  f"an OpenAI-compatible API base, e.g. http://localhost:8000/v1 ({stage}.sampler is 'endpoint')")
        if name == "oracle":
            _need(d.synthetic.enabled or bool(cfg.oracle.clean), f"{stage}.sampler", "oracle",
                  "'model' or 'endpoint': the oracle answers from clean labels (data.synthetic.enabled, or "
                  "oracle.clean: a native JSONL file of them)")
    _need(cfg.generator.method in CH.TARGET_FORMATS, "generator.method", cfg.generator.method,
          " or ".join(map(repr, CH.TARGET_FORMATS)))
    _need(cfg.rebalance.domain_key in CH.REBALANCE_KEYS, "rebalance.domain_key", cfg.rebalance.domain_key,
          " or ".join(map(repr, CH.REBALANCE_KEYS)))
    _need(cfg.rebalance.target_size >= 0, "rebalance.target_size", cfg.rebalance.target_size, "an integer >= 0")
    ST.parse_mapping(cfg.rebalance.step_keep, "rebalance.step_keep", int)
    ST.parse_mapping(cfg.rebalance.max_share, "rebalance.max_share")


def _check_saved(path: str, current: dict, what: str) -> None:
    """Write ``current`` to ``path``, or raise UserError if ``path`` holds other settings."""
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved != json.loads(json.dumps(current)):
            diff = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
            raise UserError(f"{path}: this workdir's {what} were made with other settings ({', '.join(diff)}: "
                            f"saved {[saved.get(k) for k in diff]}, now {[current.get(k) for k in diff]}); use a "
                            f"new --workdir, or delete {os.path.dirname(path)} to start over")
    elif jax.process_index() == 0:
        with open(path, "w") as f:
            json.dump(current, f, indent=1, sort_keys=True)


# ----------------------------------------------------------------------------- inputs

def prepare_synthetic(cfg, workdir: str) -> dict:
    """Export the synthetic world (once), strip it to SFT-like records, corrupt a share of
    them and write the curation input; returns paths and the corruption map."""
    from guilibra_jax.envs.export import export_dataset
    from guilibra_jax.train.data_source import once_on_main
    s = cfg.data.synthetic
    out = os.path.join(workdir, "data")
    world = os.path.join(out, "world")
    clean_path = os.path.join(world, f"{s.split}.jsonl")
    input_path = os.path.join(out, "input" + EXTENSIONS[s.format])
    corruption_path = os.path.join(out, "corruption.json")

    def make():
        import numpy as np
        export_dataset(world, platforms=tuple(s.platforms), n_tasks=s.tasks, seed=s.seed,
                       split_fraction=s.split_fraction, extra_formats=())
        clean = list(RD.open_source(clean_path, "native"))
        strip_rng = np.random.default_rng(s.seed + 1)
        records = [CR.as_sft_data(r, keep_reasoning=strip_rng.random() >= s.strip_reasoning) for r in clean]
        records, corrupted = CR.corrupt(records, s.corrupt_fraction, kinds=tuple(s.corrupt_kinds), seed=s.seed,
                                        min_shift=s.min_shift)
        W.WRITERS[s.format](records, input_path)
        CR.write_corruption(corruption_path, corrupted)

    once_on_main(lambda: os.path.exists(corruption_path), make, "synthetic curation input")
    return {"input": input_path, "format": s.format, "clean": clean_path,
            "corrupted": CR.read_corruption(corruption_path)}


def open_inputs(cfg, workdir: str) -> tuple[RD.StepSource, dict]:
    d = cfg.data
    info: dict[str, Any] = {}
    if d.synthetic.enabled:
        info["synthetic"] = prepare_synthetic(cfg, workdir)
        inputs, fmt = (info["synthetic"]["input"],), info["synthetic"]["format"]
    else:
        inputs, fmt = tuple(d.inputs), d.format
    try:
        source = RD.open_source(list(inputs), fmt, image_root=d.image_root or None, include_unused=d.include_unused)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"config key data.inputs = {list(inputs)!r} ({fmt}): {e}") from None
    info.update(format=fmt, inputs=[os.path.abspath(p) for p in inputs], records=len(source))
    if d.known_errors:
        if not os.path.exists(d.known_errors):
            raise UserError(f"config key data.known_errors = {d.known_errors!r}: no such file")
        info["known_errors"] = CR.read_corruption(d.known_errors)
    elif d.synthetic.enabled:
        info["known_errors"] = info["synthetic"]["corrupted"]
    return source, info


# ----------------------------------------------------------------------------- samplers

def load_model(cfg, mesh):
    """(run config, tokenizer, model_config, graphdef, params on the mesh) of ``model.path``:
    a training workdir (latest checkpoint, or ``model.step``) or a Hugging Face folder
    (data settings from its run_config.json, ``model.run_config``, or the defaults)."""
    from guilibra_jax.train import config as RC
    from guilibra_jax.train import model_factory as MF
    from guilibra_jax.train.export import RUN_CONFIG_FILE
    path = cfg.model.path
    if not os.path.isdir(path):
        raise UserError(f"config key model.path = {path!r} is not a folder (a training workdir or a Hugging Face "
                        "folder)")
    is_hf = any(f.endswith(".safetensors") for f in os.listdir(path))
    try:
        if is_hf:
            spec = cfg.model.run_config or (os.path.join(path, RUN_CONFIG_FILE)
                                            if os.path.exists(os.path.join(path, RUN_CONFIG_FILE)) else "")
            run = RC.load_run_config(spec) if spec else RC.base_config()
            run.model.hf_path, run.tokenizer.path = path, ""
            tokenizer = MF.load_tokenizer(path)
        else:
            run = RC.load_run_config(path)
            tokenizer = MF.load_tokenizer(run.tokenizer.path or run.model.hf_path or os.path.join(path, "tokenizer"))
        dtype = cfg.model.dtype or run.model.dtype
        graphdef, params, model_config = MF.load_frozen(path, dtype=dtype, param_dtype=dtype, mesh=mesh,
                                                        step=None if cfg.model.step < 0 else int(cfg.model.step))
    except FileNotFoundError as e:
        raise UserError(f"config key model.path = {path!r}: {e}") from None
    return run, tokenizer, model_config, graphdef, params


def build_samplers(cfg, info: dict) -> dict[str, Any]:
    """The sampler of every sampled stage in ``cfg.stages`` (the model is loaded once)."""
    names = {s: sampler_name(cfg, s) for s in SAMPLED if s in cfg.stages}
    out: dict[str, Any] = {}
    model = None
    if "model" in names.values():
        from guilibra_jax.train import multihost as MH
        mesh = MH.run_mesh(cfg)
        run, tokenizer, model_config, graphdef, params = load_model(cfg, mesh)
        model = ModelSampler(run, tokenizer, model_config, graphdef, params, mesh, rows=cfg.batch_size,
                             max_prompt_tokens=cfg.model.max_prompt_tokens)
    endpoint = None
    if "endpoint" in names.values():
        from guilibra_jax.chat_endpoint import ChatEndpoint
        g = cfg.generator
        try:
            ep = ChatEndpoint(g.url, g.model, os.environ.get(g.api_key_env, "") if g.api_key_env else "",
                              timeout=g.timeout, retries=g.retries, backoff=g.backoff, concurrency=g.concurrency)
        except ValueError as e:
            raise ConfigError(f"config key generator: {e}") from None
        endpoint = EndpointSampler(ep, g.family, g.method, min_pixels=g.min_pixels, max_pixels=g.max_pixels,
                                   system_prompt=g.system_prompt, send_seed=g.send_seed)
    oracle = None
    if "oracle" in names.values():
        from guilibra_jax.curate.oracle import OracleSampler
        o = cfg.oracle
        clean = o.clean or info["synthetic"]["clean"]
        oracle = OracleSampler(list(RD.open_source(clean, "native")), o.family, accuracy=o.accuracy,
                               delay_s=o.delay_s)
    for stage, name in names.items():
        out[stage] = {"model": model, "endpoint": endpoint, "oracle": oracle}[name]
    return out


def stage_params(cfg, stage: str) -> SamplingParams:
    if stage == "consistency":
        c = cfg.consistency
        return SamplingParams(int(c.samples), float(c.temperature), float(c.top_p), int(c.max_new_tokens))
    if stage == "box":
        b = cfg.box
        return SamplingParams(int(b.samples), float(b.temperature), 1.0, int(b.max_new_tokens))
    r = cfg.reasoning
    return SamplingParams(int(r.tries), float(r.temperature), float(r.top_p), int(r.max_new_tokens))


def stage_settings(cfg, stage: str, sampler) -> dict:
    """What a stage's logged results depend on (a resumed run must agree)."""
    s = {"sampler": sampler.name, "params": dataclasses.asdict(stage_params(cfg, stage)), "seed": cfg.seed,
         "method": sampler.spec.method, "family": sampler.spec.family, "batch_size": cfg.batch_size,
         "processes": jax.process_count()}
    if sampler.name == "model":
        s.update(model=os.path.abspath(cfg.model.path), step=cfg.model.step, dtype=cfg.model.dtype)
    if sampler.name == "endpoint":
        s.update(url=cfg.generator.url, model=cfg.generator.model)
    if sampler.name == "oracle":
        s.update(accuracy=cfg.oracle.accuracy, clean=cfg.oracle.clean)
    if stage in ("consistency", "reasoning"):
        s["reward"] = cfg.reward.to_dict()
    if stage == "box":
        s.update(prompt=cfg.box.prompt, target_fallback=cfg.box.target_fallback)
    if stage == "reasoning":
        s["only_missing"] = cfg.reasoning.only_missing
    return s


def stage_work(cfg, stage: str, sampler, runner: ST.Runner):
    params, reward = stage_params(cfg, stage), cfg.reward.to_dict()
    if stage == "consistency":
        return ST.consistency_work(sampler, params, runner, reward)
    if stage == "box":
        return ST.box_work(sampler, params, runner, cfg.box.prompt, cfg.box.target_fallback)
    return ST.reasoning_work(sampler, params, runner, reward, cfg.reasoning.only_missing)


# ----------------------------------------------------------------------------- outputs

def curated_record(source, i: int, logs: dict[str, StageLog], cfg):
    """Record ``i`` with its stage-2 box (as ``target.bbox``) and stage-3 reasoning."""
    r = source[i]
    if isinstance(r, B.Dropped):
        return None
    box_log, reason_log = logs.get("box"), logs.get("reasoning")
    if box_log is not None and i in box_log:
        row = box_log.get(i)
        if row["reason"] == "boxed" and row.get("box") and (r.target.bbox is None or cfg.box.replace_existing):
            r = dataclasses.replace(r, target=dataclasses.replace(r.target, bbox=tuple(row["box"])))
    if reason_log is not None and i in reason_log and reason_log.get(i)["reason"] == "written":
        r = dataclasses.replace(r, reasoning=reason_log.full(i)["reasoning"])
    return r


def write_outputs(cfg, workdir: str, source, fmt: str, sets: dict[str, list[int]], logs: dict[str, StageLog]
                  ) -> dict[str, Any]:
    """Write each set in native JSONL and the input's format into ``curated/`` (built in
    ``curated.tmp/`` and renamed, so a kill never leaves half an output)."""
    final, tmp = os.path.join(workdir, "curated"), os.path.join(workdir, "curated.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    formats = ["native"] + ([fmt] if fmt in W.WRITERS and fmt != "native" else [])
    out: dict[str, Any] = {}
    for name, ids in sets.items():
        files = []
        for f in formats:
            path = os.path.join(tmp, name + EXTENSIONS[f])
            records = (r for r in (curated_record(source, i, logs, cfg) for i in ids) if r is not None)
            kw = {"noreason_twin": True} if f == "guilibra_sft" and cfg.output.noreason_twin else {}
            W.WRITERS[f](records, path, **kw)
            files.append(os.path.join("curated", os.path.basename(path)))
        out[name] = {"records": len(ids), "files": files}
    if "consistency" in logs:
        with open(os.path.join(tmp, "match_frequency.jsonl"), "w") as f:
            for i in sorted(logs["consistency"].rows):
                row = logs["consistency"].get(i)
                f.write(json.dumps({"id": i, "where": row.get("where"), "freq": row.get("freq"),
                                    "matches": row.get("matches"), "samples": row.get("samples"),
                                    "kept": ST.decide("consistency", row, cfg)[0]}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return out


def _label_text(r) -> str:
    return A.render_answer_json(r.target.action("unit"), include_target=True)


def examples(cfg, source, stage: str, ids: list[int], log_: StageLog) -> list[dict]:
    """Up to ``output.examples`` removed steps per removal reason."""
    seen: dict[str, int] = {}
    out = []
    for i in ids:
        keep, reason = ST.decide(stage, log_.get(i), cfg)
        if keep or seen.get(reason, 0) >= cfg.output.examples:
            continue
        seen[reason] = seen.get(reason, 0) + 1
        row, r = log_.full(i), source[i]
        ex = {"reason": reason, "where": row.get("where", ""), "freq": row.get("freq"), "box": row.get("box"),
              "target": row.get("target"), "responses": row.get("responses", [])}
        if isinstance(r, B.Dropped):
            ex.update(instruction=r.message, label="(unreadable)")
        else:
            ex.update(instruction=r.instruction, label=_label_text(r))
        out.append(ex)
    return out


def summarize(cfg, stage: str, ids: list[int], kept: list[int], log_: StageLog, runner: ST.Runner, sampler
              ) -> dict[str, Any]:
    kept_by, removed_by = {}, {}
    for i in ids:
        keep, reason = ST.decide(stage, log_.get(i), cfg)
        d = kept_by if keep else removed_by
        d[reason] = d.get(reason, 0) + 1
    s: dict[str, Any] = {"in": len(ids), "out": len(kept), "kept_by_reason": kept_by, "removed_by_reason": removed_by,
                         "sampler": sampler.name}
    t = runner.timing.get(stage)
    if t and t.get("seconds"):
        s["throughput"] = {"seconds": round(t["seconds"], 3), "prompts": int(t.get("prompts", 0)),
                           "responses": int(t.get("responses", 0)),
                           "responses_per_s": t.get("responses", 0) / t["seconds"],
                           "prompts_per_s": t.get("prompts", 0) / t["seconds"]}
    if stage == "consistency":
        freqs = [log_.get(i)["freq"] for i in ids if log_.get(i).get("freq") is not None]
        s.update(samples=cfg.consistency.samples, threshold=cfg.consistency.threshold,
                 mean_frequency=round(sum(freqs) / len(freqs), 4) if freqs else None,
                 histogram=REP.frequency_counts(freqs, cfg.consistency.samples))
    if stage == "box":
        s["boxes_set"] = sum(1 for i in kept if log_.get(i)["reason"] == "boxed")
    if stage == "reasoning":
        verdicts: dict[str, int] = {}
        for i in ids:
            for k, v in log_.get(i).get("verdicts", {}).items():
                verdicts[k] = verdicts.get(k, 0) + v
        s["verdicts"] = verdicts
    return s


# ----------------------------------------------------------------------------- the run

def run_curation(cfg, workdir: str) -> dict[str, Any]:
    """Run (or continue) the curation ``cfg`` in ``workdir``; returns the report dict."""
    validate(cfg)
    is_main = jax.process_index() == 0
    os.makedirs(os.path.join(workdir, "stages"), exist_ok=True)
    if is_main and not os.path.exists(os.path.join(workdir, "config.json")):
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=1, default=str)
    source, info = open_inputs(cfg, workdir)
    _check_saved(os.path.join(workdir, "inputs.json"), {k: info[k] for k in ("format", "inputs", "records")},
                 "stage results")
    ids = list(range(len(source) if not cfg.data.limit else min(cfg.data.limit, len(source))))
    samplers = build_samplers(cfg, info)
    runner = ST.Runner(source, rows=cfg.batch_size, seed=cfg.seed, read_threads=cfg.data.read_threads)
    logs: dict[str, StageLog] = {}
    summary: dict[str, Any] = {}
    current = ids
    for stage in SAMPLED:
        if stage not in cfg.stages:
            continue
        sampler = samplers[stage]
        _check_saved(os.path.join(workdir, "stages", f"{stage}.settings.json"), stage_settings(cfg, stage, sampler),
                     f"{stage} results")
        logs[stage] = StageLog(os.path.join(workdir, "stages", f"{stage}.jsonl"), big=ST.BIG_FIELDS)
        rows = sampler.rows_for(stage_params(cfg, stage).n) if hasattr(sampler, "rows_for") else cfg.batch_size
        t0 = time.perf_counter()
        ST.run_blocks(stage, current, logs[stage], runner, rows, stage_work(cfg, stage, sampler, runner),
                      collective=sampler.collective)
        kept = current if stage == "reasoning" else ST.kept_ids(stage, current, logs[stage], cfg)
        summary[stage] = summarize(cfg, stage, current, kept, logs[stage], runner, sampler)
        log.info("%s: %d -> %d steps (%.1f s)", stage, len(current), len(kept), time.perf_counter() - t0)
        current = kept
    sets = {"sft": current}
    if "rebalance" in cfg.stages:
        rl_ids, dist = ST.rebalance(source, current, cfg)
        summary["rebalance"] = {"in": len(current), "out": len(rl_ids), "distribution": dist,
                                "removed_by_reason": {"rebalanced": len(current) - len(rl_ids)}, "kept_by_reason": {}}
        sets["rl"] = rl_ids
    report: dict[str, Any] = {"inputs": {k: info[k] for k in ("format", "inputs", "records")}, "stages": summary}
    if cfg.data.limit:
        report["inputs"]["limit"] = cfg.data.limit
    for sampler in {id(x): x for x in samplers.values()}.values():
        if hasattr(sampler, "stats"):
            report["endpoint_requests"] = sampler.stats()
    if is_main:
        report["outputs"] = write_outputs(cfg, workdir, source, info["format"], sets, logs)
        report["examples"] = {s: examples(cfg, source, s, ids_in, logs[s])
                              for s, ids_in in _stage_inputs(cfg, ids, logs).items() if s != "reasoning"}
        if "consistency" in logs:
            freqs = [r["freq"] for r in (logs["consistency"].get(i) for i in ids) if r.get("freq") is not None]
            report["histogram_png"] = REP.histogram_png(os.path.join(workdir, "match_frequency.png"), freqs,
                                                        cfg.consistency.samples, cfg.consistency.threshold)
        if info.get("known_errors") is not None:
            report["filter_vs_injected"] = injected_scores(cfg, ids, logs, info["known_errors"])
        REP.write_report(workdir, report)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("curation done")
    return report


def _stage_inputs(cfg, ids: list[int], logs: dict[str, StageLog]) -> dict[str, list[int]]:
    """The ids each sampled stage saw (what the stages before it kept)."""
    out, current = {}, ids
    for stage in SAMPLED:
        if stage in logs:
            out[stage] = current
            if stage != "reasoning":
                current = ST.kept_ids(stage, current, logs[stage], cfg)
    return out


def injected_scores(cfg, ids: list[int], logs: dict[str, StageLog], corrupted: dict[int, str]) -> dict[str, Any]:
    """Precision / recall of the removals against the injected corruption: per stage over
    the steps it saw, and for the stages together over every step."""
    out = {}
    removed_all: set[int] = set()
    for stage, seen in _stage_inputs(cfg, ids, logs).items():
        if stage == "reasoning":
            continue
        removed = {i for i in seen if not ST.decide(stage, logs[stage].get(i), cfg)[0]}
        out[stage] = CR.filter_scores(removed, corrupted, seen)
        removed_all |= removed
    if len(out) > 1:
        out[" + ".join(out)] = CR.filter_scores(removed_all, corrupted, ids)
    return out
