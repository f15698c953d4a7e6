"""Paired statistics, pure functions: bootstrap, sign test, McNemar, Wilson and paired-rate
intervals, and the verdict of a paired test."""

from __future__ import annotations

import math

import numpy as np

# The level, seed and Wilson interval are shared with the rest of runs (runs/statistics.py).
from runs.statistics import ALPHA, SEED, Z, wilson
from runs.statistics import LEVEL as LEVEL

RESAMPLES = 2000


EXACT_BELOW = 25  # McNemar: exact binomial on the discordant pairs below this many


MULTINOMIAL_MAX_DISTINCT = 64  # bootstrap over the distinct differences: exact and cheap
DISTINCT_PREFIX = 1024  # differences looked at before sorting them all to count distinct ones


BOOTSTRAP_MAX_DRAWS = (
    20_000_000  # resampled values; beyond, the normal limit (see paired_bootstrap)
)


TOLERANCE = 1e-9


def paired_bootstrap(diffs: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Mean of the paired differences and its 95 % percentile-bootstrap interval.

    The resampled means come from ``resamples`` resamples of the n differences, seeded. When
    the differences take few distinct values (binary rates, integer scores) a resample is a
    multinomial draw over those values, which is the same bootstrap at a fraction of the cost.
    Beyond ``BOOTSTRAP_MAX_DRAWS`` resampled values of a continuous metric (n > 10,000), the
    bootstrap distribution of a mean is normal to within O(1/sqrt(n)) and we use that limit:
    mean +- z * sd / sqrt(n), with the plug-in sd the bootstrap itself would use.
    """
    n = len(diffs)
    if n == 0:
        return {"mean": None, "ci": None, "method": "bootstrap", "resamples": 0}
    mean = float(diffs.mean())
    # More distinct values in a prefix than the multinomial takes: no need to sort them all.
    distinct = len(np.unique(np.round(diffs[:DISTINCT_PREFIX], 12)))
    if distinct <= MULTINOMIAL_MAX_DISTINCT:
        values, counts = np.unique(np.round(diffs, 12), return_counts=True)
        distinct = len(values)
    rng = np.random.default_rng(seed)
    if distinct == 1:
        return {"mean": mean, "ci": [mean, mean], "method": "bootstrap", "resamples": resamples}
    if distinct <= MULTINOMIAL_MAX_DISTINCT:
        means = rng.multinomial(n, counts / n, size=resamples) @ values / n
    elif n * resamples <= BOOTSTRAP_MAX_DRAWS:
        chunk = max(1, 2_000_000 // n)
        means = np.concatenate(
            [
                diffs[rng.integers(0, n, size=(min(chunk, resamples - i), n))].mean(axis=1)
                for i in range(0, resamples, chunk)
            ]
        )
    else:
        half = Z * float(diffs.std()) / math.sqrt(n)
        return {"mean": mean, "ci": [mean - half, mean + half], "method": "normal", "resamples": 0}
    low, high = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    return {
        "mean": mean,
        "ci": [float(low), float(high)],
        "method": "bootstrap",
        "resamples": resamples,
    }


def binomial_two_sided(k: int, n: int) -> float:
    """Exact two-sided p-value of k (or fewer) successes out of n at p = 1/2."""
    if n == 0:
        return 1.0
    k = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def sign_test(diffs: np.ndarray) -> dict:
    """Two-sided sign test on the non-zero differences (exact up to 1,000, then normal with a
    continuity correction)."""
    up = int((diffs > TOLERANCE).sum())
    down = int((diffs < -TOLERANCE).sum())
    n = up + down
    if n <= 1000:
        p = binomial_two_sided(min(up, down), n)
    else:
        p = math.erfc(max(abs(up - down) - 1, 0) / math.sqrt(n) / math.sqrt(2))
    return {"up": up, "down": down, "p_value": p}


def mcnemar(b: int, c: int) -> dict:
    """McNemar's test on the discordant pairs: b = true -> false, c = false -> true. Exact
    binomial below 25 discordant pairs, else chi-square (1 df) with continuity correction."""
    n = b + c
    if n < EXACT_BELOW:
        return {"p_value": binomial_two_sided(min(b, c), n), "method": "exact binomial"}
    statistic = max(abs(b - c) - 1, 0) ** 2 / n
    return {
        "p_value": math.erfc(math.sqrt(statistic / 2)),
        "statistic": statistic,
        "method": "chi-square, continuity-corrected",
    }


def paired_rate_ci(a: int, b: int, c: int, d: int) -> list[float] | None:
    """95 % interval of (candidate rate - baseline rate) for paired binary outcomes: Newcombe's
    square-and-add interval from two Wilson intervals, with the correlation of the pairs
    (Newcombe 1998, method 10). a: true in both, b: true -> false, c: false -> true, d: false in
    both."""
    n = a + b + c + d
    if n == 0:
        return None
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n)
    l2, u2 = wilson(a + c, n)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)
    diff = p2 - p1
    below = math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1), 0))
    above = math.sqrt(max((u2 - p2) ** 2 + (p1 - l1) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1), 0))
    return [max(-1.0, diff - below), min(1.0, diff + above)]


def paired_test(
    baseline: np.ndarray, candidate: np.ndarray, *, binary: bool, higher_is_better: bool = True
) -> dict:
    """The paired test of one metric between two runs over the pairs both valued."""
    if binary:
        base, cand = baseline.astype(bool), candidate.astype(bool)
        a = int((base & cand).sum())
        b = int((base & ~cand).sum())
        c = int((~base & cand).sum())
        d = int((~base & ~cand).sum())
        n = a + b + c + d
        test = mcnemar(b, c)
        result = {
            "test": "mcnemar",
            "method": test["method"],
            "n": n,
            "difference": (c - b) / n if n else None,
            "ci": paired_rate_ci(a, b, c, d),
            "p_value": test["p_value"],
            "table": {"both_true": a, "true_to_false": b, "false_to_true": c, "both_false": d},
        }
        significant = test["p_value"] < ALPHA and b != c
        sign = (c > b) - (c < b)
    else:
        diffs = candidate - baseline
        boot = paired_bootstrap(diffs)
        signs = sign_test(diffs)
        result = {
            "test": "paired bootstrap",
            "method": boot["method"],
            "resamples": boot["resamples"],
            "n": len(diffs),
            "difference": boot["mean"],
            "ci": boot["ci"],
            "p_value": signs["p_value"],
            "sign_test": signs,
        }
        ci = boot["ci"]
        significant = ci is not None and (ci[0] > 0 or ci[1] < 0)
        sign = 0 if ci is None else (ci[0] > 0) - (ci[1] < 0)
    if not higher_is_better:
        sign = -sign
    result["verdict"] = (
        "inconclusive" if not significant or sign == 0 else ("better" if sign > 0 else "worse")
    )
    return result
