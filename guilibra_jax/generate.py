"""Jitted multimodal sampling (prefill with images + KV-cache decode loop) and scoring.

Three entry points:

* :func:`prepare_prompts` (host, numpy): left-pads a list of prompts, computes their
  M-RoPE positions and ``rope_deltas`` with ``get_rope_index``, concatenates the images'
  pixel rows and builds the vision tower's inputs.
* :func:`generate` (jit, compiled once per shape / ``graphdef`` / :class:`SamplingConfig`):
  one prefill of the left-padded prompts (images included) into a KV cache of
  ``T + max_new_tokens - 1`` slots (with ``copies`` > 1: T per prompt, and
  ``max_new_tokens - 1`` per row), then a ``jax.lax.while_loop`` of decode steps that
  exits as soon as every row has emitted a stop token (or ``max_new_tokens`` are out).
  Nothing leaves the device inside the loop, so it runs unchanged with parameters sharded
  on a mesh (XLA propagates the shardings into the cache).
  With ``copies = G`` the prompt arrays hold B / G distinct prompts: the vision tower and
  the prefill run once per prompt and the prefill's KV cache is shared by its G sampled
  rows, as GRPO's groups need: held once, each row caching only its own tokens
  (:func:`share_prefix`), or repeated for each row (:func:`share_rows`,
  ``SamplingConfig.shared_prefix=False``).
* :func:`score` (jit): per-token log-probs of given sequences under the model, for the
  RL trainers' old / reference / teacher log-probs.

Decode positions. ``get_rope_index`` returns ``rope_deltas[b] = max position + 1 - n_b``
where ``n_b`` is the number of real prompt tokens of row ``b``; the token with text index
``j`` (counting real tokens only, so left padding does not shift it) sits at ``j + delta``
on all three M-RoPE axes. Generated token ``i`` (0-based) has text index ``n_b + i``,
hence position ``n_b + rope_deltas[b] + i`` on all axes, i.e. ``max prompt position + 1 + i``.

Stopping. Rows stop independently on any single token of ``stop_token_ids`` (e.g.
``<|im_end|>`` and ``<|endoftext|>``); the stop token is kept and counted in ``lengths``;
every later slot holds ``pad_token_id`` with log-prob 0. Multi-token stop *sequences* and
stop *strings* (``</answer>``, ``</tool_call>`` ...) are not handled here: the caller
decodes ``tokens[b, :lengths[b]]`` with its tokenizer and truncates at the first stop
string (tokenizers merge characters across token boundaries, so only a text-level check
is exact).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from guilibra_jax.models.config import ModelConfig
from guilibra_jax.models.rope_index import get_rope_index
from guilibra_jax.models.vision import device_vision_inputs, prepare_vision_inputs

Array = jax.Array


# ----------------------------------------------------------------------------- config / output
@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling options (a jit static argument: each distinct value compiles once).

    temperature: 0 = greedy (argmax), else logits are divided by it before sampling.
    top_p: nucleus sampling; keep the smallest set of most likely tokens whose probability
      (after temperature and top-k) reaches top_p. 1.0 = off.
    top_k: keep only the k most likely tokens (applied before top-p). 0 = off.
    max_new_tokens: N, the number of generated slots.
    stop_token_ids: a row is done after it emits any of these (kept, counted in lengths).
    pad_token_id: written after a row's stop token.
    banned_token_ids: never sampled (their logits are -inf before anything else), e.g. the
      vision placeholders: a response holding ``<|image_pad|>`` would take image features
      when the rollout is re-scored. Score with the same ids (:func:`score`).
    logprobs: False for callers that read only tokens (evaluation): the output's logprobs
      are 0, and a greedy step skips the log-normaliser over the vocabulary (a sampled
      step's log-prob comes with its draw and is kept).
    vocab_major: the decode head's logits as [V, B] (the vocabulary major) rather than
      [B, V]; the same tokens either way. None: on CPU when B <= 128 (XLA's CPU dots ran
      [V, D] x [D, B] 1.02-1.5x faster than [B, D] x [D, V] at 8-128 rows and D = 512, up to
      2.7x at D = 2048, and slower from ~160 rows: docs/benchmarks.md), else [B, V].
    shared_prefix: with ``copies`` > 1, decode attention reads each prompt's keys and values
      once for its rows (:func:`share_prefix`, ``attention.cascade_attention``) instead of a
      copy of them in every row's cache (:func:`share_rows`); the same tokens (log-probs up to
      float rounding), less cache, and a decode step that reads 1/copies of the prompt's
      keys and values (benchmarks.decode_attention). False: the per-row copies.
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    banned_token_ids: tuple[int, ...] = ()
    logprobs: bool = True
    vocab_major: bool | None = None
    shared_prefix: bool = True

    def __post_init__(self):
        ids = self.stop_token_ids
        ids = (ids,) if isinstance(ids, (int, np.integer)) else tuple(ids if ids is not None else ())
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in ids))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "pad_token_id", int(self.pad_token_id))
        object.__setattr__(self, "banned_token_ids", tuple(int(i) for i in (self.banned_token_ids or ())))
        object.__setattr__(self, "logprobs", bool(self.logprobs))
        object.__setattr__(self, "shared_prefix", bool(self.shared_prefix))
        if self.vocab_major is not None:
            object.__setattr__(self, "vocab_major", bool(self.vocab_major))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


class GenerationOutput(NamedTuple):
    """tokens [B, N] int32: generated tokens, pad_token_id after a row's stop token.
    logprobs [B, N] float32: log-prob of each sampled token under the sampling distribution
      (after temperature / top-k / top-p; greedy: under the unmodified model, see
      :func:`sample_token`); 0 on padding.
    lengths [B] int32: generated tokens up to and including the stop token (N if none).
    done [B] bool: the row emitted a stop token.
    steps [] int32: decode steps run (the loop exits early once every row is done).
    """
    tokens: Array
    logprobs: Array
    lengths: Array
    done: Array
    steps: Array


# ----------------------------------------------------------------------------- one token
def ban_tokens(logits: Array, banned_token_ids: tuple[int, ...], axis: int = -1) -> Array:
    """``logits`` with the (static) ``banned_token_ids`` set to -inf on the vocabulary ``axis``."""
    if not banned_token_ids:
        return logits
    at = (slice(None),) * (axis % logits.ndim) + (jnp.asarray(banned_token_ids, jnp.int32),)
    return logits.at[at].set(-jnp.inf)


def sampling_logits(logits: Array, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0):
    """The sampling distribution's logits, in "sorted space" when filtering is on.

    Returns (scores [..., K], index [..., K] or None): ``log_softmax(scores)`` is the
    sampling distribution over the token ids ``index`` (``index`` None: over the whole
    vocabulary, ``scores`` aligned with it). Filtered-out tokens have score -inf.
    ``temperature`` must be > 0 here; the options are static Python numbers.
    """
    x = logits.astype(jnp.float32) / jnp.float32(temperature)
    v = x.shape[-1]
    if 0 < top_k < v:
        scores, index = jax.lax.top_k(x, top_k)  # descending; ties: lower index first
    elif top_p < 1.0:
        index = jnp.argsort(-x, axis=-1, stable=True).astype(jnp.int32)
        scores = jnp.take_along_axis(x, index, axis=-1)
    else:
        return x, None
    if top_p < 1.0:
        probs = jax.nn.softmax(scores, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive: the first token is always kept
        scores = jnp.where(mass_before < top_p, scores, -jnp.inf)
    return scores, index.astype(jnp.int32)


def sample_token(logits: Array, rng: Array, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, logprob: bool = True, axis: int = -1) -> tuple[Array, Array]:
    """Draw one token per row from ``logits`` whose vocabulary is on ``axis`` ([..., V] by
    default; the sampler's vocabulary-major [V, B] with ``axis=0``).

    Order of operations (as transformers and vLLM): temperature, then top-k, then top-p
    (nucleus: keep the most likely tokens until their mass reaches top_p; the token that
    crosses top_p is kept). ``temperature == 0`` is greedy (argmax, lowest id on ties; rng
    unused) and its log-prob is under the *unmodified* model distribution
    (``log_softmax(logits)``), which is what evaluation needs; top-k / top-p do not
    change a greedy token. The options are static Python numbers. The draw does not depend
    on the layout: the same key gives the same token (up to float rounding of the sums).

    Returns (token, logprob), each of ``logits``' shape without ``axis`` (int32, float32):
    the log-prob of the token under the renormalised sampling distribution (greedy with
    ``logprob=False``: 0, not computed).
    """
    logits = logits.astype(jnp.float32)
    axis = axis % logits.ndim
    if temperature == 0:
        token = blocked_argmax(logits, axis=axis)
        if not logprob:
            return token, jnp.zeros(token.shape, jnp.float32)
        return token, _take(logits, token, axis) - jax.nn.logsumexp(logits, axis=axis)
    if (0 < top_k < logits.shape[axis]) or top_p < 1.0:   # filtering sorts along the last axis
        logits, axis = jnp.moveaxis(logits, axis, -1), logits.ndim - 1
    scores, index = sampling_logits(logits, temperature, top_p, top_k)
    choice, lp = inverse_cdf_sample(rng, scores, axis=axis)
    token = choice if index is None else _take(index, choice, axis)
    return token, lp


SAMPLE_BLOCK = 128   # entries per block of blocked_argmax / inverse_cdf_sample (Qwen's vocabularies are multiples)


def _take(x: Array, i: Array, axis: int) -> Array:
    """``x``'s entries at ``i`` on ``axis`` (``i``: x's shape without that axis)."""
    return jnp.take_along_axis(x, jnp.expand_dims(i, axis), axis=axis).squeeze(axis)


def _blocks(x: Array, block: int, fill: float, axis: int) -> Array:
    """``axis`` (K entries) split into [ceil(K / block), block] in place, the last block padded
    with ``fill``."""
    k = x.shape[axis]
    nb = -(-k // block)
    if nb * block != k:   # (a copy: XLA's CPU reductions over blocks are fast only without it)
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, nb * block - k)
        x = jnp.pad(x, pad, constant_values=fill)
    return x.reshape(x.shape[:axis] + (nb, block) + x.shape[axis + 1:])


def _take_block(xb: Array, b: Array, axis: int) -> Array:
    """Block ``b`` (per row) of ``xb`` blocked on ``axis`` -> the block's entries on ``axis``."""
    return jnp.take_along_axis(xb, jnp.expand_dims(b, (axis, axis + 1)), axis=axis).squeeze(axis)


