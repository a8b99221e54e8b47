"""Group statistics of a rollout, computed on the host where the group lives (the G
responses of a prompt always sit on one process): advantages, SNGS, the pass-rate floor,
the adaptive KL mask, and which groups group filtering keeps. numpy in, numpy out.

Rows are group-major: row ``b * G + k`` is response k of prompt b.

Paper vs release switches (docs/method.md):

* ``rl.normalize_std``: (r - mean) / std (GUI-Libra) or r - mean (UI-MOPD).
* ``rl.mopd.kl_mask``: "off" (the UI-MOPD release script: every sequence gets the KL
  term), "paper" (μ_g = 0 for groups whose pass rate exceeds ``rl.mopd.kl_mask_tau``; the
  masked tokens count as zeros in the token mean), "release" (the release's off-by-default
  ``use_kl_loss_mask`` path: the KL is averaged over the unmasked sequences' tokens only and
  multiplied by the unmasked fraction of sequences; we take both over the update
  minibatch, the release over each GPU micro-batch). The pass-rate floor that zeroes
  advantages of groups below ``rl.mopd.pass_floor`` belongs to the same off-by-default
  release path and to the paper's method: it is on exactly when the KL mask is not "off".
* ``rl.group_filter``: DAPO-style dynamic sampling (the UI-MOPD release runs with it on):
  groups whose pass rate is 0 or 1 are dropped (see :func:`keep_groups`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from guilibra_jax import losses
from guilibra_jax.choices import KL_MASKS
from guilibra_jax.train.rl.rollout import group_view


def compute(rewards: np.ndarray, success: np.ndarray, group_size: int, method: str, rl) -> dict[str, np.ndarray]:
    """Per-row ``advantages`` [R], ``kl_mask`` [R] (μ_g: 1 = KL on) and SNGS ``lambda`` [R]
    from rewards and passes [R].

    GRPO: group-relative advantages, then SNGS (negative ones times λ = min(λ0 + κ p^, 1),
    p^ the group's mean reward or success rate); kl_mask 1.
    MOPD: advantages r - mean (std-normalised if rl.normalize_std); with rl.mopd.kl_mask
    "paper" or "release": zeroed for groups whose pass rate is below rl.mopd.pass_floor, and
    kl_mask 0 for groups whose pass rate exceeds rl.mopd.kl_mask_tau; every advantage 0 with
    rl.mopd.task_reward off (distillation alone).
    """
    r = group_view(rewards, group_size)
    s = group_view(success, group_size).astype(np.float32)
    adv = np.asarray(losses.group_advantages(jnp.asarray(r), normalize_std=rl.normalize_std,
                                             std_unbiased=rl.std_unbiased))
    n = r.shape[0]
    lam = np.ones(n, np.float32)
    kl_mask = np.ones(n, np.float32)
    if method == "grpo" and rl.sngs.enabled:
        signal = r.mean(1) if rl.sngs.signal == "mean_reward" else s.mean(1)
        scaled, lam = losses.sngs_scale(jnp.asarray(adv), jnp.asarray(signal), lambda0=rl.sngs.lambda0,
                                        kappa=rl.sngs.kappa)
        adv, lam = np.asarray(scaled), np.asarray(lam)
    if method == "mopd" and kl_mask_mode(rl) != "off":
        pass_rate = s.mean(1)
        adv = np.where((pass_rate < rl.mopd.pass_floor)[:, None], 0.0, adv)
        kl_mask = (pass_rate <= rl.mopd.kl_mask_tau).astype(np.float32)
    if method == "mopd" and not rl.mopd.task_reward:   # pure on-policy distillation: the teacher term only
        adv = np.zeros_like(adv)
    rep = lambda x: np.repeat(np.asarray(x, np.float32), group_size)
    return {"advantages": adv.reshape(-1).astype(np.float32), "kl_mask": rep(kl_mask), "lambda": rep(lam)}


def kl_mask_mode(rl) -> str:
    """rl.mopd.kl_mask ("off" | "paper" | "release")."""
    return rl.mopd.kl_mask


def kl_totals(kl_mask: np.ndarray, token_counts: np.ndarray) -> np.ndarray:
    """[4] float64 sums over rows: all response tokens, tokens of unmasked (μ_g = 1)
    sequences, sequences with tokens, unmasked sequences with tokens (add them over
    processes for the global minibatch)."""
    m = np.asarray(kl_mask) > 0
    c = np.asarray(token_counts, np.float64)
    live = c > 0
    return np.array([c.sum(), (c * m).sum(), live.sum(), (live & m).sum()], np.float64)


def kl_weights(kl_mask: np.ndarray, mode: str, totals: np.ndarray | None = None) -> np.ndarray:
    """Per-sequence KL weights [R]: the loss multiplies each sequence's K3 terms by its
    weight inside the token mean over all response tokens of the update minibatch.

    "off": 1 everywhere. "paper": μ_g (masked sequences' tokens count as zeros in the mean).
    "release": μ_g · (N / N_on) · (n_on / n) with ``totals`` = :func:`kl_totals` of the whole
    minibatch (N, N_on response tokens of all / unmasked sequences, n, n_on sequences): the
    KL's token mean over unmasked sequences times the unmasked fraction of sequences."""
    if mode not in KL_MASKS:
        raise ValueError(f"rl.mopd.kl_mask = {mode!r}: expected one of {KL_MASKS}")
    m = (np.asarray(kl_mask) > 0).astype(np.float32)
    if mode == "off":
        return np.ones_like(m)
    if mode == "paper":
        return m
    n_tok, n_on_tok, n_seq, n_on_seq = (float(x) for x in totals)
    if n_on_tok == 0:
        return np.zeros_like(m)
    return (m * (n_tok / n_on_tok) * (n_on_seq / max(n_seq, 1.0))).astype(np.float32)


def keep_groups(success: np.ndarray, valid: np.ndarray, group_size: int) -> np.ndarray:
    """[R / G] bool: groups group filtering keeps: valid groups whose pass rate is strictly
    between 0 and 1 (the release's filter on "acc" with thresholds 0 and 1)."""
    s = group_view(success, group_size).astype(np.float32).mean(1)
    v = group_view(valid, group_size)[:, 0]
    return v & (s > 0.0) & (s < 1.0)
