"""The LM head and cross-entropy at the loss positions only, in token chunks.

A training step that takes its loss on a fraction of the positions (the responses of SFT
samples) does not need the [B, T, V] logits: with Qwen's 152k vocabulary they are the
largest tensor of the step and the head is most of its FLOPs. :func:`head_nll` computes

    num = Σ_{b,t} coef[b, t] · nll[b, t],   nll[b, t] = logsumexp(h[b, t] W^T) - (h[b, t] W^T)[targets[b, t]]

over the positions of ``mask`` only, and per-token ``nll`` for metrics:

* Each row's mask positions are moved to its front (a stable sort: static shapes, the
  batch axis untouched, so data-parallel sharding stays as it is).
* The front is processed in chunks of ``chunk`` positions per row, as many as the
  longest row needs (a while loop: the count is a run-time value), then the remainder in
  one chunk of the smallest fitting size among a few static ones (``remainder_sizes``,
  chosen by ``lax.switch``); positions computed beyond a row's count carry no weight.
  The work is that of ``max_b count_b`` positions per row (the remainder rounded up by
  less than half), and at most [B, chunk, V] logits live at once, whatever T is.
* The gradient (softmax - one-hot, times coef) is formed inside the forward pass, chunk
  by chunk (a ``jax.custom_vjp``): no logits are kept for the backward pass and none are
  recomputed; the backward pass only scales the stored dh and dW by the cotangent.

Exactness: ``num`` and its gradients are those of the full-logits computation up to
float summation order (tests/test_head_loss.py: relative 1e-12 in float64, 2e-6 in float32).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from guilibra_jax import sharding as S

Array = jax.Array


def remainder_sizes(chunk: int, min_chunk: int) -> tuple[int, ...]:
    """The chunk sizes a remainder below ``chunk`` may take, ascending: ``min_chunk``, the
    numbers 2^k and 3 * 2^(k-1) between it and ``chunk``, and ``chunk``. A remainder r
    takes the smallest size >= r, so fewer than r / 2 (and min_chunk) positions are
    computed in excess, in one pass over the head."""
    min_chunk = min(min_chunk, chunk)
    sizes = {min_chunk, chunk}
    k = 1
    while k < chunk:
        sizes.update(s for s in (k, 3 * k // 2) if min_chunk < s < chunk)
        k *= 2
    return tuple(sorted(sizes))


def positions_computed(n: int, total: int, chunk: int = 128, min_chunk: int = 16) -> int:
    """Positions per row :func:`head_nll` computes when its longest row has ``n`` mask
    positions out of ``total`` (n rounded up by the chunking; for FLOP counts)."""
    chunk = min(chunk, total)
    full, rest = divmod(n, chunk)
    return full * chunk + (min(s for s in remainder_sizes(chunk, min_chunk) if s >= rest) if rest else 0)


def _acc(dtype):
    """The accumulation dtype: float32, or wider for wider inputs."""
    return jnp.promote_types(dtype, jnp.float32)


def _slice(x, start, size):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=1)


def _forward(h, w, targets, coef, valid, n, chunk, min_chunk, with_grad):
    """num, nll [B, T + chunk] (and dh like h, dw [V, D] float32 when with_grad) over the
    first n positions of the sorted, padded inputs: full chunks in a while loop, then the
    remainder in one chunk of the smallest fitting size (lax.switch)."""
    b, t_pad, d = h.shape
    acc = _acc(w.dtype)

    def chunk_terms(start, size):
        """One chunk's contributions, padded to `chunk` positions."""
        hc, tc, cc, vc = (_slice(x, start, size) for x in (h, targets, coef, valid))
        # rows stay over the batch devices (else GSPMD may form every row's logits everywhere)
        logits = S.constrain_batch(jnp.einsum("bcd,vd->bcv", S.constrain_batch(hc), w, preferred_element_type=acc))
        lse = jax.nn.logsumexp(logits, axis=-1)
        nll = jnp.where(vc, lse - jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0], 0.0)
        pad = lambda x: jnp.pad(x, ((0, 0), (0, chunk - size)) + ((0, 0),) * (x.ndim - 2))
        out = {"num": jnp.sum(jnp.where(vc, cc * nll, 0.0)), "nll": pad(nll)}
        if with_grad:
            vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
            p = jnp.exp(logits - lse[..., None])
            g = jnp.where(vc[..., None], cc[..., None] * jnp.where(vocab == tc[..., None], p - 1.0, p), 0.0)
            g = S.constrain_batch(g.astype(w.dtype))
            dh = S.constrain_batch(jnp.einsum("bcv,vd->bcd", g, w, preferred_element_type=acc))
            out["dh"] = pad(dh.astype(h.dtype))
            # over (row, position) as one dim: contracting two, XLA's CPU dot transposes g first
            # ([V, B, C]; dW 1.6x slower at 2 x 96 positions, docs/benchmarks.md)
            g_rows, h_rows = g.reshape(-1, g.shape[-1]), hc.reshape(-1, d)
            out["dw"] = jnp.einsum("nv,nd->vd", g_rows, h_rows, preferred_element_type=acc)
        return out

    def add(carry, start, terms):
        out = {"num": carry["num"] + terms["num"],
               "nll": jax.lax.dynamic_update_slice_in_dim(carry["nll"], terms["nll"], start, axis=1)}
        if with_grad:
            out["dh"] = jax.lax.dynamic_update_slice_in_dim(carry["dh"], terms["dh"], start, axis=1)
            out["dw"] = carry["dw"] + terms["dw"]
        return out

    carry = {"num": jnp.zeros((), acc), "nll": jnp.zeros((b, t_pad), acc)}
    if with_grad:
        carry.update(dh=jnp.zeros_like(h), dw=jnp.zeros(w.shape, acc))
    full = n // chunk
    carry = jax.lax.fori_loop(0, full, lambda i, c: add(c, i * chunk, chunk_terms(i * chunk, chunk)), carry)
    start, rest = full * chunk, n - full * chunk
    sizes = remainder_sizes(chunk, min_chunk)
    shapes = jax.eval_shape(lambda st: chunk_terms(st, chunk), start)
    zero = lambda _: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    branches = [zero] + [functools.partial(lambda st, s: chunk_terms(st, s), s=s) for s in sizes]
    which = jnp.where(rest > 0, 1 + jnp.sum(jnp.asarray(sizes) < rest), 0)
    return add(carry, start, jax.lax.switch(which, branches, start))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _sorted_head_nll(h, w, targets, coef, valid, n, chunk, min_chunk):
    out = _forward(h, w, targets, coef, valid, n, chunk, min_chunk, with_grad=False)
    return out["num"], out["nll"]