def blocked_argmax(x: Array, block: int = SAMPLE_BLOCK, axis: int = -1) -> Array:
    """``jnp.argmax(x, axis)`` (int32; ties: the lowest index) as the argmax of the block
    maxima, then the argmax inside that block: XLA's CPU backend vectorizes the max over
    blocks but not a flat argmax over a 152K vocabulary (an order of magnitude slower). A
    row holding NaN gets an index in range (which one depends on the backend's max)."""
    axis = axis % x.ndim
    xb = _blocks(x, block, -jnp.inf, axis)
    b = jnp.argmax(jnp.max(xb, axis=axis + 1), axis=axis).astype(jnp.int32)
    return b * block + jnp.argmax(_take_block(xb, b, axis), axis=axis).astype(jnp.int32)


def inverse_cdf_sample(rng: Array, scores: Array, block: int = SAMPLE_BLOCK, axis: int = -1) -> tuple[Array, Array]:
    """One draw per row from softmax(``scores``) over ``axis`` (K entries; -inf: never drawn)
    by inverting its CDF at one uniform per row: the first level finds the block of
    ``block`` entries whose cumulative mass crosses it, the second the entry inside that
    block. Returns (index int32, its log-prob), each of the rows' shape. The same draw as
    one flat inversion (the block size changes no token beyond float rounding), and exact
    up to float32 rounding.

    Why not ``jax.random.categorical``: Gumbel-max draws K random numbers per row; over a
    152K-entry vocabulary on CPU that costs several times the decode step's matmul, here
    one number per row and a pass of exp."""
    axis = axis % scores.ndim
    m = jnp.max(scores, axis=axis, keepdims=True)
    pb = _blocks(jnp.exp(scores - m), block, 0.0, axis)          # the axis as [nb, block]
    nb = pb.shape[axis]
    mass = pb.sum(axis + 1)                                      # [..., nb, ...]
    cum = jnp.cumsum(mass, axis=axis)
    total = jax.lax.index_in_dim(cum, nb - 1, axis, keepdims=False)
    u = jax.random.uniform(rng, total.shape, jnp.float32) * total
    first_last = lambda ids, live, n: (jnp.min(jnp.where(live, ids, n - 1), axis),  # noqa: E731
                                       jnp.max(jnp.where(live, ids, 0), axis))
    b = jnp.sum(cum <= jnp.expand_dims(u, axis), axis=axis).astype(jnp.int32)
    b = jnp.clip(b, *first_last(jax.lax.broadcasted_iota(jnp.int32, mass.shape, axis), mass > 0, nb))
    inner = _take_block(pb, b, axis)                             # the block's entries on axis
    r = u - (_take(cum, b, axis) - _take(mass, b, axis))
    j = jnp.sum(jnp.cumsum(inner, axis=axis) <= jnp.expand_dims(r, axis), axis=axis).astype(jnp.int32)
    j = jnp.clip(j, *first_last(jax.lax.broadcasted_iota(jnp.int32, inner.shape, axis), inner > 0, block))
    index = b * block + j
    return index, _take(scores, index, axis) - (jnp.squeeze(m, axis) + jnp.log(total))


