"""Qwen2/2.5 and Qwen3 text decoder (GQA, SwiGLU, RMSNorm, M-RoPE) with a KV cache.

The KV cache is a dict pytree:
  k             [L, B, K, H, S]  keys per layer (K kv heads, S = cache_size slots)
  v             [L, B, K, S, H]  values per layer (the layouts attention.cached_attention reads)
  segment_ids   [B, S] int32     0 = empty slot or padding; attention needs equal ids
  index         [] int32         next slot to write (the same for every row: left padding)
  decode_segment [B] int32       segment id given to generated tokens
and, where rows share a prompt (``generate.share_prefix``: row p * c + j continues prompt p; k, v
and segment_ids then hold the rows' own slots only):
  prefix_k      [L, P, K, H, Sp] the P prompts' keys, held once for their c rows
  prefix_v      [L, P, K, Sp, H] their values
  prefix_mask   [P, Sp] bool     the prompt slots the rows' queries see
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.models.attention import cached_attention, cascade_attention, dot_product_attention
from guilibra_jax.models.config import ModelConfig, TextConfig
from guilibra_jax.models.layers import Embed, Linear, RMSNorm, apply_rope, position_wise, text_rope
from guilibra_jax.models.vision import GatedMLP


K_LAYOUT = (0, 2, 3, 1)   # [B, T, K, H] -> the key cache's [B, K, H, T]
V_LAYOUT = (0, 2, 1, 3)   # [B, T, K, H] -> the value cache's [B, K, T, H] (its own inverse)


class Attention(nnx.Module):

  def __init__(self, tc: TextConfig, *, dtype, param_dtype, rngs):
    d, n, k, h = tc.hidden_size, tc.num_heads, tc.num_kv_heads, tc.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = Linear((d,), (n, h), ("embed",), ("heads", "head_dim"), use_bias=tc.qkv_bias, **kw)
    self.k_proj = Linear((d,), (k, h), ("embed",), ("kv_heads", "head_dim"), use_bias=tc.qkv_bias, **kw)
    self.v_proj = Linear((d,), (k, h), ("embed",), ("kv_heads", "head_dim"), use_bias=tc.qkv_bias, **kw)
    # Qwen2.5: o_proj has no bias; Qwen3: bias iff attention_bias.
    o_bias = tc.qkv_bias and tc.qk_norm
    self.o_proj = Linear((n, h), (d,), ("heads", "head_dim"), ("embed",), use_bias=o_bias, **kw)
    if tc.qk_norm:
      self.q_norm = RMSNorm(h, ("head_dim",), eps=tc.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
      self.k_norm = RMSNorm(h, ("head_dim",), eps=tc.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
    self.qk_norm = tc.qk_norm
    self.scale = h**-0.5

  def __call__(self, x, cos, sin, mask, kv_cache=None, index=None, prefix=None, layer=None, shared=None):
    """x [B, T, D]; cos/sin [B, T, H]; mask: SegmentMask of T queries and S keys (or a bool
    [B, 1, T, S]); kv_cache: every layer's (k, v) stacked (init_cache's layouts) or None, updated in
    place at ``layer`` (an int or a traced index), slots index.., and returned whole (a decode
    step writes its slot instead of copying the cache); without a cache returns this call's
    (k, v). prefix (k, v) [B, Sp, K, H] or None: keys / values (rotated) of a shared prompt put
    before this call's own (S = Sp + T). shared (with kv_cache): every layer's prompt keys and
    values held once per prompt and their mask (the cache's prefix_k, prefix_v, prefix_mask), attended
    before the rows' own cache (attention.cascade_attention)."""
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = cos.astype(q.dtype), sin.astype(q.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if prefix is not None:
      k = jnp.concatenate([prefix[0].astype(k.dtype), k], axis=1)
      v = jnp.concatenate([prefix[1].astype(v.dtype), v], axis=1)
    if kv_cache is None:
      return self.o_proj(dot_product_attention(q, k, v, mask, scale=self.scale)), (k, v)
    ck, cv = kv_cache
    ck = jax.lax.dynamic_update_slice(ck, jnp.transpose(k, K_LAYOUT).astype(ck.dtype)[None], (layer, 0, 0, 0, index))
    cv = jax.lax.dynamic_update_slice(cv, jnp.transpose(v, V_LAYOUT).astype(cv.dtype)[None], (layer, 0, 0, index, 0))
    if shared is not None:   # rows continuing prompts held once: [prompt | own cache]
      pk, pv, pmask = shared
      out = cascade_attention(q, ck[layer], cv[layer], mask, pk[layer], pv[layer], pmask, scale=self.scale)
    elif q.shape[1] <= getattr(mask, "block", q.shape[1]):   # decode (and short prefills): the cache as stored
      out = cached_attention(q, ck[layer], cv[layer], mask, scale=self.scale)
    else:   # a long prefill: blockwise attention over [B, S, K, H]
      out = dot_product_attention(q, jnp.transpose(ck[layer], (0, 3, 1, 2)), jnp.transpose(cv[layer], V_LAYOUT),
                                  mask, scale=self.scale)
    return self.o_proj(out), (ck, cv)


class DecoderLayer(nnx.Module):

  def __init__(self, tc: TextConfig, *, dtype, param_dtype, rngs, mlp_chunk: int = 0):
    self.mlp_chunk = int(mlp_chunk)
    self.self_attn = Attention(tc, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.mlp = GatedMLP(tc.hidden_size, tc.intermediate_size, "silu", "embed", "mlp", use_bias=False, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)
    self.input_layernorm = RMSNorm(tc.hidden_size, ("embed",), eps=tc.rms_norm_eps, dtype=dtype,
                                   param_dtype=param_dtype)
    self.post_attention_layernorm = RMSNorm(tc.hidden_size, ("embed",), eps=tc.rms_norm_eps, dtype=dtype,
                                            param_dtype=param_dtype)

  def __call__(self, x, cos, sin, mask, kv_cache=None, index=None, prefix=None, layer=None, shared=None):
    a, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, index, prefix, layer, shared)
    x = x + a
    x = x + position_wise(self.mlp, self.post_attention_layernorm(x), self.mlp_chunk)
    return x, kv


class TextModel(nnx.Module):
  """embed_tokens, layers, norm. With scan_layers the layers are one module with stacked [L, ...] params."""

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, remat_policy=None, scan_layers=False, rngs,
               mlp_chunk: int = 0):
    tc = config.text
    self.tc = tc
    self.dtype = dtype
    self.remat_policy = remat_policy  # None = no remat, else a jax.checkpoint policy (or "full")
    self.scan_layers = scan_layers
    self.embed_tokens = Embed(tc.vocab_size, tc.hidden_size, ("vocab", "embed"), dtype=dtype,
                              param_dtype=param_dtype, rngs=rngs)
    if scan_layers:
      @nnx.split_rngs(splits=tc.num_layers)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
      def make(r):
        return DecoderLayer(tc, dtype=dtype, param_dtype=param_dtype, rngs=r, mlp_chunk=mlp_chunk)
      self.layers = make(rngs)
    else:
      self.layers = nnx.List([DecoderLayer(tc, dtype=dtype, param_dtype=param_dtype, rngs=rngs, mlp_chunk=mlp_chunk)
                              for _ in range(tc.num_layers)])
    self.norm = RMSNorm(tc.hidden_size, ("embed",), eps=tc.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)

  def _checkpointed(self, fn: Callable) -> Callable:
    if self.remat_policy is None:
      return fn
    policy = None if self.remat_policy == "full" else self.remat_policy
    return jax.checkpoint(fn, policy=policy, prevent_cse=not self.scan_layers)

  def __call__(self, h, positions, mask, deepstack_add: Callable | None = None, n_deepstack: int = 0,
               cache=None, index=None, shared=None):
    """h [B, T, D] input embeddings; positions [3, B, T]; mask: attention.SegmentMask.

    deepstack_add(i) -> [B, T, D] is added after layer i < n_deepstack (Qwen3-VL).
    cache: (k, v) stacked (init_cache's layouts) or None. shared: (prefix_k, prefix_v, prefix_mask)
    of a cache whose rows share prompts (with cache only). Returns (normed hidden, new (k, v) or None).
    """
    tc = self.tc
    cos, sin = text_rope(positions, tc.head_dim, tc.rope_theta, tc.mrope_section, tc.mrope_interleaved)
    h = S.constrain_batch(h)   # rows over (data, fsdp) in every layer: the FSDP layout
    if self.scan_layers:
      gdef, stacked = nnx.split(self.layers)

      # With a cache, every layer's (k, v) stays one stacked [L, ...] pair carried through the
      # layers and updated in place at layer i (as scan inputs / outputs it was copied whole on
      # every call: each decode step rewrote the cache). Without one nothing reads the layers'
      # k / v, and nothing is carried: stacked as the scan's outputs they stayed alive through
      # the backward pass ([L, B, T, K, H] x 2: 8 GiB per device for a 16,384-token row of
      # Qwen3-VL-32B on the CPU compiler).
      def one_layer(layer_state, x, kv, i):
        x, kv = nnx.merge(gdef, layer_state)(x, cos, sin, mask, kv, index, layer=i, shared=shared)
        if deepstack_add is not None and n_deepstack:
          x = jax.lax.cond(i < n_deepstack, lambda: x + deepstack_add(jnp.minimum(i, n_deepstack - 1)), lambda: x)
        return S.constrain_batch(x), (kv if cache is not None else None)

      step = self._checkpointed(one_layer)

      def body(carry, xs):
        x, kv = carry
        layer_state, i = xs
        return step(layer_state, x, kv, i), None

      (h, new_cache), _ = jax.lax.scan(body, (h, cache), (stacked, jnp.arange(tc.num_layers)))
      return self.norm(h), new_cache

    kv = cache
    for i in range(tc.num_layers):
      gdef, layer_state = nnx.split(self.layers[i])
      add = deepstack_add if (deepstack_add is not None and i < n_deepstack) else None

      def one_layer(st, x, kv, g=gdef, add=add, i=i):
        x, kv = nnx.merge(g, st)(x, cos, sin, mask, kv, index, layer=i, shared=shared)
        return S.constrain_batch(x if add is None else x + add(i)), (kv if cache is not None else None)

      h, kv = self._checkpointed(one_layer)(layer_state, h, kv)
    return self.norm(h), kv

  def shared_prompt(self, hp, positions_p, mask_p, deepstack_add, n_deepstack, hr, positions_r, mask_r):
    """Two streams through the layers: B' prompts hp [B', Tp, D] (positions [3, B', Tp],
    mask_p over them; deepstack added here) and c = B / B' continuations of each, hr [B, Tr, D]
    (row p * c + j continues prompt p), whose queries attend to their prompt's keys and
    values, repeated c times, then their own (mask_r: Tr queries at key positions Tp.. of
    Tp + Tr keys). Each prompt's layers run once for its c rows; equal to running the rows
    [prompt | continuation] whole. Returns (normed hp, normed hr)."""
    tc = self.tc
    copies = hr.shape[0] // hp.shape[0]
    if copies * hp.shape[0] != hr.shape[0]:
      raise ValueError(f"{hr.shape[0]} continuation rows are not a multiple of {hp.shape[0]} prompts")
    rope = lambda pos: text_rope(pos, tc.head_dim, tc.rope_theta, tc.mrope_section, tc.mrope_interleaved)
    (cos_p, sin_p), (cos_r, sin_r) = rope(positions_p), rope(positions_r)
    hp, hr = S.constrain_batch(hp), S.constrain_batch(hr)
    rep = lambda x: S.constrain_batch(jnp.repeat(x, copies, axis=0))

    def both(layer, xp, xr):
      xp, (kp, vp) = layer(xp, cos_p, sin_p, mask_p)
      xr, _ = layer(xr, cos_r, sin_r, mask_r, prefix=(rep(kp), rep(vp)))
      return xp, S.constrain_batch(xr)

    if self.scan_layers:
      gdef, stacked = nnx.split(self.layers)

      def one_layer(layer_state, xs, i):
        xp, xr = both(nnx.merge(gdef, layer_state), *xs)
        if deepstack_add is not None and n_deepstack:
          xp = jax.lax.cond(i < n_deepstack, lambda: xp + deepstack_add(jnp.minimum(i, n_deepstack - 1)),
                            lambda: xp)
        return S.constrain_batch(xp), xr

      step = self._checkpointed(one_layer)
      (hp, hr), _ = jax.lax.scan(lambda xs, ys: (step(ys[0], xs, ys[1]), None), (hp, hr),
                                 (stacked, jnp.arange(tc.num_layers)))
      return self.norm(hp), self.norm(hr)

    for i in range(tc.num_layers):
      gdef, layer_state = nnx.split(self.layers[i])
      add = deepstack_add if (deepstack_add is not None and i < n_deepstack) else None

      def one_layer(st, xs, g=gdef, add=add, i=i):
        xp, xr = both(nnx.merge(g, st), *xs)
        return S.constrain_batch(xp if add is None else xp + add(i)), xr

      hp, hr = self._checkpointed(one_layer)(layer_state, (hp, hr))
    return self.norm(hp), self.norm(hr)


def init_cache(config: ModelConfig, batch: int, cache_size: int, dtype=jnp.float32) -> dict:
  tc = config.text
  rows = (tc.num_layers, batch, tc.num_kv_heads)
  return {
      "k": jnp.zeros(rows + (tc.head_dim, cache_size), dtype),
      "v": jnp.zeros(rows + (cache_size, tc.head_dim), dtype),
      "segment_ids": jnp.zeros((batch, cache_size), jnp.int32),
      "index": jnp.zeros((), jnp.int32),
      "decode_segment": jnp.ones((batch,), jnp.int32),
  }

