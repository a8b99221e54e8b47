"""The frozen models of stage 2: GRPO's reference and UI-MOPD's platform teachers.

They are only scored: parameters in the compute dtype, sharded over the whole mesh like the
policy's (FSDP / tensor, across all hosts), no optimizer state. A model comes from a
Hugging Face folder, a training workdir of ours (its latest checkpoint), or, for smoke
tests that need no earlier run, ``random:<seed>``: a random model of the policy's own
architecture with that seed. An ``http(s)://`` URL names a served scorer instead
(:mod:`guilibra_jax.served_scorer`: another machine's vLLM returns the log-probs; no
parameters here).

Teacher routing (:func:`score_by_platform`): each teacher scores only the rows of its own
platform label (``*`` takes every other label). Processes hold different platform mixes,
so per teacher the processes agree on one padded row count from a few fixed sizes (few
compiled shapes); a process with fewer rows pads with copies of one of its rows, whose
scores are dropped. A served teacher is not collective: each process sends its own rows
(no padding), and rows it cannot score are marked in ``ok`` (dropped from the KL term).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import models as M
from guilibra_jax import served_scorer as SV
from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as run_config
from guilibra_jax.train import model_factory
from guilibra_jax.train import multihost as MH

log = logging.getLogger(__name__)

RANDOM_PREFIX = "random:"


@dataclasses.dataclass
class Frozen:
    """A scored-only model: graphdef, params sharded on the mesh, its ModelConfig, and
    ``unpack``: None, or what turns ``params`` into the model's plain parameters before each
    scoring (QLoRA's quantized base as GRPO's reference: a dequantized copy per call)."""

    name: str
    graphdef: Any
    params: Any
    model_config: Any
    unpack: Callable | None = None

    def plain_params(self):
        return self.params if self.unpack is None else self.unpack(self.params)

    @property
    def bytes(self) -> int:
        return S.tree_nbytes(self.params)


def is_random_spec(spec: str) -> bool:
    return spec.startswith(RANDOM_PREFIX)


def is_served(f) -> bool:
    """A served scorer (:class:`served_scorer.ServedScorer`), not a model on the mesh."""
    return bool(getattr(f, "served", False))


def check_spec(key: str, spec: str) -> None:
    """Raise ConfigError unless ``spec`` is ``random:<int>``, an existing folder or an
    http(s) URL (a served scorer; not contacted here)."""
    if SV.is_url(spec):
        SV.check_url(key, spec)
    elif is_random_spec(spec):
        try:
            int(spec[len(RANDOM_PREFIX):])
        except ValueError:
            raise ConfigError(f"config key {key} = {spec!r} is invalid: expected random:<integer seed>") from None
    elif not os.path.isdir(spec):
        raise ConfigError(f"config key {key} = {spec!r} is invalid: expected an existing Hugging Face folder, "
                          f"training workdir, random:<seed> or http(s):// URL of a served scorer")


def served(key: str, spec: str, config) -> SV.ServedScorer:
    """The served scorer of config key ``key`` (``rl.served`` settings)."""
    sv = config.rl.served
    return SV.ServedScorer(key, spec, timeout=sv.timeout, retries=sv.retries, concurrency=sv.concurrency,
                           rows_per_request=sv.rows_per_request, seed=config.data.seed)


def load(name: str, spec: str, config, mesh, tokenizer, *, materialize: bool = True, key: str = "") -> Frozen:
    """The frozen model ``spec`` (see module doc) in ``config.model.dtype``, sharded on
    ``mesh``; ``materialize=False``: abstract parameters only (for memory plans). A URL:
    the served scorer of config key ``key`` (nothing on the mesh)."""
    if SV.is_url(spec):
        return served(key or name, spec, config)
    dtype = config.model.dtype
    if not materialize:
        graphdef, params, _ = model_factory.abstract_model(spec_model_config(spec, config, tokenizer), mesh,
                                                           **model_factory.model_kwargs(config, dtype=dtype))
        return Frozen(name, graphdef, params, spec_model_config(spec, config, tokenizer))
    if is_random_spec(spec):
        run = config.copy_and_resolve_references()
        run.model.seed = int(spec[len(RANDOM_PREFIX):])
        run.model.dtype = run.model.param_dtype = dtype
        model, mc = model_factory.build_model(run, tokenizer, mesh=mesh)
        graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
        frozen = Frozen(name, graphdef, nnx.to_pure_dict(pstate), mc)
    else:
        graphdef, params, mc = model_factory.load_frozen(spec, dtype=dtype, param_dtype=dtype, mesh=mesh)
        frozen = Frozen(name, graphdef, params, mc)
    n = sum(x.size for x in jax.tree.leaves(frozen.params))
    log.info("%s: %s (%.1fM parameters, %s)", name, spec, n / 1e6, dtype)
    return frozen


def spec_model_config(spec: str, config, tokenizer):
    """The architecture of frozen model ``spec`` without loading weights: a folder's
    config, the policy's for ``random:<seed>``, and for an unset spec (planning a recipe
    before its teachers exist) ``rl.teacher_model_name`` or the policy's."""
    if not spec or is_random_spec(spec):
        name = config.rl.teacher_model_name if not spec else ""
        return M.named_config(name) if name else model_factory.model_config_of(config, tokenizer)
    if any(f.endswith(".safetensors") for f in os.listdir(spec)):
        return M.ModelConfig.from_hf(spec)
    run = run_config.load_run_config(spec)
    tok_dir = run.tokenizer.path or run.model.hf_path or os.path.join(spec, "tokenizer")
    return model_factory.model_config_of(run, model_factory.load_tokenizer(tok_dir))


