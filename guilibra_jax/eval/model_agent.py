"""A trained model as an evaluation agent, registered as ``"checkpoint"``.

    make_agent("checkpoint", workdir="runs/demo")             # latest checkpoint of a training run
    make_agent("checkpoint", workdir="runs/demo", step=200)   # one step of it
    make_agent("checkpoint", hf_path="runs/demo/export", run_config="runs/demo")  # an HF folder
    for agent in checkpoint_sweep("all", workdir="runs/demo"): ...  # every checkpoint, in step order

``workdir`` is a folder ``python -m launch.train`` wrote (``config.json``, the tokenizer,
``checkpoints/``); the model is built from its run config (``train.model_factory``) and
the weights its export holds restored from orbax (``model_factory.RunWeights``: the
parameters, or their moving average with ``optim.ema_decay``; LoRA's adapters merged into
the run's base); a sweep
(:func:`checkpoint_sweep`, ``steps`` "all" or a tuple) builds the model once and restores
each step's parameters in turn (``CheckpointAgent.at_step``). ``hf_path`` is
a folder of ``models.save_hf`` / the trainer's export, tokenizer included; it carries no
run config, so give ``run_config`` (the workdir it came from) or the settings its run
changed (``method``, ``system_prompt``, ``min_pixels``, ``max_pixels``).

The prompt is the training pipeline's: an observation becomes a native
:class:`data.native.StepRecord` (:func:`record_from_observation`) and goes through
``data.pipeline.make_rl_loader`` with the run's data config (``make_sample`` and the
left-padded ``collate_rl``: same system prompt, user text, image preprocessing, chat
tokens and length buckets), then ``generate.generate`` stops on ``<|im_end|>``.

The model answers in its training format and coordinate space, exposed as attributes
that ``eval.run`` scores this agent with: ``fmt`` "guilibra" (``<answer>`` JSON, run
method guilibra) or "tool_call" (method mopd); ``coord_space`` the family's
(qwen2_5_vl: pixels of the resized image, with ``resized_size`` a function of the image
size and platform, under the run's pixel budgets ``data.pixels``; qwen3_vl: 0..1000). A
prompt that opened the think block (``data.open_think``) gets ``<think>`` back in the
response. The ``fmt`` / ``coord_space`` / ``resized_size`` keywords that
``eval.run`` passes every agent are therefore ignored.
"""

from __future__ import annotations

import copy
import io
import logging
import os
from typing import Any, Iterator, Sequence

import jax
import ml_collections as mlc
from flax import nnx

from guilibra_jax import actions as A
from guilibra_jax import atomic
from guilibra_jax import generate as G
from guilibra_jax.data import native as N
from guilibra_jax.data import prompts as P
from guilibra_jax.data import readers as R
from guilibra_jax.data.pipeline import make_rl_loader
from guilibra_jax.envs.env import Observation
from guilibra_jax.eval.agents import register_agent
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import data_source as DS
from guilibra_jax.train import model_factory as MF
from guilibra_jax.train import config as RC
from guilibra_jax.train.export import RUN_CONFIG_FILE

log = logging.getLogger(__name__)

KEY = "agent_kwargs.checkpoint"
METHOD_FORMAT = {"guilibra": "guilibra", "mopd": "tool_call"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


# ----------------------------------------------------------------------------- observation -> record

def _prompt_only_target(platform: str) -> N.StepTarget:
    """A stand-in label: ``make_sample`` renders a target, but only the prompt is used."""
    call = A.ToolCall(P.mopd_tool(platform), {"action": "terminate", "status": "success"})
    return N.StepTarget("Terminate", "prompt only", "success", tool_call=call)


def _png(image) -> dict:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)    # lossless: the same pixels come back
    return {"bytes": buf.getvalue()}


def record_from_observation(obs: Observation) -> N.StepRecord:
    """The native record of what ``obs`` shows (screenshot inline, stand-in target)."""
    return N.StepRecord(trajectory_id=obs.task_id, step=obs.step, platform=obs.platform,
                        instruction=obs.instruction, history=tuple(obs.history), image=_png(obs.screenshot),
                        image_size=tuple(obs.screen_size), target=_prompt_only_target(obs.platform),
                        split="test")


