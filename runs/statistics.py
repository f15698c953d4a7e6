"""Statistics every feature of runs shares, as pure functions over numbers and numpy arrays (no
Django): the Wilson interval of a proportion, Cohen's kappa on integer codes, and a seeded
percentile bootstrap over items. One level and one seed for every interval, so the same data
always give the same intervals."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from statistics import NormalDist

import numpy as np

LEVEL = 0.95


ALPHA = 1 - LEVEL


Z = NormalDist().inv_cdf(1 - ALPHA / 2)


SEED = 20240917  # fixed: the same data always give the same intervals


RESAMPLES = 1000


CHUNK = 2_000_000  # resampled indices held in memory at once


def wilson(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of successes / n (Wilson 1927); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + Z**2 / n
    centre = (p + Z**2 / (2 * n)) / denominator
    half = Z * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n * n)) / denominator
    return centre - half, centre + half


def row_counts(codes: np.ndarray, categories: int) -> np.ndarray:
    """How often each code 0..categories-1 occurs in each row of a 2-D array of codes."""
    rows = codes.shape[0]
    offsets = codes + categories * np.arange(rows)[:, None]
    return np.bincount(offsets.ravel(), minlength=rows * categories).reshape(rows, categories)


def kappa_rows(a: np.ndarray, b: np.ndarray, categories: int) -> np.ndarray:
    """Cohen's kappa (1960) of each row pair of two 2-D arrays of codes 0..categories-1: NaN
    where the expected agreement is 1 (both raters used one and the same code), as sklearn."""
    n = a.shape[1]
    observed = (a == b).mean(axis=1)
    expected = (row_counts(a, categories) * row_counts(b, categories)).sum(axis=1) / n**2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(expected < 1, (observed - expected) / (1 - expected), np.nan)


def kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's kappa of two equally long arrays of integer codes; None when empty or undefined."""
    if len(a) == 0:
        return None
    value = kappa_rows(a[None, :], b[None, :], int(max(a.max(), b.max())) + 1)[0]
    return float(value) if math.isfinite(value) else None


def resample_chunks(
    n_items: int, *, resamples: int = RESAMPLES, seed: int = SEED
) -> Iterator[np.ndarray]:
    """The bootstrap resamples of n_items items, as 2-D arrays of item indices (one row a
    resample), a few rows at a time so that large sets stay within memory."""
    rng = np.random.default_rng(seed)
    rows = max(1, CHUNK // max(n_items, 1))
    for start in range(0, resamples, rows):
        yield rng.integers(0, n_items, size=(min(rows, resamples - start), n_items))


def percentile_ci(values: np.ndarray) -> list[float] | None:
    """The 2.5 and 97.5 percentiles of the finite values, or None when there are none."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return None
    low, high = np.quantile(values, [ALPHA / 2, 1 - ALPHA / 2])
    return [float(low), float(high)]


def bootstrap_rows_ci(
    n_items: int,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[float] | None:
    """Percentile bootstrap over items with a vectorised statistic: it takes a 2-D array of
    item indices (one row a resample) and returns one value per row, NaN where undefined."""
    if n_items == 0 or resamples == 0:
        return None
    chunks = resample_chunks(n_items, resamples=resamples, seed=seed)
    return percentile_ci(np.concatenate([statistic(chunk) for chunk in chunks]))


def bootstrap_ci(
    n_items: int,
    statistic: Callable[[np.ndarray], float | None],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[float] | None:
    """95 % percentile bootstrap over items: statistic takes the item indices of one resample
    (drawn with replacement, seeded) and returns a value or None; the interval is the 2.5 and
    97.5 percentiles of the finite values (Efron & Tibshirani 1993). Same resamples as
    bootstrap_rows_ci for the same n_items and seed."""

    def per_row(chunk: np.ndarray) -> np.ndarray:
        values = (statistic(row) for row in chunk)
        return np.array([np.nan if v is None else v for v in values], dtype=float)

    return bootstrap_rows_ci(n_items, per_row, resamples=resamples, seed=seed)
