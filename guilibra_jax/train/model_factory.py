"""Model and tokenizer from a run config: a local Hugging Face folder, a named real
size (random init, for benchmarks), or a tiny random model (demos and tests)."""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from guilibra_jax import atomic
from guilibra_jax import models as M
from guilibra_jax import sharding as S
from guilibra_jax.choices import DTYPE_NAMES
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import config as run_config
from guilibra_jax.train.export import export_model

log = logging.getLogger(__name__)

DTYPES = {name: getattr(jnp, name) for name in DTYPE_NAMES}   # model.dtype / model.param_dtype


def dtype_of(name: str, key: str):
    if name not in DTYPES:
        raise ValueError(f"{key}: unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def tiny_model_config(tiny: Any, tokenizer) -> M.ModelConfig:
    """A small random-init config whose vocabulary and special ids follow ``tokenizer``."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>")}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id and t != "<|video_pad|>"]
    if missing:
        raise ValueError(f"tokenizer lacks Qwen special tokens {missing}")
    family = tiny.family
    head_dim = tiny.hidden // tiny.heads
    section = tuple(tiny.mrope_section) if tiny.mrope_section else _default_section(head_dim)
    text = M.TextConfig(
        vocab_size=len(tokenizer), hidden_size=tiny.hidden, intermediate_size=tiny.intermediate,
        num_layers=tiny.layers, num_heads=tiny.heads, num_kv_heads=tiny.kv_heads, head_dim=head_dim,
        rope_theta=10_000.0, mrope_section=section, mrope_interleaved=family == "qwen3_vl",
        qkv_bias=family == "qwen2_5_vl", qk_norm=family == "qwen3_vl", max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=tokenizer.pad_token_id)
    vision_kw = dict(depth=tiny.vision_depth, hidden_size=tiny.vision_hidden,
                     intermediate_size=tiny.vision_intermediate, num_heads=tiny.vision_heads,
                     out_hidden_size=tiny.hidden)
    if family == "qwen2_5_vl":
        vision = M.VisionConfig(**vision_kw, patch_size=14, window_size=56,
                                fullatt_block_indexes=(tiny.vision_depth - 1,))
    else:
        vision = M.VisionConfig(**vision_kw, patch_size=16, hidden_act="gelu_pytorch_tanh",
                                num_position_embeddings=64, deepstack_visual_indexes=(0,))
    video = ids["<|video_pad|>"] if ids["<|video_pad|>"] is not None else ids["<|image_pad|>"]
    return M.ModelConfig(family=family, text=text, vision=vision, image_token_id=ids["<|image_pad|>"],
                         video_token_id=video, vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=bool(tiny.tie))


def _default_section(head_dim: int) -> tuple[int, int, int]:
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return (t, h, half - t - h)


def build_model(config: Any, tokenizer, mesh=None) -> tuple[M.QwenVL, M.ModelConfig]:
    """(model, model_config) as ``config.model`` describes. With ``mesh`` the parameters
    are created (random init) or loaded (``model.hf_path``) straight into their shardings,
    so no device ever holds the whole model."""
    mc = config.model
    dtype = dtype_of(mc.dtype, "model.dtype")
    param_dtype = dtype_of(mc.param_dtype, "model.param_dtype")
    kw = dict(dtype=dtype, param_dtype=param_dtype, remat=mc.remat, scan_layers=mc.scan_layers,
              attention_block=mc.attention_block, mlp_chunk=mc.mlp_chunk)
    if mc.hf_path:
        atomic.check_complete(mc.hf_path, "model.hf_path")   # not a half-written export of ours
        if not os.path.isdir(mc.hf_path):
            raise FileNotFoundError(f"model.hf_path: {mc.hf_path!r} is not a folder")
        return M.load_hf(mc.hf_path, mesh=mesh, **kw)
    model_config = model_config_of(config, tokenizer)
    make = lambda: M.QwenVL(model_config, rngs=nnx.Rngs(mc.seed), **kw)
    if mesh is None:
        return make(), model_config
    # Random init runs eagerly on the host CPU (a jitted init of a whole model compiles for
    # minutes), then each parameter goes to its sharding; every process computes the same values.
    with jax.default_device(_host_device()):
        model = make()
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    params = jax.tree.map(S.put_host, jax.device_get(nnx.to_pure_dict(state)), S.param_shardings(state, mesh))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest), model_config


def _host_device():
    """This process's CPU device (jax.devices() lists every process's devices)."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # no CPU backend: the default device
        return jax.local_devices()[0]