def from_params(name: str, graphdef, params, model_config, dtype, param_sh) -> Frozen:
    """A frozen copy of the policy's parameters (GRPO's default reference), cast to ``dtype``."""
    cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(dtype), p), out_shardings=param_sh)(params)
    return Frozen(name, graphdef, cast, model_config)


def score(f: Frozen, seq: dict, *, temperature: float, chunk: int | None, banned: tuple[int, ...]) -> jax.Array:
    """Per-token log-probs (global rows) of the device batch ``seq``: [R, N'] in the
    shared-prompt layout (``rollout.shared_batch``), else [R, T] of whole sequences."""
    params = f.plain_params()
    if "prompt_ids" in seq:
        return G.score_shared(f.graphdef, params, seq, temperature=temperature, chunk_size=chunk,
                              banned_token_ids=banned)
    return G.score(f.graphdef, params, seq["input_ids"], seq["positions"], seq["segment_ids"],
                   seq["pixel_values"], seq["vision"], seq["response_mask"], temperature=temperature,
                   chunk_size=chunk, banned_token_ids=banned)


def serve(f, ro, rows: np.ndarray, n_slots: int, shared: bool, tokenizer=None, image_configs=None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A served scorer's log-probs of rollout rows ``rows`` in :func:`score`'s layout
    ([len(rows), n_slots] shared, else [len(rows), Tp + n_slots]: token j of a response at
    column Tp - 1 + j), [len(rows)] bool scored (False: every attempt failed, or
    retokenized) and [len(rows)] bool retokenized (served_scorer.RETOKENIZED). Rows without
    a response (invalid, empty) are not sent. Text-only rows go as token ids (completions);
    rows with an image as chat messages (``tokenizer`` decodes them, ``image_configs``:
    data.images.PlatformImageConfigs, the pixel bounds of each platform)."""
    Tp = ro.prompt_ids.shape[1]
    out = np.zeros((len(rows), n_slots if shared else Tp + n_slots), np.float32)
    ok = np.ones(len(rows), bool)
    retok = np.zeros(len(rows), bool)
    send = [i for i, r in enumerate(rows) if ro.valid[r] and ro.lengths[r] > 0]
    prompt = lambda r: ro.prompt_ids[r][ro.prompt_mask[r] > 0]
    response = lambda r: ro.tokens[r, :ro.lengths[r]]
    text = [i for i in send if ro.grids[rows[i]] is None]
    image = [i for i in send if ro.grids[rows[i]] is not None]
    got = dict(zip(text, f.score([prompt(rows[i]) for i in text], [response(rows[i]) for i in text])))
    if image:
        if tokenizer is None or image_configs is None:
            raise ValueError("serve: rows with images need the tokenizer and the image configs")
        chats, urls = {}, {}     # a group's rows share their prompt's screenshot: one PNG each
        for i in image:
            r = rows[i]
            cfg = image_configs.for_platform(ro.platform[r])
            key = id(ro.pixels[r])
            if key not in urls:
                urls[key] = SV.screenshot_url(ro.pixels[r], ro.grids[r], cfg)
            try:
                chats[i] = SV.chat_row(tokenizer, prompt(r), response(r), [urls[key]], cfg)
            except ValueError as e:
                raise ConfigError(f"config key {f.key} = {f.url!r}: cannot send row {r}'s prompt as chat "
                                  f"messages ({e})") from None
        sent = [i for i in image if chats[i] is not SV.RETOKENIZED]
        got.update({i: SV.RETOKENIZED for i in image if chats[i] is SV.RETOKENIZED})
        got.update(zip(sent, f.score_chat([chats[i] for i in sent])))
    start = 0 if shared else Tp - 1
    for i, logp in got.items():
        if logp is None or logp is SV.RETOKENIZED:
            ok[i], retok[i] = False, logp is SV.RETOKENIZED
        else:
            out[i, start:start + len(logp)] = logp
    return out, ok, retok


def row_sizes(local_rows: int, multiple: int) -> tuple[int, ...]:
    """Padded per-process row counts a teacher call may use (few shapes, few compiles)."""
    sizes = {s for s in (local_rows // 4, local_rows // 2) if s > 0 and s % multiple == 0}
    return tuple(sorted(sizes | {local_rows}))


def check_platforms(platforms: list[str], valid: np.ndarray, teachers: dict) -> tuple:
    """(labels [rows], the named teachers' keys, rows left to '*'): a ConfigError naming
    the platform labels of valid rows that no teacher serves (a collective: every process
    calls it, the labels of all processes are gathered)."""
    labels = np.array([p or "" for p in platforms])
    named = sorted(k for k in teachers if k != "*")
    rest = valid & ~np.isin(labels, named)
    missing = sorted(set(MH.gather_strings(sorted(set(labels[rest])))) if "*" not in teachers else set())
    if missing:
        raise ConfigError(f"config key rl.teachers has no teacher for platform labels {missing}: it has "
                          f"{sorted(teachers)} (add them, or '*' for a default teacher)")
    return labels, named, rest


def score_by_platform(platforms: list[str], valid: np.ndarray, teachers: dict[str, Frozen],
                      score_rows: Callable[[Frozen, np.ndarray], np.ndarray], row_multiple: int,
                      out: np.ndarray, serve_rows: Callable | None = None, ok: np.ndarray | None = None
                      ) -> np.ndarray:
    """Fill ``out`` [local rows, T] with each valid row's log-probs under the teacher of its
    platform label. ``score_rows(teacher, rows)`` scores local row indices ``rows`` (a
    collective call: every process passes the same number of rows) and returns
    [len(rows), T]. A collective: every process calls it with its own rows. Served
    teachers (:func:`is_served`) go to ``serve_rows(teacher, rows)`` -> ([len(rows), T],
    [len(rows)] bool scored) with this process's rows only; unscored rows are set False
    in ``ok`` [local rows]."""
    labels, named, rest = check_platforms(platforms, valid, teachers)
    calls = [(k, np.nonzero(valid & (labels == k))[0]) for k in named]
    if "*" in teachers:
        calls.append(("*", np.nonzero(rest)[0]))
    sizes = row_sizes(len(labels), row_multiple)
    for key, rows in calls:
        if is_served(teachers[key]):     # per process: no collective, no padding
            if len(rows):
                out[rows], scored = serve_rows(teachers[key], rows)
                if ok is not None:
                    ok[rows] &= scored
            continue
        need = MH.agree_max(len(rows))
        if need == 0:
            continue
        size = next(s for s in sizes if s >= need)
        fill = rows[0] if len(rows) else int(np.argmax(valid)) if valid.any() else 0
        padded = np.concatenate([rows, np.full(size - len(rows), fill, np.int64)]).astype(np.int64)
        scored = score_rows(teachers[key], padded)
        out[rows] = scored[:len(rows)]
    return out


def teacher_order(teachers: dict) -> list[str]:
    """The teachers' labels in the order of the update's ``teacher_index`` (full_kl): the
    named platforms sorted, then '*' (as :func:`score_by_platform` routes)."""
    return sorted(k for k in teachers if k != "*") + (["*"] if "*" in teachers else [])


def teacher_index(platforms: list[str], order: list[str]) -> np.ndarray:
    """[rows] int32: each row's position in ``order`` (:func:`teacher_order`): its platform
    label's teacher, else '*'. Rows with neither (invalid rows: no loss) get 0."""
    pos = {k: i for i, k in enumerate(order)}
    default = pos.get("*", 0)
    return np.array([pos.get(p or "", default) for p in platforms], np.int32)