# ----------------------------------------------------------------------------- generate
def decode_positions(prompt_mask: Array, rope_deltas: Array) -> Array:
    """[B] M-RoPE position (all three axes) of the first generated token of each row."""
    n_real = jnp.sum(prompt_mask != 0, axis=-1).astype(jnp.int32)
    return n_real + rope_deltas.astype(jnp.int32)


# Row axis of each KV-cache entry (models/text.py ``init_cache``); "index" is a scalar. A cache
# whose rows share prompts (share_prefix) adds the prompts' entries, indexed by prompt.
CACHE_ROW_AXIS = {"k": 1, "v": 1, "segment_ids": 0, "decode_segment": 0}
PREFIX_ROW_AXIS = {"prefix_k": 1, "prefix_v": 1, "prefix_mask": 0}


def share_rows(logits: Array, cache: dict, first_pos: Array, copies: int, row_sharding=None, logits_row_axis=0):
    """The prefill of B / ``copies`` prompts made the start of B rows: row ``p * copies + j``
    is copy j of prompt p (``jnp.repeat``, the order of ``rollout.expand_groups``) in the
    last logits ([B, V], or [V, B] with ``logits_row_axis=1``), every row-indexed cache entry
    and the first decode positions [B].

    ``row_sharding`` (None, or (mesh, axes) of the prompt rows) keeps the repeated cache's
    rows sharded over those mesh axes, as the prompts' (the cache is the big one: the
    logits and positions follow it)."""
    rep = lambda x, axis: jnp.repeat(x, copies, axis=axis)  # noqa: E731
    logits, first_pos = rep(logits, logits_row_axis), rep(first_pos, 0)
    cache = {key: rep(x, CACHE_ROW_AXIS[key]) if key in CACHE_ROW_AXIS else x for key, x in cache.items()}
    return logits, _keep_rows(cache, CACHE_ROW_AXIS, row_sharding), first_pos


