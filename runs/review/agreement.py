"""Inter-rater agreement of reviewers on the same items, pure functions (no Django): percent
agreement, Cohen's kappa and Krippendorff's alpha, with seeded bootstrap intervals over items.

A reliability matrix has one row per reviewer and one column per item, None where a reviewer
gave no value. Alpha follows Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability"."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from typing import Literal

import krippendorff
import numpy as np
from scipy import sparse

from runs.statistics import RESAMPLES, SEED, bootstrap_rows_ci, kappa, kappa_rows, row_counts

Level = Literal["nominal", "ordinal", "interval"]


LEVELS: dict[str, Level] = {
    "boolean": "nominal",
    "categorical": "nominal",
    "string": "nominal",
    "integer": "ordinal",
    "number": "interval",
}


LIBRARY_MAX_CELLS = 4_000_000  # items x values^2 the krippendorff library may allocate


NO_PAIRS = "no item has two reviews"


NO_VARIATION = "every review of the items reviewed twice or more gave the same value"


Matrix = Sequence[Sequence[Hashable | None]]


def level_for(field_type: str) -> Level:
    """The level of measurement of a review field's type."""
    if field_type not in LEVELS:
        raise ValueError(f"no level of measurement for the field type {field_type!r}")
    return LEVELS[field_type]


def percent_agreement(units: Sequence[Sequence[Hashable]]) -> float | None:
    """Mean over the items with two values or more of the share of value pairs that are equal;
    None when no item has two values."""
    shares = []
    for values in units:
        m = len(values)
        if m >= 2:
            same = sum(a == b for a, b in itertools.combinations(values, 2))
            shares.append(same / (m * (m - 1) / 2))
    return sum(shares) / len(shares) if shares else None


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa (1960) of two raters' paired values, (p_o - p_e) / (1 - p_e). None when
    there are no pairs, or when p_e is 1, which happens only when both raters gave one and the
    same value throughout: kappa is then 0/0, and sklearn's cohen_kappa_score returns NaN (with
    an UndefinedMetricWarning) where we return None."""
    if len(a) != len(b):
        raise ValueError("kappa needs two equally long sequences")
    codes = _codebook([*a, *b])
    return kappa(
        np.array([codes[v] for v in a], dtype=int), np.array([codes[v] for v in b], dtype=int)
    )


def krippendorff_alpha(matrix: Matrix, level: Level, order: Sequence | None = None) -> float | None:
    """Krippendorff's alpha (Krippendorff 2011) of a reviewers x items matrix, by the
    krippendorff library. None when no item has two values or when those values never vary:
    the library then raises ValueError (one value in the whole matrix) or returns NaN (0/0)."""
    paired = _paired(_numbers(matrix, level, order))
    return _alpha(paired, np.unique(paired[~np.isnan(paired)]), level)


def agreement_report(
    matrix: Matrix,
    reviewers: list[str],
    level: Level,
    *,
    order: Sequence | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict:
    """Agreement of the reviewers (rows of matrix, named by reviewers) as a JSON-ready dict.
    Intervals: 95 % percentile bootstrap over the items reviewed twice or more, the same
    seeded resamples for every figure."""
    if len(reviewers) != len(matrix):
        raise ValueError("one reviewer name per row of the matrix")
    numbers = _numbers(matrix, level, order)
    paired = _paired(numbers)
    figures = _Figures(paired, resamples=resamples, seed=seed)
    return {
        "level": level,
        "items": paired.shape[1],
        "reviews": int((~np.isnan(numbers)).sum()),
        "percent_agreement": figures.percent_agreement(),
        "krippendorff_alpha": figures.alpha(level),
        "cohen_kappa": figures.kappa(),
        "pairs": _pairs(numbers, reviewers),
    }


class _Figures:
    """The report's figures over the items reviewed twice or more (columns of paired)."""

    def __init__(self, paired: np.ndarray, *, resamples: int, seed: int) -> None:
        self.paired = paired
        self.domain = np.unique(paired[~np.isnan(paired)])
        self.counts = _value_counts(paired, self.domain)  # items x values
        self.n = paired.shape[1]
        self.options = {"resamples": resamples, "seed": seed}

    def percent_agreement(self) -> dict:
        if self.n == 0:
            return _figure(None, None, NO_PAIRS)
        m = self.counts.sum(axis=1)
        shares = (self.counts.power(2).sum(axis=1) - m) / (m * (m - 1))
        ci = bootstrap_rows_ci(self.n, lambda rows: shares[rows].mean(axis=1), **self.options)
        return _figure(float(shares.mean()), ci, None)

    def alpha(self, level: Level) -> dict:
        value = _alpha(self.paired, self.domain, level)
        if value is None:
            return _figure(None, None, NO_PAIRS if self.n == 0 else NO_VARIATION)
        centred = self.domain - self.domain.mean()  # alpha is shift-free; this keeps precision

        def per_row(rows: np.ndarray) -> np.ndarray:
            # how many times each item appears in each resample
            return alpha_weighted(self.counts, centred, level, row_counts(rows, self.n))

        return _figure(value, bootstrap_rows_ci(self.n, per_row, **self.options), None)

    def kappa(self) -> dict | None:
        raters = ~np.isnan(self.paired).all(axis=1)
        if raters.sum() != 2:
            return None
        a, b = np.searchsorted(self.domain, self.paired[raters])
        value = kappa(a, b)
        if value is None:
            return _figure(None, None, NO_VARIATION)
        size = len(self.domain)
        ci = bootstrap_rows_ci(
            self.n, lambda rows: kappa_rows(a[rows], b[rows], size), **self.options
        )
        return _figure(value, ci, None)


