"""The attention functions of the models, over `jax.nn.dot_product_attention`.

`dot_product_attention` takes a boolean mask (the text decoder: causal within packed
segments). `varlen_attention` takes independent sequences padded to one length and their
lengths (the vision tower: one image frame or window per sequence), a call cuDNN's flash
attention supports. In JAX 0.10 `jax.nn.dot_product_attention(implementation=None)` always
uses XLA, so `varlen_attention` asks for cuDNN itself on NVIDIA GPUs (bf16 / fp16) and uses
XLA elsewhere, over query chunks for long sequences so that the scores never exceed
[B, N, QUERY_CHUNK, T].
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


QUERY_CHUNK = 1024  # XLA path: queries per chunk of a long sequence


def varlen_attention(q, k, v, lengths, *, scale: float | None = None, implementation: str | None = None,
                     query_chunk: int = QUERY_CHUNK):
  """Bidirectional attention within each of B sequences: q, k, v [B, T, N, H], lengths [B]
  int32 (the first lengths[b] positions of sequence b are real; keys after them are
  ignored, and the outputs there are not meaningful).

  implementation: None (cuDNN on an NVIDIA GPU for bf16 / fp16 when it takes the call,
  else XLA), "cudnn" or "xla". Returns [B, T, N, H] in q's dtype.
  """
  dtype = q.dtype
  k, v = k.astype(dtype), v.astype(dtype)
  # An empty sequence (padding slot or window) attends to its first position: finite, unused.
  lengths = jnp.maximum(jnp.asarray(lengths, jnp.int32), 1)
  if implementation in (None, "cudnn") and _cudnn_candidate(q):
    try:
      return jax.nn.dot_product_attention(q, k, v, scale=scale, query_seq_lengths=lengths,
                                          key_value_seq_lengths=lengths, implementation="cudnn")
    except (NotImplementedError, ValueError, RuntimeError):
      if implementation == "cudnn":
        raise
  elif implementation == "cudnn":
    raise ValueError(f"cuDNN attention needs an NVIDIA GPU and bf16/fp16 inputs; got {jax.default_backend()}, "
                     f"{dtype}")
  return _xla_varlen(q, k, v, lengths, scale, query_chunk)


def _cudnn_candidate(q) -> bool:
  return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
          and "nvidia" in jax.devices()[0].device_kind.lower())


def _xla_varlen(q, k, v, lengths, scale, chunk: int):
  b, t, n, h = q.shape

  def attend(qc, q_lengths):
    return jax.nn.dot_product_attention(qc, k, v, scale=scale, query_seq_lengths=q_lengths,
                                        key_value_seq_lengths=lengths, implementation="xla")

  if t <= chunk:
    return attend(q, lengths)
  m = -(-t // chunk)
  qs = jnp.pad(q, ((0, 0), (0, m * chunk - t), (0, 0), (0, 0))).reshape(b, m, chunk, n, h).swapaxes(0, 1)
  starts = jnp.arange(m, dtype=jnp.int32) * chunk
  # Recomputed in the backward pass: only one chunk's scores are alive at a time.
  one = jax.checkpoint(lambda xs: attend(xs[0], jnp.clip(lengths - xs[1], 0, chunk)))
  out = jax.lax.map(one, (qs, starts))  # [m, B, chunk, N, H]
  return out.swapaxes(0, 1).reshape(b, m * chunk, n, h)[:, :t]