def _keep_rows(cache: dict, row_axis: dict, row_sharding) -> dict:
    """The cache entries named in ``row_axis`` with that axis sharded as the prompts' rows
    (``row_sharding``: (mesh, axes) or None: unchanged); XLA chooses the other axes (kv heads
    over tensor)."""
    if row_sharding is None:
        return cache
    mesh, axes = row_sharding

    def keep(x, axis):
        spec = [PartitionSpec.UNCONSTRAINED] * x.ndim
        spec[axis] = axes
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    return {key: keep(x, row_axis[key]) if key in row_axis else x for key, x in cache.items()}


def share_prefix(logits: Array, cache: dict, first_pos: Array, copies: int, new_slots: int, row_sharding=None,
                 logits_row_axis=0):
    """As :func:`share_rows`, but the prefill's cache (of the B / ``copies`` prompts, sized to
    them) becomes the prompts' shared part, held once (prefix_k, prefix_v and prefix_mask: the
    slots of the prompt's own segment), and the B rows get an own cache of ``new_slots`` empty
    slots (k, v, segment_ids; index 0) for their generated tokens: decode attention then runs
    ``attention.cascade_attention`` (models/text.py's cache layout)."""
    rep = lambda x, axis: jnp.repeat(x, copies, axis=axis)  # noqa: E731
    logits, first_pos = rep(logits, logits_row_axis), rep(first_pos, 0)
    ck, cv = cache["k"], cache["v"]
    layers, p, kh, hd, _ = ck.shape
    b = p * copies
    own = {"k": jnp.zeros((layers, b, kh, hd, new_slots), ck.dtype),
           "v": jnp.zeros((layers, b, kh, new_slots, hd), cv.dtype),
           "segment_ids": jnp.zeros((b, new_slots), jnp.int32), "index": jnp.zeros((), jnp.int32),
           "decode_segment": rep(cache["decode_segment"], 0)}
    shared = {"prefix_k": ck, "prefix_v": cv,
              "prefix_mask": cache["segment_ids"] == cache["decode_segment"][:, None]}
    return logits, _keep_rows({**own, **shared}, {**CACHE_ROW_AXIS, **PREFIX_ROW_AXIS}, row_sharding), first_pos


def prompts_held_once(config: SamplingConfig, copies: int) -> bool:
    """Whether ``generate(copies=copies)`` holds each prompt's KV cache once for its rows
    (:func:`share_prefix`) rather than a copy per row (what memory plans size the cache by)."""
    return copies > 1 and config.shared_prefix


VOCAB_MAJOR_MAX_ROWS = 128   # the decode head vocabulary-major on CPU up to this many rows (SamplingConfig)


def vocab_major_logits(config: SamplingConfig, rows: int) -> bool:
    """Whether a sampler of ``rows`` rows forms its logits as [V, B] (``config.vocab_major``)."""
    if config.vocab_major is not None:
        return config.vocab_major
    return jax.default_backend() == "cpu" and rows <= VOCAB_MAJOR_MAX_ROWS


