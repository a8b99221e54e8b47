"""Float32 tolerances derived from the arithmetic, not from one machine's run.

Two computations of one float32 quantity that add its terms in different orders
(chunked and whole rows, micro-batches and one batch, another kernel or thread count, as
another CPU picks) differ by rounding alone. Each addition rounds by at most eps32 / 2 of
the partial sum, so two orders of a sum of ``n`` terms of magnitude up to ``m`` differ by
at most about ``n * eps32 * m``, and, the roundings having random signs, typically by
about ``sqrt(n) * eps32 * m``. An entry of a result is such a sum whatever its own size:
a small gradient entry made of large terms of both signs carries their rounding. So the
tolerance of a whole array is absolute, scaled by the magnitude of its terms, bounded by
the array's largest entry (a sum of terms of random sign is larger than its terms):

    atol = c * eps32 * sqrt(n) * max|reference|

``n`` counts the terms along the longest chain of sums that produce an entry (e.g. rows
summed into a weight gradient, plus the widths of the matmuls before it); ``c`` = 4 leaves
a margin of about 10 over what was measured on x86 CPUs (errors of 0.1 to 0.4 of
``eps32 * sqrt(n) * max|reference|``) and stays far below the error of a real mistake
(a dropped or doubled row, a wrong mask: of the order of the values themselves).
"""
from __future__ import annotations

import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def f32_atol(reference, n_terms: int, c: float = 4.0) -> float:
    """The absolute tolerance of a float32 array computed in another summation order (module docstring)."""
    return c * EPS32 * math.sqrt(n_terms) * float(np.max(np.abs(np.asarray(reference, np.float64))))


def assert_f32_close(actual, reference, n_terms: int, c: float = 4.0, err_msg: str = "") -> None:
    """``actual`` equals ``reference`` up to the rounding of sums of ``n_terms`` float32 terms."""
    atol = f32_atol(reference, n_terms, c)
    np.testing.assert_allclose(np.asarray(actual), np.asarray(reference), rtol=0, atol=atol,
                               err_msg=f"{err_msg} (atol {atol:.3g} = {c} eps32 sqrt({n_terms}) max|reference|)")
