"""The one attention function of the models: `jax.nn.dot_product_attention` with masks.

`implementation=None` lets JAX pick cuDNN on GPU where it supports the call, XLA elsewhere.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(q_segment_ids, kv_segment_ids, *, causal: bool, q_index=None, kv_index=None):
  """Boolean mask [B, 1, T, S]: same segment id, and (if causal) key index <= query index.

  Padding (segment 0) only sees padding, so no row is empty and nothing leaks into real
  tokens. `q_index` / `kv_index` ([B, T] / [B, S]) default to 0..T-1 / 0..S-1.
  """
  mask = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
  if causal:
    b, t = q_segment_ids.shape
    s = kv_segment_ids.shape[1]
    qi = jnp.broadcast_to(jnp.arange(t), (b, t)) if q_index is None else q_index
    ki = jnp.broadcast_to(jnp.arange(s), (b, s)) if kv_index is None else kv_index
    mask = mask & (qi[:, :, None] >= ki[:, None, :])
  return mask[:, None]


def dot_product_attention(q, k, v, mask, *, scale: float | None = None):
  """q [B, T, N, H], k/v [B, S, K, H] (N a multiple of K: GQA), mask [B, 1|N, T, S] bool.

  Returns [B, T, N, H] in q's dtype.
  """
  dtype = q.dtype
  k = k.astype(dtype)
  v = v.astype(dtype)
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation=None)