def _generate(graphdef, params, prompt_ids, prompt_mask, positions, rope_deltas, pixel_values, vision, rng,
              config: SamplingConfig, copies: int = 1, row_sharding=None) -> GenerationOutput:
    model = nnx.merge(graphdef, params)
    _, t = prompt_ids.shape
    b = prompt_ids.shape[0] * copies
    n = config.max_new_tokens
    pad = jnp.int32(config.pad_token_id)
    seg = (prompt_mask != 0).astype(jnp.int32)
    vocab_major = vocab_major_logits(config, b)
    vocab_axis = 0 if vocab_major else 1
    prefix = prompts_held_once(config, copies)
    logits, cache = model.prefill(prompt_ids.astype(jnp.int32), positions.astype(jnp.int32), seg, pixel_values,
                                  vision, cache_size=t if prefix else t + n - 1, vocab_major=vocab_major)
    first_pos = decode_positions(seg, rope_deltas)
    if prefix:
        logits, cache, first_pos = share_prefix(logits, cache, first_pos, copies, max(n - 1, 1), row_sharding,
                                                logits_row_axis=1 if vocab_major else 0)
    elif copies > 1:
        logits, cache, first_pos = share_rows(logits, cache, first_pos, copies, row_sharding,
                                              logits_row_axis=1 if vocab_major else 0)
    stop = jnp.asarray(config.stop_token_ids or (-1,), jnp.int32)

    def emit(i, logits, tokens, logprobs, lengths, done):
        logits = ban_tokens(logits.astype(jnp.float32), config.banned_token_ids, vocab_axis)
        tok, lp = sample_token(logits, jax.random.fold_in(rng, i), config.temperature, config.top_p, config.top_k,
                               config.logprobs, vocab_axis)
        tok = jnp.where(done, pad, tok)
        lp = jnp.where(done, 0.0, lp)
        tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, i))
        logprobs = jax.lax.dynamic_update_slice(logprobs, lp[:, None], (0, i))
        lengths = lengths + (~done).astype(jnp.int32)
        if config.stop_token_ids:
            done = done | jnp.isin(tok, stop)
        return tok, tokens, logprobs, lengths, done

    tokens = jnp.full((b, n), pad, jnp.int32)
    logprobs = jnp.zeros((b, n), jnp.float32)
    lengths = jnp.zeros((b,), jnp.int32)
    done = jnp.zeros((b,), bool)
    last, tokens, logprobs, lengths, done = emit(0, logits, tokens, logprobs, lengths, done)

    def cond(carry):
        i, _, _, _, _, _, done = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, last, cache, tokens, logprobs, lengths, done = carry
        pos = jnp.broadcast_to(first_pos + i - 1, (3, b))  # position of `last`, token i - 1
        logits, cache = model.decode_step(last, pos, cache, vocab_major=vocab_major)
        last, tokens, logprobs, lengths, done = emit(i, logits, tokens, logprobs, lengths, done)
        return i + 1, last, cache, tokens, logprobs, lengths, done

    steps = jnp.zeros((), jnp.int32)
    if n > 1:
        carry = (jnp.ones((), jnp.int32), last, cache, tokens, logprobs, lengths, done)
        i, _, _, tokens, logprobs, lengths, done = jax.lax.while_loop(cond, body, carry)
        steps = i - 1
    return GenerationOutput(tokens, logprobs, lengths, done, steps)


_generate_jit = jax.jit(_generate, static_argnames=("graphdef", "config", "copies", "row_sharding"))


def _row_sharding(prompt_ids):
    """(mesh, mesh axes of the row dimension) of prompts placed with a NamedSharding, else None."""
    sh = getattr(prompt_ids, "sharding", None)
    if not isinstance(sh, NamedSharding):
        return None
    return sh.mesh, (sh.spec[0] if len(sh.spec) else None)