def _fwd(h, w, targets, coef, valid, n, chunk, min_chunk):
    for x in (targets, valid, n):
        if x.perturbed:
            raise TypeError("head_nll: targets, mask and counts are not differentiable")
    out = _forward(h.value, w.value, targets.value, coef.value, valid.value, n.value, chunk, min_chunk,
                   with_grad=True)
    return (out["num"], out["nll"]), (out["dh"], out["dw"].astype(w.value.dtype), out["nll"])


def _bwd(chunk, min_chunk, res, cts):
    dh, dw, nll = res
    ct_num, ct_nll = cts
    if not isinstance(ct_nll, SymbolicZero):
        raise TypeError("head_nll: the per-token nll output is for metrics and is not differentiable "
                        "(differentiate num; wrap nll in jax.lax.stop_gradient)")
    if isinstance(ct_num, SymbolicZero):
        return (jnp.zeros_like(dh), jnp.zeros_like(dw), None, jnp.zeros_like(nll), None, None)
    return (ct_num.astype(dh.dtype) * dh, ct_num.astype(dw.dtype) * dw, None, ct_num * nll, None, None)


_sorted_head_nll.defvjp(_fwd, _bwd, symbolic_zeros=True)


def mask_first_order(mask: Array) -> tuple[Array, Array]:
    """(order [B, T] int32, count [B] int32): a permutation of each row putting its mask
    positions first (in position order), and how many there are."""
    order = jnp.argsort(~mask, axis=-1, stable=True).astype(jnp.int32)
    return order, jnp.sum(mask, axis=-1, dtype=jnp.int32)


def head_nll(h: Array, w: Array, targets: Array, coef: Array, mask: Array, *, chunk: int = 128,
             min_chunk: int = 16) -> tuple[Array, Array]:
    """(num [], nll [B, T]) of the LM head ``w`` [V, D] on hidden states ``h`` [B, T, D].

    targets [B, T] int: the token each position predicts (any value off the mask).
    coef [B, T] float: the loss coefficient of each position (0 off the mask); ``num`` =
      Σ coef · nll, differentiable in ``h``, ``w`` and ``coef``.
    mask [B, T] bool: the positions whose NLL is computed; ``nll`` is 0 elsewhere and
      carries no gradient (it is for metrics).
    chunk / min_chunk: positions per row per chunk, and the smallest remainder chunk.
    Logits are formed as ``h @ w.T`` in the inputs' dtype with float32 accumulation, the
    softmax in float32 (as ``model.logits_from_hidden`` and ``losses.token_nll``).
    """
    b, t, _ = h.shape
    if mask.shape != (b, t) or targets.shape != (b, t) or coef.shape != (b, t):
        raise ValueError(f"head_nll: expected targets, coef, mask [B, T] = {(b, t)}; got "
                         f"{targets.shape}, {coef.shape}, {mask.shape}")
    if chunk < 1 or min_chunk < 1:
        raise ValueError(f"head_nll: chunk={chunk} and min_chunk={min_chunk} must be >= 1")
    chunk = min(chunk, t)
    mask = mask.astype(bool)
    order, count = mask_first_order(mask)
    take = lambda x: jnp.take_along_axis(x, order, axis=1)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, chunk)) + ((0, 0),) * (x.ndim - 2))
    hs = pad(jnp.take_along_axis(h, order[..., None], axis=1))
    ts = pad(take(jnp.where(mask, targets, 0).astype(jnp.int32)))
    cs = pad(take(jnp.where(mask, coef, 0.0).astype(_acc(w.dtype))))
    vs = pad(take(mask))
    num, nll_sorted = _sorted_head_nll(hs, w, ts, cs, vs, jnp.max(count), chunk, min_chunk)
    rows = jnp.arange(b)[:, None]
    nll = jnp.zeros((b, t), nll_sorted.dtype).at[rows, order].set(jax.lax.stop_gradient(nll_sorted[:, :t]))
    return num, nll
