"""Wilson intervals, Spearman's rho and the paired bootstrap against scipy's implementations,
normal theory and hand values."""
import math

import numpy as np
import pytest

from guilibra_jax.eval.stats import paired_bootstrap, ranks, spearman, wilson


def test_wilson_matches_scipy_and_a_hand_value():
  stats = pytest.importorskip("scipy.stats")
  for k, n in [(0, 10), (8, 10), (10, 10), (3, 40), (17, 40), (1, 1)]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    np.testing.assert_allclose(wilson(k, n), (ci.low, ci.high), atol=1e-9)
  # 8/10: centre (0.8 + 1.96^2/20) / (1 + 1.96^2/10), half-width 1.96 sqrt(0.016 + 1.96^2/400) / (1 + 1.96^2/10)
  z = 1.959963984540054
  c, h = (0.8 + z * z / 20) / (1 + z * z / 10), z * math.sqrt(0.016 + z * z / 400) / (1 + z * z / 10)
  np.testing.assert_allclose(wilson(8, 10), (c - h, c + h))
  assert wilson(0, 0) == (0.0, 1.0)
  with pytest.raises(ValueError):
    wilson(11, 10)


def test_spearman_matches_scipy_with_ties():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  for _ in range(20):
    x = rng.integers(0, 4, size=7).astype(float)
    y = rng.integers(0, 4, size=7).astype(float)
    want = stats.spearmanr(x, y).statistic
    got = spearman(list(x), list(y))
    assert (got is None and not np.isfinite(want)) or np.isclose(got, want)
  assert ranks([3, 1, 3, 2]) == [3.5, 1, 3.5, 2]
  assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_paired_bootstrap_against_normal_theory_and_scipy():
  """Two models on the same 600 seeds, outcomes mostly shared (b = a with 10% of seeds
  flipped up, 4% down): the interval is the paired one (normal theory on the per-seed
  differences), far narrower than unpaired resampling would give, and matches scipy's."""
  rng = np.random.default_rng(1)
  n = 600
  a = (rng.random(n) < 0.4).astype(float)
  u = rng.random(n)
  b = np.where(u < 0.10, 1.0, np.where(u < 0.14, 0.0, a))
  mean, lo, hi = paired_bootstrap(list(a), list(b), n_boot=20_000)
  d = b - a
  half = 1.959963984540054 * d.std() / math.sqrt(n)
  assert mean == pytest.approx(d.mean())
  np.testing.assert_allclose((lo, hi), (d.mean() - half, d.mean() + half), atol=0.004)
  unpaired = 1.959963984540054 * math.sqrt(a.var() / n + b.var() / n)
  assert hi - lo < 0.7 * 2 * unpaired
  stats = pytest.importorskip("scipy.stats")
  ci = stats.bootstrap((a, b), lambda x, y: np.mean(y - x), paired=True, vectorized=False, n_resamples=5_000,
                       method="percentile", random_state=0).confidence_interval
  np.testing.assert_allclose((lo, hi), (ci.low, ci.high), atol=0.004)
  assert paired_bootstrap([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 0.0)
  with pytest.raises(ValueError, match="3 outcomes against 2"):
    paired_bootstrap([1, 0, 1], [1, 0])


def test_paired_ratio_bootstrap_against_the_delta_method_and_scipy():
  """A student scored on the same 800 held-out steps as its teacher (it passes 85% of the
  steps the teacher passes, and 5% of the others): the ratio of means with an interval that
  matches the delta method's normal approximation and scipy's paired percentile bootstrap."""
  from guilibra_jax.eval.stats import paired_ratio_bootstrap

  rng = np.random.default_rng(2)
  n = 800
  t = (rng.random(n) < 0.7).astype(float)
  s = np.where(t > 0, rng.random(n) < 0.85, rng.random(n) < 0.05).astype(float)
  r, lo, hi = paired_ratio_bootstrap(list(s), list(t), n_boot=20_000)
  assert r == pytest.approx(s.mean() / t.mean())
  # delta method: var(mean_s / mean_t) ~ var(s - r t) / (n mean_t^2)
  half = 1.959963984540054 * np.std(s - r * t) / (math.sqrt(n) * t.mean())
  np.testing.assert_allclose((lo, hi), (r - half, r + half), atol=0.006)
  stats = pytest.importorskip("scipy.stats")
  ci = stats.bootstrap((s, t), lambda x, y: np.mean(x) / np.mean(y), paired=True, vectorized=False,
                       n_resamples=5_000, method="percentile", random_state=0).confidence_interval
  np.testing.assert_allclose((lo, hi), (ci.low, ci.high), atol=0.006)
  assert paired_ratio_bootstrap([1, 0, 1], [1, 0, 1]) == (1.0, 1.0, 1.0)
  with pytest.raises(ValueError, match="3 outcomes against 2"):
    paired_ratio_bootstrap([1, 0, 1], [1, 0])
  with pytest.raises(ValueError, match="mean"):
    paired_ratio_bootstrap([1, 0], [0, 0])


def test_spearman_difference_point_estimate_is_scipys_and_identical_runs_give_zero():
    """The point estimate is scipy's Spearman on each run's checkpoint rates; runs scored
    alike in both groups differ by exactly 0 in every bootstrap draw; a run whose offline
    order agrees with its online order against one where it is reversed differs by 2 with an
    interval above 0 when the checkpoints are far apart."""
    stats = pytest.importorskip("scipy.stats")
    from guilibra_jax.eval.stats import spearman_difference
    rng = np.random.default_rng(0)
    p_off, p_on = np.array([0.2, 0.4, 0.6, 0.8]), np.array([0.1, 0.3, 0.5, 0.9])
    agree = ((rng.random((4, 400)) < p_off[:, None]), (rng.random((4, 300)) < p_on[:, None]))
    rev = (agree[0], agree[1][::-1])
    r = spearman_difference([agree], [rev], n_boot=300)
    want = (stats.spearmanr(agree[0].mean(1), agree[1].mean(1))[0]
            - stats.spearmanr(rev[0].mean(1), rev[1].mean(1))[0])
    assert r["difference"] == pytest.approx(want) == pytest.approx(2.0)
    assert r["ci95"][0] > 0 and r["undefined_draws"] == 0
    same = spearman_difference([agree], [agree], n_boot=200)
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    close = (rng.random((4, 30)) < 0.5, rng.random((4, 30)) < 0.5)   # noise only: the interval takes in 0
    n = spearman_difference([close], [(close[0], close[1][::-1])], n_boot=300)
    assert n["ci95"][0] < 0 < n["ci95"][1]
    with pytest.raises(ValueError, match="same steps and episodes"):
        spearman_difference([agree], [(agree[0][:, :10], agree[1])])