def generate(graphdef: nnx.GraphDef, params: Any, prompt_ids, prompt_mask, positions, rope_deltas, pixel_values,
             vision, rng, config: SamplingConfig, copies: int = 1) -> GenerationOutput:
    """Sample up to ``config.max_new_tokens`` tokens after each left-padded prompt.

    Args:
      graphdef: the model's graphdef (static), e.g. from ``nnx.split(model, nnx.Param, ...)``.
      params: the model's pure parameter dict (``nnx.to_pure_dict(nnx.state(model, nnx.Param))``),
        possibly sharded on a mesh.
      prompt_ids [B', T] int: LEFT-padded prompts (every row's last slot is a real token);
        B' = B / copies.
      prompt_mask [B', T]: 1 = real token, 0 = padding.
      positions [3, B', T], rope_deltas [B']: from guilibra's ``get_rope_index`` (see
        :func:`prepare_prompts`), whose deltas count real tokens only. transformers' own
        ``rope_deltas`` are relative to the padded length T instead; do not mix them.
      pixel_values [P, C*t*p*p] or None, vision: the device dict of the prompts' images (or None).
      rng: a PRNG key (unused when greedy).
      config: :class:`SamplingConfig` (static).
      copies: (static) rows sampled per prompt. The prompt arrays hold B' = B / copies
        distinct prompts (their images only); the vision tower and the prefill run on those, and
        their KV cache serves the B = rows x copies sampled rows (held once per prompt,
        :func:`share_prefix`, or with ``config.shared_prefix=False`` repeated, :func:`share_rows`):
        output row ``p * copies + j`` is sample j of prompt p, exactly what ``copies = 1`` on
        the prompts repeated that way gives (same key, same tokens; log-probs up to float
        rounding of the smaller prefill). 1: every row is its own prompt.

    Returns a :class:`GenerationOutput` of B rows. Compiled once per (shapes, graphdef,
    config, copies).
    """
    if not isinstance(config, SamplingConfig):
        raise TypeError(f"config must be a SamplingConfig, got {type(config).__name__}")
    if not isinstance(copies, (int, np.integer)) or copies < 1:
        raise ValueError(f"copies must be a positive integer, got {copies!r}")
    copies = int(copies)
    return _generate_jit(graphdef, params, prompt_ids, prompt_mask, positions, rope_deltas, pixel_values, vision,
                         rng, config, copies, _row_sharding(prompt_ids) if copies > 1 else None)


def lower_generate(graphdef: nnx.GraphDef, params: Any, prompt_ids, prompt_mask, positions, rope_deltas,
                   pixel_values, vision, rng, config: SamplingConfig, copies: int = 1):
    """:func:`generate`'s program lowered for these (possibly abstract) inputs, e.g. to
    compile a memory plan without running it."""
    return _generate_jit.lower(graphdef, params, prompt_ids, prompt_mask, positions, rope_deltas, pixel_values,
                               vision, rng, config, int(copies), _row_sharding(prompt_ids) if copies > 1 else None)


def decode_response(tokenizer: Any, ids, stop_token_ids: Sequence[int] = ()) -> str:
    """Text of one row's generated ids (``tokens[b, :lengths[b]]``) without its final stop
    token. Other special tokens stay: ``<think>`` and ``<tool_call>`` are special tokens in
    some tokenizers (the demo's), and skipping them would erase the response format."""
    ids = [int(t) for t in ids]
    if ids and ids[-1] in set(stop_token_ids):
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


# ----------------------------------------------------------------------------- host prompts
def _bucket(length: int, bucket_len) -> int:
    if bucket_len is None:
        return length
    buckets = sorted([int(bucket_len)] if np.ndim(bucket_len) == 0 else [int(x) for x in bucket_len])
    for size in buckets:
        if size >= length:
            return size
    raise ValueError(f"prompt length {length} exceeds the largest bucket {buckets[-1]}")


def prepare_prompts(prompts: Sequence[tuple], model_config: ModelConfig, pad_id: int, bucket_len=None,
                    num_patches: int | None = None) -> dict:
    """Left-pad prompts and build everything :func:`generate` takes (numpy).

    Args:
      prompts: list of (input_ids list[int], image_grid_thw [n_i, 3] or None, pixel rows
        [sum of t*h*w, C*t*p*p] or None), each with its images' ``<|image_pad|>`` runs.
      model_config: the model's ModelConfig.
      pad_id: token id of the left padding (masked out; any valid id).
      bucket_len: None (pad to the longest prompt), an int, or a sequence of ints (pad to the
        smallest bucket that fits): fixed shapes mean one compilation.
      num_patches: pad the concatenated pixel rows to this many (a static patch bucket).

    Returns a dict: prompt_ids [B, T] int32, prompt_mask [B, T] int32, positions [3, B, T]
    int32, rope_deltas [B] int32, pixel_values [P, D] float32 or None, vision (dict of
    arrays) or None, image_grid_thw [n, 3] int64 or None, prompt_lens [B] int32.
    """
    if not prompts:
        raise ValueError("prepare_prompts: no prompts")
    seqs, grids, pixels = [], [], []
    for k, prompt in enumerate(prompts):
        ids, grid, pix = (tuple(prompt) + (None, None))[:3]
        ids = [int(x) for x in ids]
        if not ids:
            raise ValueError(f"prompt {k} is empty")
        seqs.append(ids)
        if grid is None:
            if pix is not None:
                raise ValueError(f"prompt {k} has pixel rows but no image_grid_thw")
            continue
        grid = np.asarray(grid, np.int64).reshape(-1, 3)
        if pix is None:
            raise ValueError(f"prompt {k} has image_grid_thw but no pixel rows")
        pix = np.asarray(pix)
        need = int(np.prod(grid, axis=1).sum())
        if pix.ndim != 2 or pix.shape[0] != need:
            raise ValueError(f"prompt {k}: image_grid_thw {grid.tolist()} needs {need} pixel rows, got {pix.shape}")
        grids.append(grid)
        pixels.append(pix)
    b = len(seqs)
    t = _bucket(max(len(s) for s in seqs), bucket_len)
    ids = np.full((b, t), int(pad_id), np.int64)
    mask = np.zeros((b, t), np.int32)
    for r, s in enumerate(seqs):
        ids[r, t - len(s):] = s
        mask[r, t - len(s):] = 1
    grid_arr = np.concatenate(grids) if grids else None
    positions, deltas = get_rope_index(ids, mask, grid_arr, model_config)
    out = {"prompt_ids": ids.astype(np.int32), "prompt_mask": mask, "positions": positions.astype(np.int32),
           "rope_deltas": deltas.astype(np.int32), "pixel_values": None, "vision": None,
           "image_grid_thw": grid_arr, "prompt_lens": np.asarray([len(s) for s in seqs], np.int32)}
    if grids:
        pix = np.concatenate(pixels).astype(np.float32)
        if num_patches is not None:
            if num_patches < pix.shape[0]:
                raise ValueError(f"num_patches={num_patches} is smaller than the real patch count {pix.shape[0]}")
            pix = np.pad(pix, ((0, num_patches - pix.shape[0]), (0, 0)))
        out["pixel_values"] = pix
        out["vision"] = device_vision_inputs(prepare_vision_inputs(grid_arr, model_config, num_patches))
    return out


