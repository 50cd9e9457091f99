"""Small statistics: means with 95% confidence intervals (Student t)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)

# two-sided 97.5% quantiles of Student's t, df = 1..30
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        return float("nan")
    if df <= len(_T975):
        return _T975[df - 1]
    # within 0.0025 of the exact value for df > 30 (low up to df 80, then high by at most 1e-4: an
    # interval off by at most 0.1%); kept as it is, since every documented CI of more than 31 seeds used it
    return 1.96 + 2.4 / df


def mean_ci95(values: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Mean and its 95% confidence interval ``mean ± t·s/√n`` (a point for n < 2).

    Sums are exact (``math.fsum``), so the result does not depend on the order of ``values``:
    two tables that print one statistic from differently ordered records agree."""
    n = len(values)
    if n == 0:
        return float("nan"), (float("nan"), float("nan"))
    mean = math.fsum(values) / n
    if n < 2:
        return mean, (mean, mean)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t975(n - 1) * math.sqrt(var / n)
    return mean, (mean - half, mean + half)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals overlap."""
    return not (a[1] < b[0] or b[1] < a[0])


class PairedByUnit(NamedTuple):
    """:func:`paired_by_unit`'s result."""

    mean: float
    ci95: tuple[float, float]
    units: int
    up: int  # units whose d_u > 0
    down: int  # units whose d_u < 0


def paired_by_unit(treated: Sequence[Mapping[K, float]], control: Sequence[Mapping[K, float]]) -> PairedByUnit:
    """Paired difference by unit (e.g. an evaluation game) over runs (e.g. seeds).

    ``treated[k][u]`` and ``control[k][u]`` are unit ``u``'s outcome in run ``k``. For each unit
    in every run of both, ``d_u = mean_k(treated[k][u] - control[k][u])``; returns the mean of
    the ``d_u``, its 95% CI across units (:func:`mean_ci95`), the number of units and how many
    ``d_u`` are above and below 0 (a mean gain can rest on a few units). Where the CI across
    runs measures how a result varies with the runs' randomness, this one measures how it varies
    with which units were drawn."""
    if len(treated) != len(control) or not treated:
        raise ValueError(f"a paired difference needs as many treated as control runs, at least one "
                         f"(got {len(treated)} and {len(control)})")
    units = set.intersection(*(set(m) for m in [*treated, *control]))
    diffs = [math.fsum(t[u] - c[u] for t, c in zip(treated, control, strict=True)) / len(treated)
             for u in sorted(units, key=repr)]
    mean, ci = mean_ci95(diffs)
    return PairedByUnit(mean, ci, len(diffs), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))
