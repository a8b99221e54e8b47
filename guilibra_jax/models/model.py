"""QwenVL: the full Qwen2.5-VL / Qwen3-VL model (vision tower + M-RoPE decoder + LM head)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from guilibra_jax.models.attention import BLOCK, SegmentMask
from guilibra_jax.models.config import ModelConfig
from guilibra_jax.models.layers import Linear
from guilibra_jax.models.text import TextModel, init_cache
from guilibra_jax import sharding as S
from guilibra_jax.choices import REMATS
from guilibra_jax.models.vision import VisionTower

REMAT_POLICIES = {
    "none": None,
    "full": "full",
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}
assert tuple(REMAT_POLICIES) == REMATS, "config key model.remat: guilibra_jax/choices.py and REMAT_POLICIES differ"


class QwenVL(nnx.Module):
  """Qwen2.5-VL / Qwen3-VL in Flax NNX.

  Inputs of every entry point:
    input_ids [B, T] int32, positions [3, B, T] int32 (from `get_rope_index`),
    segment_ids [B, T] int32 (0 = padding, k > 0 = packed sample k; causal within equal ids),
    pixel_values [P, C*t*p*p] (all images of the batch, optionally padded) or [S, L, C*t*p*p]
    (the same patches in the tower's slot layout, as the trainers place them) and `vision`,
    the dict from `prepare_vision_inputs` (arrays only are used).
  """

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, remat: str = "none",
               scan_layers: bool = False, attention_block: int = BLOCK, mlp_chunk: int = 0,
               rngs: nnx.Rngs | None = None):
    """attention_block: tile size of the blockwise (flash) attention that sequences longer
    than it use, in the decoder and the vision tower (shorter ones attend densely).
    mlp_chunk: positions per chunk of the MLPs of rows longer than it (layers.position_wise;
    0 = whole rows): bounds their [T, intermediate] buffers at long sequences."""
    if int(mlp_chunk) < 0:
      raise ValueError(f"mlp_chunk must be 0 (off) or a positive number of positions, got {mlp_chunk!r}")
    if remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got {remat!r}")
    if int(attention_block) < 1:
      raise ValueError(f"attention_block must be a positive number of tokens, got {attention_block!r}")
    self.attention_block = int(attention_block)
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.config = config
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.scan_layers = scan_layers
    policy = REMAT_POLICIES[remat]
    self.visual = VisionTower(config, dtype=dtype, param_dtype=param_dtype, remat=policy,
                               attention_block=self.attention_block, scan_blocks=scan_layers,
                               mlp_chunk=int(mlp_chunk), rngs=rngs)
    self.language_model = TextModel(config, dtype=dtype, param_dtype=param_dtype, remat_policy=policy,
                                    scan_layers=scan_layers, mlp_chunk=int(mlp_chunk), rngs=rngs)
    if not config.tie_word_embeddings:
      self.lm_head = Linear((config.text.hidden_size,), (config.text.vocab_size,), ("embed",), ("vocab",),
                            use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.lm_head = None

  # ------------------------------------------------------------------ pieces
  def image_features(self, pixel_values, vision: dict, image_order: bool = True):
    """-> (merged [P/m^2, D], deepstack list of [P/m^2, D]) in image order, padding rows last;
    with ``image_order=False`` per tower slot ([S, L/m^2, D] each)."""
    return self.visual(pixel_values.astype(self.dtype), vision, image_order=image_order)

  def _embed(self, input_ids, pixel_values, vision):
    h = self.language_model.embed_tokens(input_ids)
    if pixel_values is None:
      return h, None, 0
    is_image = input_ids == self.config.image_token_id  # [B, T]
    # k-th <|image_pad|> token of the batch (row-major) takes merged feature k.
    idx = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1
    if "row_slots" in vision:
      take, merged, deepstack = self._row_local_take(is_image, idx, pixel_values, vision, h.dtype)
    else:
      merged, deepstack = self.image_features(pixel_values, vision)
      idx = jnp.clip(idx, 0, merged.shape[0] - 1)
      # Each feature table (image order: global) is gathered into the rows' layout at once and the
      # result pinned to the rows' devices, so only [B, T, D] per device lives on; a [n, P/m^2, D]
      # deepstack table indexed inside the layer scan stayed whole on every device (measured: 30 GB
      # per device for 128 images of 8,192 tokens at Qwen3-VL-32B's width). The table itself is
      # still whole on every device, and so is its gradient (all-reduced): see _row_local_take.
      take = lambda table: S.constrain_batch(jnp.where(is_image[..., None], table[idx].astype(h.dtype), 0))
    h = jnp.where(is_image[..., None], take(merged), h)
    if not deepstack:
      return h, None, 0
    rows = S.constrain_batch(jnp.stack([take(d) for d in deepstack]), 1)  # [n, B, T, D]

    def add(i):
      return rows[i]

    return h, add, len(deepstack)

  def _row_local_take(self, is_image, idx, pixel_values, vision, dtype):
    """Image features gathered row by row from the rows' own slots, for a row-aligned layout
    (``vision["row_slots"]`` [B, k]: row b's images are in slots b*k .. b*k+k-1, S = B*k;
    ``train.batching.row_slots`` checks it on the host). Slots and rows are sharded alike over
    the batch devices, so each device gathers from the slots it holds: no [P/m^2, D] table
    in image order (and no gradient of it) on every device, whose size grows with the rows of
    the whole mesh (measured: a 32B step's temporaries per device grew from 107 to 163 GiB
    from 8 to 32 devices at one row per device)."""
    merged, deepstack = self.image_features(pixel_values, vision, image_order=False)   # [S, U, D]
    row_slots = jnp.asarray(vision["row_slots"])
    (b, k), (n_slots, units) = row_slots.shape, merged.shape[:2]
    if n_slots != b * k or is_image.shape[0] != b:
      raise ValueError(f"vision['row_slots'] {row_slots.shape} does not describe {n_slots} slots of "
                       f"{is_image.shape[0]} rows (a row-aligned layout has S = rows x slots per row)")
    n = vision["token_slot"].shape[0]
    j = jnp.clip(idx, 0, n - 1)
    slot, unit = jnp.asarray(vision["token_slot"])[j], jnp.asarray(vision["token_unit"])[j]   # [B, T]
    local = jnp.clip((slot - row_slots[:, :1]) * units + unit, 0, k * units - 1)
    local = S.constrain_batch(local)

    def take(table):   # [S, U, D] -> [B, T, D]
      rows = S.constrain_batch(table.reshape(b, k * units, table.shape[-1]))
      got = jnp.take_along_axis(rows, local[..., None], axis=1)
      return S.constrain_batch(jnp.where(is_image[..., None], got.astype(dtype), 0))

    return take, merged, deepstack

  def hidden_states(self, input_ids, positions, segment_ids, pixel_values=None, vision=None):
    """Final-normed decoder hidden states [B, T, D] (compute dtype)."""
    h, add, n_ds = self._embed(input_ids, pixel_values, vision)
    seg = segment_ids.astype(jnp.int32)
    h, _ = self.language_model(h, positions, self._mask(seg, seg, 0), add, n_ds)
    return h

  def shared_prompt_hidden(self, prompt_ids, prompt_positions, prompt_segment_ids, response_ids,
                           response_positions, response_segment_ids, pixel_values=None, vision=None):
    """Final-normed hidden states of B rows [prompt | response] whose B' = B / c prompts are
    each shared by c consecutive rows (row p * c + j: response j of prompt p): the vision
    tower and the prompt run once per prompt (``TextModel.shared_prompt``).

    prompt_ids / prompt_segment_ids [B', Tp], prompt_positions [3, B', Tp] (images: the
    prompts'), response_ids / response_segment_ids [B, Tr], response_positions [3, B, Tr].
    Returns (prompt hidden [B', Tp, D], response hidden [B, Tr, D]): what
    :meth:`hidden_states` gives the whole rows, split there."""
    hp, add, n_ds = self._embed(prompt_ids, pixel_values, vision)
    hr = self.language_model.embed_tokens(response_ids)
    seg_p, seg_r = prompt_segment_ids.astype(jnp.int32), response_segment_ids.astype(jnp.int32)
    copies = seg_r.shape[0] // seg_p.shape[0]
    kv_seg = jnp.concatenate([jnp.repeat(seg_p, copies, axis=0), seg_r], axis=1)
    return self.language_model.shared_prompt(hp, prompt_positions, self._mask(seg_p, seg_p, 0), add, n_ds, hr,
                                             response_positions, self._mask(seg_r, kv_seg, seg_p.shape[1]))

  def _mask(self, q_segment_ids, kv_segment_ids, q_offset) -> SegmentMask:
    """Causal within equal segment ids; the queries sit at key positions q_offset.."""
    return SegmentMask(q_segment_ids, kv_segment_ids, jnp.asarray(q_offset, jnp.int32), True, self.attention_block)

  def lm_head_weight(self):
    """The LM head as [V, D] in the compute dtype (tied: the token embedding)."""
    if self.lm_head is None:
      return self.language_model.embed_tokens.embedding[...].astype(self.dtype)
    return self.lm_head.kernel[...].astype(self.dtype).T

  def logits_from_hidden(self, h, vocab_major: bool = False):
    """[..., D] -> float32 logits [..., V] (the leading dims as one row dim, as layers.Linear: the
    head's weight gradient then contracts one dim, with no transposed copy of the logits' gradient).
    ``vocab_major`` (h [B, D] only): the logits as [V, B], the sampler's layout on CPU
    (``generate.SamplingConfig.vocab_major``)."""
    if vocab_major:
      if h.ndim != 2:
        raise ValueError(f"vocab_major logits take hidden states [B, D], got {h.shape}")
      return jnp.einsum("vd,nd->vn", self.lm_head_weight(), h.astype(self.dtype), preferred_element_type=jnp.float32)
    rows = h.reshape(-1, h.shape[-1]).astype(self.dtype)
    logits = jnp.einsum("nd,vd->nv", rows, self.lm_head_weight(), preferred_element_type=jnp.float32)
    return logits.reshape(h.shape[:-1] + logits.shape[-1:])

  def __call__(self, input_ids, positions, segment_ids, pixel_values=None, vision=None):
    """float32 logits [B, T, V]."""
    return self.logits_from_hidden(self.hidden_states(input_ids, positions, segment_ids, pixel_values, vision))

  # ------------------------------------------------------------------ generation
  def prefill(self, input_ids, positions, segment_ids, pixel_values=None, vision=None, cache_size: int = 0,
              cache_dtype=None, vocab_major: bool = False):
    """Run a left-padded prompt [B, T] into a fresh KV cache of `cache_size` >= T slots.

    Returns (logits [B, V] float32 at the last prompt position ([V, B] with vocab_major), cache).
    """
    b, t = input_ids.shape
    cache_size = cache_size or t
    if cache_size < t:
      raise ValueError(f"cache_size={cache_size} is smaller than the prompt length {t}")
    cache = init_cache(self.config, b, cache_size, cache_dtype or self.dtype)
    seg = segment_ids.astype(jnp.int32)
    cache["segment_ids"] = cache["segment_ids"].at[:, :t].set(seg)
    cache["decode_segment"] = jnp.maximum(seg.max(axis=1), 1)
    h, add, n_ds = self._embed(input_ids, pixel_values, vision)
    mask = self._mask(seg, cache["segment_ids"], 0)
    h, (k, v) = self.language_model(h, positions, mask, add, n_ds, cache=(cache["k"], cache["v"]),
                                    index=jnp.zeros((), jnp.int32))
    cache.update(k=k, v=v, index=jnp.asarray(t, jnp.int32))
    return self.logits_from_hidden(h[:, -1], vocab_major), cache

  def decode_step(self, tokens, positions, cache, vocab_major: bool = False):
    """One token per row: tokens [B], positions [3, B] -> (logits [B, V] float32 ([V, B] with
    vocab_major), cache). A cache with prefix_k (rows sharing prompts, ``generate.share_prefix``)
    attends to each row's prompt held once, then to the row's own slots."""
    index = cache["index"]
    seg = cache["decode_segment"][:, None]
    cache = dict(cache)
    cache["segment_ids"] = jax.lax.dynamic_update_slice(cache["segment_ids"], seg, (0, index))
    h = self.language_model.embed_tokens(tokens[:, None])
    mask = self._mask(seg, cache["segment_ids"], index)
    shared = (cache["prefix_k"], cache["prefix_v"], cache["prefix_mask"]) if "prefix_k" in cache else None
    h, (k, v) = self.language_model(h, positions[:, :, None], mask, cache=(cache["k"], cache["v"]), index=index,
                                    shared=shared)
    cache.update(k=k, v=v, index=index + 1)
    return self.logits_from_hidden(h[:, 0], vocab_major), cache


def param_count(config: ModelConfig) -> int:
  """Number of parameters, by shape evaluation only (no weights are allocated)."""
  state = nnx.eval_shape(lambda: nnx.state(QwenVL(config, rngs=nnx.Rngs(0)), nnx.Param))
  return int(sum(x.size for x in jax.tree.leaves(state)))
