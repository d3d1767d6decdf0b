"""Two samples of one law? The checks the MinAtar rules tests use to compare random play in
torch with random play in gymnax (different random streams: only the laws can agree)."""

from __future__ import annotations

import math

import numpy as np


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two ECDFs."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def ks_threshold(n: int, m: int, alpha: float) -> float:
    """The statistic that two samples of one continuous law exceed with probability `alpha`
    (asymptotic); for discrete laws like these the test is conservative."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def assert_same_law(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Means within 4 standard errors of their difference, and a KS statistic below its
    alpha = 1e-4 threshold for the sample sizes."""
    n, m = len(ours), len(theirs)
    se = math.sqrt(ours.var(ddof=1) / n + theirs.var(ddof=1) / m)
    gap = abs(ours.mean() - theirs.mean())
    means = f"{ours.mean():.4f} vs {theirs.mean():.4f}"
    assert gap < 4 * se, f"{what}: mean {means} ({gap / se:.1f} SE)"
    ks, limit = ks_statistic(ours, theirs), ks_threshold(n, m, 1e-4)
    assert ks < limit, f"{what}: KS statistic {ks:.4f} >= {limit:.4f}"
