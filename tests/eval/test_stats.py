"""Wilson intervals and Spearman's rho against scipy's implementations and hand values."""
import math

import numpy as np
import pytest

from guilibra_jax.eval.stats import ranks, spearman, wilson


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
