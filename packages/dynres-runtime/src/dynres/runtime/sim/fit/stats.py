"""The statistics of a fit: mean and spread, a linear trend with its standard error, and the
lognormal median behind a capped mean.

Every fitted number says how many values it rests on and how much they spread, so the
helpers return both, and :func:`spread_note` words them the same way in every comment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dynres.runtime.sim.workload import capped_lognormal_mean

MIN_CYCLES = 2
"""Fewest sync cycles a fit accepts (count): one cycle says nothing about spread or drift."""


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and relative spread (std / mean; 0 for one value) of ``values``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2 or mean == 0:
        return mean, 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, std / abs(mean)


def spread_note(values: Sequence[float], what: str = "cycles") -> str:
    """``n=<count> <what>, spread <relative spread>%``: what a fitted number rests on."""
    spread = mean_spread(values)[1]
    return f"n={len(values)} {what}, spread {spread * 100:.0f}%"


def linear_trend(ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b k over k = 0..n-1: (a, b, standard error of b; inf below 3 values)."""
    n = len(ys)
    ks = range(n)
    km = (n - 1) / 2
    ym = sum(ys) / n
    sxx = sum((k - km) ** 2 for k in ks)
    if sxx == 0:
        return ym, 0.0, math.inf
    b = sum((k - km) * (y - ym) for k, y in zip(ks, ys, strict=True)) / sxx
    a = ym - b * km
    if n < 3:
        return a, b, math.inf
    resid = sum((y - a - b * k) ** 2 for k, y in zip(ks, ys, strict=True))
    return a, b, math.sqrt(resid / (n - 2) / sxx)


def median_for_capped_mean(mean: float, sigma: float, cap: float) -> float:
    """The lognormal median whose capped mean is ``mean`` (tokens; bisection on the log scale)."""
    if mean >= cap:
        return float(cap)
    lo, hi = math.log(1e-3), math.log(cap) + 10 * max(sigma, 0.1)
    for _ in range(100):
        mid = (lo + hi) / 2
        if capped_lognormal_mean(math.exp(mid), sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