def model_kwargs(config: Any, dtype: str | None = None) -> dict:
    """QwenVL keyword arguments of ``config.model`` (``dtype`` overrides compute and param dtype)."""
    mc = config.model
    return dict(dtype=dtype_of(dtype or mc.dtype, "model.dtype"),
                param_dtype=dtype_of(dtype or mc.param_dtype, "model.param_dtype"), remat=mc.remat,
                scan_layers=mc.scan_layers, attention_block=mc.attention_block, mlp_chunk=mc.mlp_chunk)


def abstract_model(model_config: M.ModelConfig, mesh, **kw) -> tuple[Any, dict, dict]:
    """(graphdef, abstract params, their shardings) without allocating anything: the
    params are ShapeDtypeStructs carrying their shardings on ``mesh``."""
    graphdef, state, _ = nnx.split(nnx.eval_shape(lambda: M.QwenVL(model_config, rngs=nnx.Rngs(0), **kw)),
                                   nnx.Param, ...)
    shardings = S.param_shardings(state, mesh, log=False)
    params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                          nnx.to_pure_dict(state), shardings)
    return graphdef, params, shardings


def model_config_of(config: Any, tokenizer) -> M.ModelConfig:
    """The ModelConfig of ``config.model`` without building the model (a tiny config follows
    ``tokenizer``; a named size is fixed; an HF folder's config.json)."""
    mc = config.model
    if mc.hf_path:
        atomic.check_complete(mc.hf_path, "model.hf_path")
        return M.ModelConfig.from_hf(mc.hf_path)
    if mc.name == "tiny":
        return tiny_model_config(mc.tiny, tokenizer)
    try:
        return M.named_config(mc.name)
    except KeyError as e:
        raise ConfigError(f"config key model.name = {mc.name!r} is invalid: expected 'tiny' or a named size "
                          f"({e.args[0]})") from None


def load_tokenizer(path: str):
    from transformers import AutoTokenizer
    atomic.check_complete(path)
    if not path or not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder {path!r} not found")
    return AutoTokenizer.from_pretrained(path)