class _RecordList(R.StepSource):
    def __init__(self, records: Sequence[N.StepRecord]):
        self.records = list(records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> N.StepRecord:
        return self.records[i]

    def where(self, i: int) -> str:
        r = self.records[i]
        return f"observation {i} ({r.trajectory_id} step {r.step})"


# ----------------------------------------------------------------------------- loading

def _need_tokenizer(path: str, key: str) -> None:
    if not any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        raise FileNotFoundError(f"{key}: no tokenizer in {path!r} (none of {list(_TOKENIZER_FILES)})")


def load_run_config(workdir: str, key: str = "workdir") -> mlc.ConfigDict:
    """The run config a training workdir holds (or a config.json path), over the defaults."""
    try:
        return RC.load_run_config(workdir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{KEY}.{key}: {e}") from None


def _tokenizer(config, workdir: str):
    """The run's tokenizer (``data_source.prepare_tokenizer``), never rebuilt here."""
    path = config.tokenizer.path or config.model.hf_path or os.path.join(workdir, "tokenizer")
    _need_tokenizer(path, f"{KEY}.workdir={workdir!r}")
    return DS.prepare_tokenizer(config, workdir)


def _checkpoint_dir(workdir: str) -> str:
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        raise FileNotFoundError(f"{KEY}.workdir={workdir!r}: no checkpoints folder {ckpt_dir}")
    return ckpt_dir


def checkpoint_steps(ckpt_dir: str) -> list[int]:
    """The steps of the complete checkpoints under ``ckpt_dir``, ascending (orbax's
    listing, ``Checkpointer.all_steps``: half-written ones are not there)."""
    ckpt = C.Checkpointer(ckpt_dir, max_to_keep=None, async_save=False)
    try:
        return sorted(ckpt.all_steps())
    finally:
        ckpt.close()


def _need_step(ckpt_dir: str, step: int, key: str = "step") -> None:
    if step not in (steps := checkpoint_steps(ckpt_dir)):
        raise FileNotFoundError(f"{KEY}.{key}: no checkpoint step {step} in {ckpt_dir} (complete steps "
                                f"there: {steps})")


def _restore(run: MF.RunWeights, step: int | None) -> tuple[int, Any]:
    """(step, params) of checkpoint ``step`` (None: the latest) of ``run``."""
    try:
        return run.restore(step)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{KEY}.workdir={os.path.dirname(run.checkpoints)!r}: {e}") from None


def load_checkpoint(workdir: str, step: int | None, config: mlc.ConfigDict):
    """(tokenizer, model_config, graphdef, params, step, run weights) of a training workdir:
    the weights its export holds (``model_factory.RunWeights``: the moving average of
    ``optim.ema_decay``; LoRA's adapters merged into its base)."""
    ckpt_dir = _checkpoint_dir(workdir)
    if step is not None:
        _need_step(ckpt_dir, step)
    tokenizer = _tokenizer(config, workdir)
    run = MF.RunWeights(config, tokenizer, workdir)
    step, params = _restore(run, step)
    return tokenizer, run.model_config, run.graphdef, params, step, run


def load_hf_folder(hf_path: str, config: mlc.ConfigDict):
    """(tokenizer, model_config, graphdef, params, None) of a Hugging Face folder."""
    if not os.path.isdir(hf_path):
        raise FileNotFoundError(f"{KEY}.hf_path: {hf_path!r} is not a folder")
    _need_tokenizer(hf_path, f"{KEY}.hf_path")
    config.model.hf_path, config.tokenizer.path = hf_path, ""
    tokenizer = DS.prepare_tokenizer(config, hf_path)
    model, model_config = MF.build_model(config, tokenizer)
    graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
    return tokenizer, model_config, graphdef, nnx.to_pure_dict(pstate), None


# ----------------------------------------------------------------------------- the agent

class CheckpointAgent:
    """Greedy (``temperature`` 0) or sampled responses of a model, prompted exactly as
    in training. ``respond_batch`` answers many observations, ``batch_size`` per
    ``generate`` call (rows padded to ``batch_size``); a single call uses one row."""

    needs_world = False

    def __init__(self, config: mlc.ConfigDict, tokenizer, model_config, graphdef, params, *,
                 max_new_tokens: int = 256, temperature: float = 0.0, batch_size: int = 8, seed: int = 0,
                 origin: str = "", step: int | None = None, run: MF.RunWeights | None = None):
        if batch_size < 1:
            raise ValueError(f"{KEY}.batch_size must be >= 1, got {batch_size}")
        self.config, self.tokenizer, self.model_config = config, tokenizer, model_config
        # committed to one device, so that checkpoints restored or loaded either way share compilations
        self.graphdef, self.params = graphdef, jax.device_put(params, jax.devices()[0])
        self.batch_size, self.origin, self.seed = int(batch_size), origin, seed
        self.step, self.run = step, run      # run: the workdir's checkpoints (None for hf_path)
        self.method = config.data.method
        self.fmt = METHOD_FORMAT[self.method]
        self.coord_space, self.resized_size = DS._family_coords(model_config, config.data)
        self.think_opened = DS.think_opened(config, tokenizer)   # Thinking templates: prompt ends "<think>\n"
        stop = tuple(dict.fromkeys(i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                               tokenizer.eos_token_id) if i is not None))
        self.sampling = G.SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens,
                                         stop_token_ids=stop, pad_token_id=tokenizer.pad_token_id or 0,
                                         logprobs=False)
        self._rng = jax.random.key(seed)

    def at_step(self, step: int) -> "CheckpointAgent":
        """This agent with the parameters of another checkpoint of its run. Everything
        else (tokenizer, graphdef, sampling, hence generate's compilations) is shared."""
        if self.run is None:
            raise ValueError(f"{KEY}: {self.origin} is not a training workdir; it has no checkpoint steps")
        _need_step(self.run.checkpoints, step, "steps")
        step, params = _restore(self.run, step)
        other = copy.copy(self)
        other.params = jax.device_put(params, jax.devices()[0])
        other.step, other.origin = step, f"{os.path.dirname(self.run.checkpoints)} step {step}"
        other._rng = jax.random.key(self.seed)        # as if made alone at that step
        return other

    def reset(self, env) -> None:
        pass

    def __call__(self, obs: Observation) -> str:
        return self.respond_batch([obs], rows=1)[0]

    def prompt_batches(self, observations: Sequence[Observation], rows: int | None = None):
        """``collate_rl`` batches of the observations' prompts, in order, ``rows`` rows each."""
        return self._batches(_RecordList([record_from_observation(o) for o in observations]), rows)

    def _batches(self, source: _RecordList, rows: int | None):
        cfg = DS.data_config(self.config, [], for_eval=True)
        cfg.update(batch_size=rows or self.batch_size, shuffle=False)   # rows in observation order
        loader = make_rl_loader(cfg, self.tokenizer, self.model_config, shard_index=0, shard_count=1,
                                source=source)
        try:
            yield from loader
        finally:
            loader.close()

    def respond_batch(self, observations: Sequence[Observation], rows: int | None = None) -> list[str]:
        """One response per observation; "" where the prompt was dropped (logged)."""
        if not observations:
            return []
        source = _RecordList([record_from_observation(o) for o in observations])
        index = {source.where(i): i for i in range(len(source))}
        out = [""] * len(source)
        for batch in self._batches(source, rows):
            for d in batch["dropped"]:
                log.warning("checkpoint agent: no prompt for %s: %s (%s)", d.where, d.reason, d.message)
            for where, text in zip(batch["where"], self._generate(batch)):
                out[index[where]] = text
        return out

    def _generate(self, batch: dict) -> list[str]:
        vision = device_vision_inputs(batch["vision"]) if batch.get("vision") else None
        self._rng, key = jax.random.split(self._rng)
        out = G.generate(self.graphdef, self.params, batch["prompt_ids"], batch["prompt_mask"], batch["positions"],
                         batch["rope_deltas"], batch.get("pixel_values"), vision, key, self.sampling)
        tokens, lengths = jax.device_get((out.tokens, out.lengths))
        return [self.decode(tokens[i, :lengths[i]]) for i in range(batch["num_samples"])]

    def decode(self, ids) -> str:
        """Text of generated ids without the final stop token (``generate.decode_response``),
        with ``<think>`` put back when the prompt opened it (``actions.reopen_think``), so
        that scorers see the whole response."""
        text = G.decode_response(self.tokenizer, ids, self.sampling.stop_token_ids)
        return A.reopen_think(text, self.think_opened)