# ----------------------------------------------------------------------------- scoring
def _token_logprobs(model, h, targets, temperature: float, chunk_size: int | None, with_entropy: bool = False,
                    banned_token_ids: tuple[int, ...] = ()):
    """log_softmax(logits(h) / temperature)[targets] [B, T] float32 (and the entropy of
    that distribution [B, T] when asked), banned ids excluded, in T-chunks if asked."""

    def one(hc, tc):
        logits = ban_tokens(model.logits_from_hidden(hc).astype(jnp.float32), banned_token_ids)
        if temperature != 1.0:
            logits = logits / jnp.float32(temperature)
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0] - logz
        if not with_entropy:
            return picked, jnp.zeros_like(picked)
        p = jnp.exp(logits - logz[..., None])
        return picked, logz - jnp.sum(jnp.where(p > 0, p * logits, 0.0), axis=-1)

    b, t = targets.shape
    if not chunk_size or chunk_size >= t:
        return one(h, targets)
    n = -(-t // chunk_size)
    padded = n * chunk_size
    hp = jnp.pad(h, ((0, 0), (0, padded - t), (0, 0))).reshape(b, n, chunk_size, -1).swapaxes(0, 1)
    tp = jnp.pad(targets, ((0, 0), (0, padded - t))).reshape(b, n, chunk_size).swapaxes(0, 1)
    lp, ent = jax.lax.map(lambda xs: one(*xs), (hp, tp))  # [n, B, c] each
    unchunk = lambda x: x.swapaxes(0, 1).reshape(b, padded)[:, :t]
    return unchunk(lp), unchunk(ent)


def sequence_hidden(model, input_ids, positions, segment_ids, pixel_values=None, vision=None, response_mask=None
                    ) -> tuple[Array, Array, Array]:
    """(h [B, T, D], targets [B, T], valid [B, T]) of whole sequences, aligned as in
    :func:`token_logprobs`: ``h[:, t]`` (final-normed hidden state) predicts
    ``targets[:, t] = input_ids[:, t + 1]``, scored where ``valid``."""
    seg = segment_ids.astype(jnp.int32)
    ids = input_ids.astype(jnp.int32)
    h = model.hidden_states(ids, positions.astype(jnp.int32), seg, pixel_values, vision)
    targets = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
    next_seg = jnp.concatenate([seg[:, 1:], jnp.zeros_like(seg[:, :1])], axis=1)
    valid = (seg > 0) & (next_seg == seg)
    if response_mask is not None:
        valid = valid & (response_mask != 0)
    return h, targets, valid


def token_logprobs(model, input_ids, positions, segment_ids, pixel_values=None, vision=None, response_mask=None,
                   *, temperature: float = 1.0, chunk_size: int | None = None, with_entropy: bool = False,
                   banned_token_ids: tuple[int, ...] = ()) -> tuple[Array, Array, Array]:
    """(logp, valid, entropy), each [B, T], of a merged ``model`` on given sequences
    (differentiable; :func:`score` is its jitted, parameter-dict form).

    Aligned like the SFT targets: ``logp[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``
    (logits at t predict the next token), so ``response_mask[:, t]`` (same alignment)
    marks the positions whose *next* token is a response token. ``valid`` is False (and
    logp, entropy 0) where the next token is padding or belongs to another packed
    segment, at the last position, and where ``response_mask`` is 0. ``entropy`` (only
    with ``with_entropy``, else zeros) is that of the whole next-token distribution.
    ``banned_token_ids``: excluded from the distribution, as the sampler's.
    """
    h, targets, valid = sequence_hidden(model, input_ids, positions, segment_ids, pixel_values, vision,
                                        response_mask)
    lp, ent = _token_logprobs(model, h, jnp.where(valid, targets, 0), float(temperature), chunk_size, with_entropy,
                              tuple(banned_token_ids))
    return jnp.where(valid, lp, 0.0), valid, jnp.where(valid, ent, 0.0)


SHARED_INPUTS = ("prompt_ids", "prompt_positions", "prompt_segment_ids", "response_ids", "response_positions",
                 "response_mask")


def shared_hidden(model, batch: dict) -> tuple[Array, Array, Array]:
    """(h [R, N', D], targets [R, N'], valid [R, N']) of a shared-prompt batch, aligned as in
    :func:`shared_token_logprobs`: ``h[r, j]`` predicts response token j of row r."""
    ids = batch["response_ids"].astype(jnp.int32)
    mask = batch["response_mask"].astype(jnp.int32)
    hp, hr = model.shared_prompt_hidden(batch["prompt_ids"].astype(jnp.int32),
                                        batch["prompt_positions"].astype(jnp.int32), batch["prompt_segment_ids"],
                                        ids, batch["response_positions"].astype(jnp.int32), mask,
                                        batch.get("pixel_values"), batch.get("vision"))
    copies = ids.shape[0] // hp.shape[0]
    last = jnp.repeat(hp[:, -1:], copies, axis=0)                 # predicts response token 0
    h = jnp.concatenate([last, hr[:, :-1]], axis=1)               # position j predicts token j
    return h, ids, mask > 0


def shared_token_logprobs(model, batch: dict, *, temperature: float = 1.0, chunk_size: int | None = None,
                          with_entropy: bool = False, banned_token_ids: tuple[int, ...] = ()
                          ) -> tuple[Array, Array, Array]:
    """(logp, valid, entropy), each [R, N'], of the response tokens of a shared-prompt batch
    (``rollout.shared_batch``: P prompts, R = P x c rows, each prompt computed once for its
    c rows by ``QwenVL.shared_prompt_hidden``): ``logp[r, j]`` = log p(response token j |
    prompt, tokens < j), scored from the prompt's last position for j = 0. ``valid`` =
    ``response_mask``. The vocabulary projection runs on the R x N' response positions only.
    Equal to :func:`token_logprobs` on the whole rows at their response columns."""
    h, ids, valid = shared_hidden(model, batch)
    lp, ent = _token_logprobs(model, h, jnp.where(valid, ids, 0), float(temperature), chunk_size, with_entropy,
                              tuple(banned_token_ids))
    return jnp.where(valid, lp, 0.0), valid, jnp.where(valid, ent, 0.0)


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "chunk_size", "banned_token_ids"))
def score_shared(graphdef: nnx.GraphDef, params: Any, batch: dict, *, temperature: float = 1.0,
                 chunk_size: int | None = None, banned_token_ids: tuple[int, ...] = ()) -> Array:
    """Log-probs [R, N'] float32 of a shared-prompt batch's response tokens
    (:func:`shared_token_logprobs`; 0 where not valid)."""
    batch = {k: batch[k] for k in SHARED_INPUTS + ("pixel_values", "vision") if k in batch}
    lp, _, _ = shared_token_logprobs(nnx.merge(graphdef, params), batch, temperature=temperature,
                                     chunk_size=chunk_size, banned_token_ids=banned_token_ids)
    return lp


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "chunk_size", "banned_token_ids"))
def score(graphdef: nnx.GraphDef, params: Any, input_ids, positions, segment_ids, pixel_values=None, vision=None,
          response_mask=None, *, temperature: float = 1.0, chunk_size: int | None = None,
          banned_token_ids: tuple[int, ...] = ()) -> Array:
    """Per-token log-probs [B, T] float32 of the given tokens under the model
    (:func:`token_logprobs`'s alignment: ``out[:, t]`` scores ``input_ids[:, t + 1]``;
    0 where not valid).

    ``temperature`` (static) divides the logits first, to score under the sampler's
    temperature; ``chunk_size`` (static) computes the vocabulary projection over T-chunks
    so the [B, T, V] logits are never materialised at once.
    """
    model = nnx.merge(graphdef, params)
    lp, _, _ = token_logprobs(model, input_ids, positions, segment_ids, pixel_values, vision, response_mask,
                              temperature=temperature, chunk_size=chunk_size, banned_token_ids=banned_token_ids)
    return lp