def export(graphdef, params, model_config: M.ModelConfig, tokenizer, path: str, config: Any = None) -> str:
    """Write params as a Hugging Face folder. With the run ``config``: the complete
    export of :func:`guilibra_jax.train.export.export_model` (tokenizer, chat template,
    preprocessor and generation configs with the run's pixels and stop ids); without
    it, only config.json, safetensors and the tokenizer."""
    if config is not None:
        return export_model(graphdef, params, model_config, tokenizer, path, config)
    model = nnx.merge(graphdef, params)
    with atomic.writing_folder(path) as tmp:   # whole or not at all
        M.save_hf(model, model_config, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return path


WEIGHTS_KEYS = {"params": ("params",), "ema": ("opt_state", "ema")}   # where each sits in the train state


def weights_name(config, weights: str | None = None) -> str:
    """Which of a run's weights to read: ``weights`` ("params" / "ema") when given, else what
    its export holds (the moving average of ``optim.ema_decay`` when kept)."""
    return weights or ("ema" if config.optim.ema_decay > 0 else "params")


class RunWeights:
    """The model weights in a training workdir's checkpoints, as its export holds them:
    ``restore(step) -> (step, params)`` (host arrays; None: the latest step). The
    parameters, or their moving average (:func:`weights_name`); with LoRA the checkpoint's
    adapters merged into the run's base, built again (``model.hf_path`` or the seeded init)
    and checked against the run's ``lora_base.json``."""

    def __init__(self, config, tokenizer, workdir: str, weights: str | None = None):
        from guilibra_jax.train import lora_state
        self.weights, self.checkpoints = weights_name(config, weights), os.path.join(workdir, "checkpoints")
        lora = lora_state.lora_spec(config) is not None
        build = lambda: build_model(config, tokenizer)[0]
        model = build() if lora else nnx.eval_shape(build)
        self.graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
        self.model_config, self.abstract, self.frozen = model.config, nnx.to_pure_dict(pstate), None
        if lora:
            mesh = S.make_mesh({"data": 1}, jax.devices()[:1])
            self.frozen = lora_state.FrozenBase.build(config, self.abstract, S.param_shardings(pstate, mesh), mesh)
            lora_state.check_base(self.frozen, config, workdir, resumed=True, is_main=False)
            self.abstract = self.frozen.adapters

    def restore(self, step: int | None = None) -> tuple[int, Any]:
        step, params = C.restore_params_only(self.checkpoints, self.abstract, step, key=WEIGHTS_KEYS[self.weights])
        if self.frozen is not None:
            params = jax.device_get(self.frozen.merged(params))
        return step, params


def export_checkpoint(workdir: str, out: str | None = None, step: int | None = None,
                      weights: str | None = None) -> str:
    """``python -m launch.convert``: checkpoint ``step`` (None: the latest) of ``workdir`` as
    a complete Hugging Face folder ``out`` (default ``WORKDIR/export_step<N>``), with the
    weights :class:`RunWeights` reads (``weights``: "params" / "ema"; None: what the run's
    export holds); returns ``out``. A missing run or step is a UserError naming the flag."""
    from guilibra_jax.errors import UserError
    from guilibra_jax.train import data_source
    try:
        config = run_config.load_run_config(workdir)
    except FileNotFoundError as e:
        raise UserError(f"--workdir: {e}") from None
    atomic.check_complete(config.model.hf_path, "config key model.hf_path")   # whose files the export copies
    atomic.check_complete(config.tokenizer.path, "config key tokenizer.path")
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    run = RunWeights(config, tokenizer, workdir, weights)
    try:
        step, params = run.restore(step)
    except FileNotFoundError as e:
        raise UserError(f"--workdir={workdir} --step={step} --weights={run.weights}: {e}") from None
    out = out or os.path.join(workdir, f"export_step{step}")
    export(run.graphdef, params, run.model_config, tokenizer, out, config=config)
    log.info("exported step %d (%s) to %s", step, run.weights, out)
    return out


def load_frozen(path: str, *, dtype: str = "bfloat16", param_dtype: str = "bfloat16", step: int | None = None,
                mesh=None) -> tuple[Any, Any, M.ModelConfig]:
    """(graphdef, params, model_config) of a model that is only scored (a GRPO reference,
    a MOPD teacher, an evaluated checkpoint), from a Hugging Face folder (config.json +
    safetensors) or a training workdir of ours (config.json + tokenizer/ + checkpoints/;
    the latest checkpoint, or ``step``). No optimizer state is kept. With ``mesh`` the
    parameters are loaded straight into their shardings."""
    atomic.check_complete(path)   # not a half-written export or merge of ours
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model folder {path!r} not found")
    has_weights = any(f.endswith(".safetensors") for f in os.listdir(path))
    if has_weights:
        model, model_config = M.load_hf(path, dtype=dtype_of(dtype, "dtype"),
                                        param_dtype=dtype_of(param_dtype, "param_dtype"), mesh=mesh)
        graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
        return graphdef, nnx.to_pure_dict(pstate), model_config
    ckpt_dir = os.path.join(path, "checkpoints")
    if not (os.path.isdir(ckpt_dir) and os.path.exists(os.path.join(path, "config.json"))):
        raise FileNotFoundError(f"{path!r} is neither a Hugging Face folder (config.json + *.safetensors) nor a "
                                f"training workdir (config.json + checkpoints/)")
    run = run_config.load_run_config(path)
    if run.model.lora.rank:
        raise ConfigError(f"{path!r} is the workdir of a LoRA run: its checkpoints hold adapters only; give its "
                          f"export/ folder, or one that python -m launch.convert --workdir={path} writes")
    tok_dir = run.tokenizer.path or run.model.hf_path or os.path.join(path, "tokenizer")
    tokenizer = load_tokenizer(tok_dir)
    run.model.dtype, run.model.param_dtype = dtype, param_dtype
    model_config = model_config_of(run, tokenizer)
    kw = dict(dtype=dtype_of(dtype, "dtype"), param_dtype=dtype_of(param_dtype, "param_dtype"),
              remat=run.model.remat, scan_layers=run.model.scan_layers,
              attention_block=run.model.attention_block, mlp_chunk=run.model.mlp_chunk)
    if mesh is not None:
        graphdef, abstract, shardings = abstract_model(model_config, mesh, **kw)
    else:
        graphdef, pstate, _ = nnx.split(nnx.eval_shape(lambda: M.QwenVL(model_config, rngs=nnx.Rngs(0), **kw)),
                                        nnx.Param, ...)
        abstract, shardings = nnx.to_pure_dict(pstate), None
    _, params = C.restore_params_only(ckpt_dir, abstract, step, key=WEIGHTS_KEYS[weights_name(run)])   # what its export holds
    cast = dtype_of(param_dtype, "param_dtype")
    params = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(cast), p), out_shardings=shardings)(params)
    return graphdef, params, model_config