@register_agent("checkpoint")
def make_checkpoint_agent(workdir: str = "", hf_path: str = "", step: int = -1, *, steps: Any = (),
                          run_config: str = "", max_new_tokens: int = 256, temperature: float = 0.0,
                          batch_size: int = 8, seed: int = 0, method: str = "", system_prompt: str = "",
                          min_pixels: int = 0, max_pixels: int = 0, max_length: int = 0, dtype: str = "",
                          fmt: Any = None, coord_space: Any = None, resized_size: Any = None) -> CheckpointAgent:
    """The agent of a training ``workdir`` (checkpoint ``step``; -1: the latest) or of a
    Hugging Face folder ``hf_path`` (exactly one). An ``hf_path`` takes its data
    settings from ``run_config`` (the training workdir it was exported from, or its
    config.json), else from the ``run_config.json`` our exports carry, else from
    ``train.config.base_config``. ``method``,
    ``system_prompt``, ``min_pixels``, ``max_pixels``, ``max_length`` (length filter;
    the prompt bucket unless the run sets ``data.seq_buckets``) and ``dtype`` (compute)
    override the run config's ("" / 0: keep). ``fmt``, ``coord_space`` and
    ``resized_size`` are ignored (module doc). ``steps`` (several checkpoints) is
    :func:`checkpoint_sweep`'s; here it must be empty."""
    del fmt, coord_space, resized_size
    if steps:
        raise ValueError(f"{KEY}.steps={steps!r} makes one agent per step: use checkpoint_sweep (eval.run "
                         "does), or step for one checkpoint")
    if bool(workdir) == bool(hf_path):
        raise ValueError(f"{KEY}: set exactly one of workdir (a training run) and hf_path (a Hugging Face "
                         f"folder); got workdir={workdir!r}, hf_path={hf_path!r}")
    if workdir and run_config:
        raise ValueError(f"{KEY}.run_config={run_config!r} is for hf_path; a workdir has its own config.json")
    atomic.check_complete(hf_path, f"{KEY}.hf_path")   # not a half-written export or merge of ours
    if hf_path and not run_config and os.path.exists(os.path.join(hf_path, RUN_CONFIG_FILE)):
        run_config = os.path.join(hf_path, RUN_CONFIG_FILE)   # our exports carry their run's config
    if workdir or run_config:
        config = load_run_config(workdir or run_config, "workdir" if workdir else "run_config")
    else:
        config = RC.base_config()
    for key, value in (("data.method", method), ("data.system_prompt", system_prompt),
                       ("data.min_pixels", min_pixels), ("data.max_pixels", max_pixels),
                       ("data.max_length", max_length), ("model.dtype", dtype)):
        if value:
            group, name = key.split(".")
            config[group][name] = value
    if config.data.method not in METHOD_FORMAT:
        raise ValueError(f"{KEY}.method: {config.data.method!r}, expected one of {sorted(METHOD_FORMAT)}")
    if workdir:
        loaded = load_checkpoint(workdir, None if step is None or step < 0 else int(step), config)
    else:
        loaded = (*load_hf_folder(hf_path, config), None)
    tokenizer, model_config, graphdef, params, step_, run = loaded
    where = f"{workdir} step {step_}" if workdir else hf_path
    log.info("checkpoint agent: %s (%s, method %s)", where, model_config.family, config.data.method)
    return CheckpointAgent(config, tokenizer, model_config, graphdef, params, max_new_tokens=max_new_tokens,
                           temperature=temperature, batch_size=batch_size, seed=seed, origin=where, step=step_,
                           run=run)