def alpha_weighted(
    counts: sparse.csr_array, domain: np.ndarray, level: Level, weights: np.ndarray
) -> np.ndarray:
    """Krippendorff's alpha from the coincidences, once per row of weights (how many times each
    item counts, as in a bootstrap resample): alpha = 1 - (n - 1) D_o / D_e with D_o the
    within-item and D_e the pooled sum of pair distances (Krippendorff 2011). counts: items x
    values (sparse: free text has thousands of values), each item with two values or more;
    domain: the sorted values (numbers). NaN where the pooled values never vary."""
    m = counts.sum(axis=1)
    n = weights @ m
    sums = {"nominal": _nominal_sums, "ordinal": _ordinal_sums, "interval": _interval_sums}
    within, between = sums[level](counts, domain, weights, m, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(between > 0, 1 - (n - 1) * within / between, np.nan)


def _nominal_sums(counts, domain, weights, m, n) -> tuple[np.ndarray, np.ndarray]:
    """Within: the unequal pairs of each item over m - 1; between: the unequal pooled pairs."""
    pooled = (counts.T @ weights.T).T
    within = weights @ ((m**2 - counts.power(2).sum(axis=1)) / (m - 1))
    return within, n**2 - (pooled**2).sum(axis=1)


def _interval_sums(counts, domain, weights, m, n) -> tuple[np.ndarray, np.ndarray]:
    """Sums of squared differences from each item's (and the pool's) sum and sum of squares,
    so no values x values array is needed."""
    sums, squares = counts @ domain, counts @ domain**2
    within = weights @ (2 * (m * squares - sums**2) / (m - 1))
    return within, 2 * (n * (weights @ squares) - (weights @ sums) ** 2)


def _ordinal_sums(counts, domain, weights, m, n) -> tuple[np.ndarray, np.ndarray]:
    """The ordinal distance of two values is the squared difference of their mid-ranks in the
    pooled values, so: interval sums on mid-ranks, which differ from one resample to another."""
    pooled = (counts.T @ weights.T).T  # resamples x values
    ranks = np.cumsum(pooled, axis=1) - pooled / 2
    sums, squares = counts @ ranks.T, counts @ (ranks**2).T  # items x resamples
    within = (weights * (2 * (m[:, None] * squares - sums**2) / (m[:, None] - 1)).T).sum(axis=1)
    moments = (pooled * ranks).sum(axis=1), (pooled * ranks**2).sum(axis=1)
    return within, 2 * (n * moments[1] - moments[0] ** 2)


def _pairs(numbers: np.ndarray, reviewers: list[str]) -> list[dict]:
    """Per reviewer pair with an item in common: the items, percent agreement and kappa."""
    rows = []
    for i, j in itertools.combinations(range(len(reviewers)), 2):
        both = ~np.isnan(numbers[i]) & ~np.isnan(numbers[j])
        if both.any():
            a, b = numbers[i, both], numbers[j, both]
            codes = np.unique(np.concatenate([a, b]))
            rows.append(
                {
                    "a": reviewers[i],
                    "b": reviewers[j],
                    "items": int(both.sum()),
                    "percent_agreement": float((a == b).mean()),
                    "cohen_kappa": kappa(np.searchsorted(codes, a), np.searchsorted(codes, b)),
                }
            )
    return rows


def _numbers(matrix: Matrix, level: Level, order: Sequence | None) -> np.ndarray:
    """The matrix as floats, NaN where missing: nominal values become arbitrary codes, ordinal
    ones their position in order (or the number itself), interval ones the number."""
    if level == "nominal":
        codes = _codebook(v for row in matrix for v in row if not _missing(v))
    elif order is not None:
        codes = {value: position for position, value in enumerate(order)}
    else:
        codes = None
    rows = [[np.nan if _missing(v) else _number(v, codes) for v in row] for row in matrix]
    width = len(matrix[0]) if matrix else 0  # no reviewer yet: a 0 x 0 matrix, not an error
    return np.array(rows, dtype=float).reshape(len(matrix), width)


def _number(value: Hashable, codes: dict | None) -> float:
    if codes is None:
        return float(value)
    if value not in codes:
        raise ValueError(f"the value {value!r} is not one of the ordered choices")
    return float(codes[value])


def _codebook(values) -> dict:
    """A code per distinct value, in order of first appearance."""
    codes: dict = {}
    for value in values:
        codes.setdefault(value, len(codes))
    return codes


def _missing(value: Hashable | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _alpha(paired: np.ndarray, domain: np.ndarray, level: Level) -> float | None:
    """Alpha of the items reviewed twice or more (the others add no pair); None when their
    values never vary."""
    if len(domain) < 2:
        return None
    if paired.shape[1] * len(domain) ** 2 <= LIBRARY_MAX_CELLS:
        return float(krippendorff.alpha(reliability_data=paired, level_of_measurement=level))
    # The library holds an items x values x values array, too big for many distinct numbers:
    # the same alpha from the pooled sums (tests check the two agree).
    counts = _value_counts(paired, domain)
    weights = np.ones((1, paired.shape[1]))
    return float(alpha_weighted(counts, domain - domain.mean(), level, weights)[0])


def _paired(numbers: np.ndarray) -> np.ndarray:
    """The columns (items) with two values or more."""
    return numbers[:, (~np.isnan(numbers)).sum(axis=0) >= 2]


def _value_counts(paired: np.ndarray, domain: np.ndarray) -> sparse.csr_array:
    """items x values: how many reviewers gave each value to each item."""
    items, reviewers = np.nonzero(~np.isnan(paired.T))
    codes = np.searchsorted(domain, paired.T[items, reviewers])
    ones = np.ones(len(items))
    counts = sparse.csr_array((ones, (items, codes)), shape=(paired.shape[1], len(domain)))
    counts.sum_duplicates()  # one entry per item and value, so power(2) squares the count
    return counts


def _figure(value: float | None, ci: list[float] | None, reason: str | None) -> dict:
    return {"value": value, "ci": ci if value is not None else None, "reason": reason}
