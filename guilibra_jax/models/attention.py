"""The attention functions of the models.

The text decoder's mask is a :class:`SegmentMask` (segment ids of queries and keys, causal
or not): it never needs a dense [T, S] mask. Short calls (T <= block: decoding, tests,
short prompts) build that mask and use `jax.nn.dot_product_attention`; long ones run
:func:`flash_attention`, a blockwise (online-softmax) attention in plain JAX whose forward
and backward passes hold one [block, block] score tile per head at a time, so memory is
O(T) instead of O(T^2) on every backend, and fully masked causal tiles are skipped.

`varlen_attention` takes independent sequences padded to one length and their lengths (the
vision tower: one image frame or window per sequence), a call cuDNN's flash attention
supports. In JAX 0.10 `jax.nn.dot_product_attention(implementation=None)` always uses XLA,
so `varlen_attention` asks for cuDNN itself on NVIDIA GPUs (bf16 / fp16) and otherwise
uses XLA for short sequences and :func:`flash_attention` for long ones.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

BLOCK = 1024  # queries / keys per tile of flash_attention; calls with T <= BLOCK are dense
_NEG = -1e30  # finite "minus infinity": exp(_NEG - m) underflows to 0 without NaNs


@functools.partial(jax.tree_util.register_dataclass, data_fields=["q_segment_ids", "kv_segment_ids", "q_offset"],
                   meta_fields=["causal", "block"])
@dataclasses.dataclass(frozen=True)
class SegmentMask:
  """Query i of row b attends to key j iff q_segment_ids[b, i] == kv_segment_ids[b, j] and,
  if causal, j <= q_offset + i (queries sit at positions q_offset.. of the key axis).

  q_segment_ids [B, T], kv_segment_ids [B, S] int32 (0 = padding: it sees only padding, so no
  query row is empty); q_offset [] int32; block: tile size of flash_attention (calls with
  T <= block are dense).
  """
  q_segment_ids: jax.Array
  kv_segment_ids: jax.Array
  q_offset: jax.Array
  causal: bool = True
  block: int = BLOCK

  def dense(self):
    """The boolean mask [B, 1, T, S]."""
    b, t = self.q_segment_ids.shape
    q_index = self.q_offset + jnp.broadcast_to(jnp.arange(t), (b, t))
    return attention_mask(self.q_segment_ids, self.kv_segment_ids, causal=self.causal, q_index=q_index)


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
  """q [B, T, N, H], k/v [B, S, K, H] (N a multiple of K: GQA); mask a SegmentMask or a
  boolean [B, 1|N, T, S].

  Returns [B, T, N, H] in q's dtype.
  """
  dtype = q.dtype
  k = k.astype(dtype)
  v = v.astype(dtype)
  if isinstance(mask, SegmentMask):
    if q.shape[1] > mask.block:
      return flash_attention(q, k, v, mask.q_segment_ids, mask.kv_segment_ids, mask.q_offset, scale=scale,
                             causal=mask.causal, block=mask.block)
    mask = mask.dense()
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation=None)


def _by_kv_head(q, kh: int):
  """q [B, T, N, H] -> [B, K, T * G, H]: each kv head's T * G queries (G = N / K) as rows."""
  b, t, n, h = q.shape
  return jnp.transpose(q.reshape(b, t, kh, n // kh, h), (0, 2, 1, 3, 4)).reshape(b, kh, t * (n // kh), h)


def _from_kv_heads(out, t: int):
  """The inverse of :func:`_by_kv_head`: [B, K, T * G, H] -> [B, T, K * G, H]."""
  b, kh, tg, h = out.shape
  return jnp.transpose(out.reshape(b, kh, t, tg // t, h), (0, 2, 1, 3, 4)).reshape(b, t, kh * (tg // t), h)


def _cache_logits(qm, k, mask, t: int, scale: float, acc):
  """Masked logits [B, K, T * G, S] of :func:`_by_kv_head`'s queries qm over a key cache k
  [B, K, H, S] as stored (contracted over its rows); mask a SegmentMask or a boolean
  [B, 1|N, T, S], masked-out slots _NEG."""
  b, kh, tg, _ = qm.shape
  g = tg // t
  if isinstance(mask, SegmentMask):
    mask = mask.dense()
  logits = jax.lax.dot_general(qm, k.astype(qm.dtype), (((3,), (2,)), ((0, 1), (0, 1))),
                               preferred_element_type=acc) * scale
  logits = logits.reshape(b, kh, t, g, -1)                                              # [B, K, T, G, S]
  if mask.shape[1] == 1:
    mask = mask[:, :, :, None, :]
  else:
    mask = jnp.transpose(mask.reshape(b, kh, g, t, -1), (0, 1, 3, 2, 4))
  return jnp.where(mask, logits, _NEG).reshape(b, kh, tg, -1)


def cached_attention(q, k, v, mask, *, scale: float):
  """Attention of a few queries over a KV cache kept in its own layout: q [B, T, N, H], k
  [B, K, H, S] and v [B, K, S, H] (K kv heads, S slots), mask a SegmentMask (T <= its block)
  or a boolean [B, 1|N, T, S]. Equal to ``dot_product_attention`` on the same keys and values
  as [B, S, K, H]. Both products are [B, K]-batched matmuls of a kv head's T * N / K queries
  with the cache as stored, each operand in the layout XLA's CPU dots read (contracted over
  keys' rows, values' columns): a decode step neither copies a transposed cache nor runs a
  dot with a size-1 dimension (what [B, S, K, H] cost: about 2 ms against 0.3 ms a layer at 32
  rows x 223 slots on a 2-core CPU).

  Returns [B, T, N, H] in q's dtype."""
  dtype = q.dtype
  t = q.shape[1]
  acc = jnp.promote_types(dtype, jnp.float32)   # logits and softmax: float32 at least
  qm = _by_kv_head(q, k.shape[1])
  probs = jax.nn.softmax(_cache_logits(qm, k, mask, t, scale, acc).astype(acc), axis=-1).astype(v.dtype)
  out = jax.lax.dot_general(probs, v.astype(dtype), (((3,), (2,)), ((0, 1), (0, 1))))   # [B, K, TG, H]
  return _from_kv_heads(out, t).astype(dtype)


def cascade_attention(q, k, v, mask, pk, pv, pmask, *, scale: float):
  """:func:`cached_attention` of rows that share a prompt, over [the prompt's keys and values, held
  once for its rows | each row's own cache]: q [B, T, N, H]; own cache k [B, K, H, S], v [B, K, S, H]
  and mask (a SegmentMask or a boolean [B, 1|N, T, S]) as there; the P = B / c prompts' keys
  pk [P, K, H, Sp], values pv [P, K, Sp, H] and pmask [P, Sp] (the slots every query of the
  prompt's rows sees), row p * c + j continuing prompt p. Equal to cached_attention over each
  row's [prompt | own] slots; the prompt's part is one matmul per prompt and kv head for the
  queries of all its c rows, and the two parts' softmax shares one max and one denominator, so
  no row reads a copy of its prompt (benchmarks.decode_attention).

  Returns [B, T, N, H] in q's dtype."""
  dtype = q.dtype
  b, t = q.shape[:2]
  p, kh = pk.shape[:2]
  c = b // p
  if c * p != b:
    raise ValueError(f"{b} rows are not a multiple of the {p} prompts")
  acc = jnp.promote_types(dtype, jnp.float32)
  contract = (((3,), (2,)), ((0, 1), (0, 1)))
  by_prompt = lambda x: x.reshape(p, c, kh, x.shape[2], -1).transpose(0, 2, 1, 3, 4).reshape(p, kh, -1, x.shape[3])  # noqa: E731
  by_row = lambda x: x.reshape(p, kh, c, -1, x.shape[3]).transpose(0, 2, 1, 3, 4).reshape(b, kh, -1, x.shape[3])  # noqa: E731
  qm = _by_kv_head(q, kh)
  own = _cache_logits(qm, k, mask, t, scale, acc)                                                # [B, K, TG, S]
  shared = jax.lax.dot_general(by_prompt(qm), pk.astype(dtype), contract, preferred_element_type=acc) * scale
  shared = by_row(jnp.where(pmask[:, None, None, :], shared, _NEG))                             # [B, K, TG, Sp]
  m = jnp.maximum(own.max(-1), shared.max(-1))[..., None]
  e_own, e_shared = jnp.exp(own - m), jnp.exp(shared - m)
  den = e_own.sum(-1) + e_shared.sum(-1)
  out = (by_row(jax.lax.dot_general(by_prompt(e_shared).astype(dtype), pv.astype(dtype), contract,
                                    preferred_element_type=acc))
         + jax.lax.dot_general(e_own.astype(dtype), v.astype(dtype), contract, preferred_element_type=acc))
  return _from_kv_heads(out / den[..., None], t).astype(dtype)


def varlen_attention(q, k, v, lengths, *, scale: float | None = None, implementation: str | None = None,
                     block: int = BLOCK):
  """Bidirectional attention within each of B sequences: q, k, v [B, T, N, H], lengths [B]
  int32 (the first lengths[b] positions of sequence b are real; keys after them are
  ignored, and the outputs there are not meaningful).

  implementation: None (cuDNN on an NVIDIA GPU for bf16 / fp16 when it takes the call,
  else XLA), "cudnn" or "xla" (dense for T <= block, else flash_attention). Returns
  [B, T, N, H] in q's dtype.
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
  t = q.shape[1]
  if t <= block:
    return jax.nn.dot_product_attention(q, k, v, scale=scale, query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths, implementation="xla")
  # Real positions are segment 1, padding segment 0 (padding sees padding: outputs unused).
  seg = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.int32)
  return flash_attention(q, k, v, seg, seg, jnp.zeros((), jnp.int32), scale=scale, causal=False, block=block)


def _cudnn_candidate(q) -> bool:
  return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
          and "nvidia" in jax.devices()[0].device_kind.lower())


# ----------------------------------------------------------------------------- flash attention
def flash_attention(q, k, v, q_segment_ids, kv_segment_ids, q_offset=0, *, scale: float | None = None,
                    causal: bool = True, block: int = BLOCK):
  """Blockwise attention, equal to the dense one under SegmentMask's rule.

  q [B, T, N, H], k/v [B, S, K, H] (N a multiple of K), segment ids [B, T] / [B, S], q_offset
  a scalar. Scores and softmax statistics are float32; the probabilities are cast to v's
  dtype for the value product (as fused kernels do). Returns [B, T, N, H] in q's dtype.
  The backward pass recomputes each tile from the saved log-sum-exp (custom VJP): nothing
  [T, S]-sized is stored.
  """
  scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
  q_offset = jnp.asarray(q_offset, jnp.int32)
  return _flash(q, k.astype(q.dtype), v.astype(q.dtype), q_segment_ids.astype(jnp.int32),
                kv_segment_ids.astype(jnp.int32), q_offset, scale, causal, int(block))


def _tiles(q, k, v, qseg, kseg, block):
  """Pad T and S to multiples of block (padding ids -1 / -2 match nothing) and split into
  tiles: q [nq, B, bq, K, G, H], k/v [nk, B, bk, K, H], qseg [nq, B, bq], kseg [nk, B, bk]."""
  b, t, n, h = q.shape
  s, kh = k.shape[1], k.shape[2]
  nq, nk = -(-t // block), -(-s // block)
  pad = lambda x, n_, fill: jnp.pad(x, [(0, 0), (0, n_ * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2),
                                    constant_values=fill)
  split = lambda x, n_: jnp.moveaxis(x.reshape((b, n_, block) + x.shape[2:]), 1, 0)
  qt = split(pad(q, nq, 0).reshape(b, nq * block, kh, n // kh, h), nq)
  kt, vt = split(pad(k, nk, 0), nk), split(pad(v, nk, 0), nk)
  return qt, kt, vt, split(pad(qseg, nq, -1), nq), split(pad(kseg, nk, -2), nk)


def _tile_mask(qseg_i, kseg_j, i, j, q_offset, causal, block):
  """[B, bq, bk] bool of tile (i, j), and whether any key of the tile can be visible."""
  m = qseg_i[:, :, None] == kseg_j[:, None, :]
  if not causal:
    return m, jnp.asarray(True)
  qpos = q_offset + i * block + jnp.arange(block)
  kpos = j * block + jnp.arange(block)
  m = m & (qpos[:, None] >= kpos[None, :])[None]
  return m, j * block <= q_offset + (i + 1) * block - 1


def _acc(dtype):
  """Accumulation dtype: float32, or float64 for float64 inputs."""
  return jnp.promote_types(dtype, jnp.float32)


def _scores(qi, kj, scale):
  acc = _acc(qi.dtype)
  return jnp.einsum("bqkgh,bskh->bkgqs", qi, kj, preferred_element_type=acc) * scale


def _forward(q, k, v, qseg, kseg, q_offset, scale, causal, block):
  b, t, n, h = q.shape
  acc = _acc(q.dtype)
  qt, kt, vt, qst, kst = _tiles(q, k, v, qseg, kseg, block)
  nk = kt.shape[0]
  kh, g = qt.shape[3], qt.shape[4]

  def q_tile(xs):
    qi, qseg_i, i = xs
    # Optimization barriers tie the key tiles, segment ids and tile indices to this query
    # tile: otherwise, inside a scan (a scanned layer stack, even of length 1), JAX's
    # partial evaluation moves what depends only on them (tile masks, key/value tile copies)
    # out of the loops, materialised for all [nq, nk] tile pairs at once (measured: a
    # 4096-token call went from 14 MB of temporaries to 61 MB; a 3B layer stack to GBs).
    qi, qseg_i, kt_, vt_, kst_ = jax.lax.optimization_barrier((qi, qseg_i, kt, vt, kst))

    def kv_tile(carry, ys):
      kj, vj, kseg_j, j = jax.lax.optimization_barrier(ys)   # the tile index too (see above)
      mask, live = _tile_mask(qseg_i, kseg_j, i, j, q_offset, causal, block)

      def update(c):
        o, m, l = c
        keep = mask[:, None, None].astype(acc)   # masking by arithmetic: no constant tiles to hoist
        s = _scores(qi, kj, scale) + (1.0 - keep) * _NEG
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[..., None]) * keep
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(-1)
        pv = jnp.einsum("bkgqs,bskh->bqkgh", p.astype(vj.dtype), vj, preferred_element_type=acc)
        return o * jnp.moveaxis(corr, -1, 1)[..., None] + pv, m_new, l

      return jax.lax.cond(live, update, lambda c: c, carry), None

    init = (jnp.zeros((b, block, kh, g, h), acc), jnp.full((b, kh, g, block), _NEG, acc),
            jnp.zeros((b, kh, g, block), acc))
    (o, m, l), _ = jax.lax.scan(kv_tile, init, (kt_, vt_, kst_, jnp.arange(nk)))
    safe = jnp.where(l > 0, l, 1.0)
    o = o / jnp.moveaxis(safe, -1, 1)[..., None]
    lse = jnp.where(l > 0, m + jnp.log(safe), 0.0)
    return o.astype(q.dtype), lse

  o, lse = jax.lax.map(q_tile, (qt, qst, jnp.arange(qt.shape[0])))  # [nq, B, bq, K, G, H], [nq, B, K, G, bq]
  out = jnp.moveaxis(o, 0, 1).reshape(b, -1, n, h)[:, :t]
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _flash(q, k, v, qseg, kseg, q_offset, scale, causal, block):
  return _forward(q, k, v, qseg, kseg, q_offset, scale, causal, block)[0]


def _flash_fwd(q, k, v, qseg, kseg, q_offset, scale, causal, block):
  out, lse = _forward(q, k, v, qseg, kseg, q_offset, scale, causal, block)
  return out, (q, k, v, qseg, kseg, q_offset, out, lse)


def _flash_bwd(scale, causal, block, res, dout):
  q, k, v, qseg, kseg, q_offset, out, lse = res
  b, t, n, h = q.shape
  acc = _acc(q.dtype)
  s_len = k.shape[1]
  qt, kt, vt, qst, kst = _tiles(q, k, v, qseg, kseg, block)
  dot = _tiles(dout, k, v, qseg, kseg, block)[0]
  kh, g = qt.shape[3], qt.shape[4]
  nq, nk = qt.shape[0], kt.shape[0]
  # D_i = rowsum(dO * O), laid out like the scores' query axis: [nq, B, K, G, bq]
  d_full = (dout.astype(acc) * out.astype(acc)).sum(-1)            # [B, T, N]
  d_full = jnp.pad(d_full, ((0, 0), (0, nq * block - t), (0, 0))).reshape(b, nq, block, kh, g)
  dt = jnp.moveaxis(d_full, (1, 2), (0, 4))

  def q_tile(carry, xs):
    dk_acc, dv_acc = carry
    qi, doi, lse_i, d_i, qseg_i, i = xs
    qi, doi, lse_i, d_i, qseg_i, kt_, vt_, kst_ = jax.lax.optimization_barrier(   # as in _forward
        (qi, doi, lse_i, d_i, qseg_i, kt, vt, kst))

    def kv_tile(dq, ys):
      kj, vj, kseg_j, j = jax.lax.optimization_barrier(ys)
      mask, live = _tile_mask(qseg_i, kseg_j, i, j, q_offset, causal, block)

      def grads(dq):
        p = jnp.exp(_scores(qi, kj, scale) - lse_i[..., None]) * mask[:, None, None].astype(acc)
        dv = jnp.einsum("bkgqs,bqkgh->bskh", p.astype(doi.dtype), doi, preferred_element_type=acc)
        dp = jnp.einsum("bqkgh,bskh->bkgqs", doi, vj, preferred_element_type=acc)
        ds = p * (dp - d_i[..., None]) * scale
        dq = dq + jnp.einsum("bkgqs,bskh->bqkgh", ds.astype(kj.dtype), kj, preferred_element_type=acc)
        dk = jnp.einsum("bkgqs,bqkgh->bskh", ds.astype(qi.dtype), qi, preferred_element_type=acc)
        return dq, (dk, dv)

      zeros = (jnp.zeros(kj.shape, acc), jnp.zeros(vj.shape, acc))
      return jax.lax.cond(live, grads, lambda dq: (dq, zeros), dq)

    dq, (dk, dv) = jax.lax.scan(kv_tile, jnp.zeros(qi.shape, acc), (kt_, vt_, kst_, jnp.arange(nk)))
    return (dk_acc + dk, dv_acc + dv), dq

  zeros = jnp.zeros(kt.shape, acc)
  (dk, dv), dq = jax.lax.scan(q_tile, (zeros, zeros), (qt, dot, lse, dt, qst, jnp.arange(nq)))
  dq = jnp.moveaxis(dq, 0, 1).reshape(b, -1, n, h)[:, :t].astype(q.dtype)
  unsplit = lambda x: jnp.moveaxis(x, 0, 1).reshape((b, -1) + x.shape[3:])[:, :s_len].astype(k.dtype)
  return dq, unsplit(dk), unsplit(dv), None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)