# ----------------------------------------------------------------------------- several checkpoints

def sweep_steps(workdir: str, steps: Any) -> list[int]:
    """The checkpoint steps ``steps`` names, ascending: "all" (or ``("all",)``, as the
    command line gives it) for every complete checkpoint of ``workdir``, else steps that
    must all be there."""
    ckpt_dir = _checkpoint_dir(workdir)
    available = checkpoint_steps(ckpt_dir)
    steps = (steps,) if isinstance(steps, (str, int)) else tuple(steps)
    if steps == ("all",):
        if not available:
            raise FileNotFoundError(f"{KEY}.steps='all': no complete checkpoint under {ckpt_dir}")
        return available
    if not steps or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise ValueError(f"{KEY}.steps: expected checkpoint steps (ints) or 'all', got {steps!r}")
    if missing := sorted(set(steps) - set(available)):
        raise FileNotFoundError(f"{KEY}.steps: no checkpoint step {', '.join(map(str, missing))} in {ckpt_dir} "
                                f"(complete steps there: {available})")
    return sorted(set(steps))


def checkpoint_sweep(steps: Any, *, workdir: str = "", hf_path: str = "", step: int = -1,
                     **kw) -> Iterator[CheckpointAgent]:
    """One agent per checkpoint of a training ``workdir``, in step order (``steps``: see
    :func:`sweep_steps`; the other keywords are :func:`make_checkpoint_agent`'s). The
    model is built once; each later step restores only its parameters, when its turn
    comes, so generate compiles once for the whole sweep. Steps are checked up front."""
    if hf_path:
        raise ValueError(f"{KEY}.steps={steps!r}: hf_path={hf_path!r} is one model with no checkpoint steps; "
                         "sweep a training workdir, or leave steps empty")
    if step is not None and step >= 0:
        raise ValueError(f"{KEY}: set step ({step}) or steps ({steps!r}), not both")
    if not workdir:
        raise ValueError(f"{KEY}.steps={steps!r}: set workdir, the training run whose checkpoints to sweep")
    wanted = sweep_steps(workdir, steps)
    agent = make_checkpoint_agent(workdir=workdir, step=wanted[0], **kw)
    yield agent
    for s in wanted[1:]:
        agent = agent.at_step(s)      # the previous params go once the caller is done with them
        yield agent
