"""How reliable an evaluator is against gold labels, pure functions (no Django): confusion
figures, correlations, agreement with the gold, consistency across repeats, and pass rates
corrected for the evaluator's errors (Rogan & Gladen 1978).

Every figure is {"value": float | None, "ci": [low, high] | None}: a 95 % interval (Wilson for
proportions, Fisher z for correlations, a seeded percentile bootstrap over items otherwise), and
None where the figure is undefined."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence

import numpy as np
from scipy import stats

from runs.statistics import (
    RESAMPLES,
    SEED,
    Z,
    bootstrap_rows_ci,
    kappa,
    kappa_rows,
    percentile_ci,
    wilson,
)

NO_BETTER_THAN_CHANCE = "the evaluator is no better than chance on the gold items"


MAX_DROPPED = 0.05  # share of Monte Carlo draws without Se + Sp > 1 that we let pass unsaid


def binary_record(
    pred: Sequence[bool], gold: Sequence[bool], *, resamples: int = RESAMPLES, seed: int = SEED
) -> dict:
    """Confusion of pass/fail verdicts against the gold: accuracy, precision, recall and
    specificity with Wilson intervals; F1 and Cohen's kappa with bootstrap intervals."""
    p, g = _paired(pred, gold, bool)
    cells = {"tp": p & g, "fp": p & ~g, "fn": ~p & g, "tn": ~p & ~g}
    tp, fp, fn, tn = (int(cells[k].sum()) for k in ("tp", "fp", "fn", "tn"))
    options = {"resamples": resamples, "seed": seed}
    wrong = p != g

    def f1(rows: np.ndarray) -> np.ndarray:
        hits, misses = cells["tp"][rows].sum(axis=1), wrong[rows].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 2 * hits / (2 * hits + misses)

    whole = np.arange(len(p))[None, :]  # the sample itself, as one "resample"
    return {
        "type": "binary",
        "n": len(p),
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "accuracy": _proportion(tp + tn, len(p)),
        "precision": _proportion(tp, tp + fp),
        "recall": _proportion(tp, tp + fn),
        "specificity": _proportion(tn, tn + fp),
        "f1": _figure(f1(whole)[0], bootstrap_rows_ci(len(p), f1, **options)),
        "kappa": _kappa_figure(p.astype(int), g.astype(int), 2, options),
    }


def numeric_record(
    pred: Sequence[float], gold: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED
) -> dict:
    """Scores against gold scores: Pearson's r (Fisher z interval), Spearman's rho (Fisher z
    with the Bonett & Wright 2000 standard error sqrt((1 + rho^2 / 2) / (n - 3))), and the mean
    absolute error (bootstrap interval). Correlations need n >= 3 and variance in both; their
    interval needs n >= 4."""
    x, y = _paired(pred, gold, float)
    n = len(x)
    varies = n >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0
    pearson = float(stats.pearsonr(x, y).statistic) if varies else None
    spearman = float(stats.spearmanr(x, y).statistic) if varies else None
    errors = np.abs(x - y)
    mae_ci = bootstrap_rows_ci(
        n, lambda rows: errors[rows].mean(axis=1), resamples=resamples, seed=seed
    )
    return {
        "type": "numeric",
        "n": n,
        "pearson": _figure(pearson, _fisher_ci(pearson, n, 1.0)),
        "spearman": _figure(spearman, _fisher_ci(spearman, n, 1 + (spearman or 0) ** 2 / 2)),
        "mae": _figure(float(errors.mean()) if n else None, mae_ci),
    }


def categorical_record(
    pred: Sequence[Hashable],
    gold: Sequence[Hashable],
    labels: list[str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict:
    """Choices against gold choices: the confusion matrix (rows gold, columns predicted, in the
    order of labels, then of any value seen but not listed), accuracy (Wilson) and Cohen's
    kappa (bootstrap)."""
    if len(pred) != len(gold):
        raise ValueError("pred and gold must be equally long")
    order: dict = {}
    for value in [*labels, *gold, *pred]:
        order.setdefault(value, len(order))
    p = np.array([order[v] for v in pred], dtype=int)
    g = np.array([order[v] for v in gold], dtype=int)
    size = len(order)
    confusion = np.bincount(g * size + p, minlength=size * size).reshape(size, size)
    return {
        "type": "categorical",
        "n": len(p),
        "labels": list(order),
        "confusion": confusion.tolist(),
        "accuracy": _proportion(int((p == g).sum()), len(p)),
        "kappa": _kappa_figure(p, g, size, {"resamples": resamples, "seed": seed}),
    }


def consistency(
    groups: Sequence[Sequence[Hashable]], *, resamples: int = RESAMPLES, seed: int = SEED
) -> dict:
    """How steady one revision's verdicts are on the same item across repeats (None verdicts
    left out), over the items with two verdicts or more: the share of items whose verdicts are
    all equal (Wilson), and the share of consecutive verdict pairs that differ (bootstrap over
    items, since an item's pairs are not independent)."""
    verdicts = [[v for v in group if v is not None] for group in groups]
    verdicts = [group for group in verdicts if len(group) >= 2]
    stable = sum(all(v == group[0] for v in group) for group in verdicts)
    flips = np.array([sum(a != b for a, b in itertools.pairwise(g)) for g in verdicts])
    pairs = np.array([len(group) - 1 for group in verdicts])

    def flip_rate(rows: np.ndarray) -> np.ndarray:
        return flips[rows].sum(axis=1) / pairs[rows].sum(axis=1)

    rate = float(flips.sum() / pairs.sum()) if verdicts else None
    return {
        "items": len(verdicts),
        "stable": _proportion(stable, len(verdicts)),
        "flip_rate": _figure(
            rate, bootstrap_rows_ci(len(verdicts), flip_rate, resamples=resamples, seed=seed)
        ),
    }


def rogan_gladen(
    passed: int, n: int, confusion: dict, *, draws: int = 4000, seed: int = SEED
) -> dict:
    """The pass rate corrected for the evaluator's errors (Rogan & Gladen 1978):
    pi = (p + Sp - 1) / (Se + Sp - 1), clipped to [0, 1], with p the observed pass rate and
    Se = tp / (tp + fn), Sp = tn / (tn + fp) from the evaluator's record on gold items. The
    interval carries the record's uncertainty too: Monte Carlo over Jeffreys posteriors
    p ~ Beta(passed + 1/2, n - passed + 1/2), Se ~ Beta(tp + 1/2, fn + 1/2),
    Sp ~ Beta(tn + 1/2, fp + 1/2), dropping draws with Se + Sp <= 1; seeded."""
    tp, fp, fn, tn = (int(confusion[k]) for k in ("tp", "fp", "fn", "tn"))
    result = {
        "value": None,
        "ci": None,
        "observed": _proportion(passed, n),
        "sensitivity": _proportion(tp, tp + fn),
        "specificity": _proportion(tn, tn + fp),
        "identifiable": False,
        "reason": _unidentifiable(n, tp + fn, tn + fp),
    }
    if result["reason"]:
        return result
    youden = tp / (tp + fn) + tn / (tn + fp) - 1
    if youden <= 0:
        return {**result, "reason": NO_BETTER_THAN_CHANCE}
    value = min(max((passed / n + tn / (tn + fp) - 1) / youden, 0.0), 1.0)
    ci, dropped = _rogan_gladen_draws(passed, n, (tp, fp, fn, tn), draws, seed)
    reason = None
    if dropped > MAX_DROPPED:
        reason = f"{dropped:.0%} of the draws had Se + Sp <= 1 and were left out of the interval"
    return {**result, "value": value, "ci": ci, "identifiable": True, "reason": reason}


def _rogan_gladen_draws(
    passed: int, n: int, cells: tuple[int, int, int, int], draws: int, seed: int
) -> tuple[list[float] | None, float]:
    """The corrected rate's 95 % interval from the draws, and the share of draws dropped."""
    tp, fp, fn, tn = cells
    rng = np.random.default_rng(seed)
    p = rng.beta(passed + 0.5, n - passed + 0.5, draws)
    se = rng.beta(tp + 0.5, fn + 0.5, draws)
    sp = rng.beta(tn + 0.5, fp + 0.5, draws)
    youden = se + sp - 1
    keep = youden > 0
    rates = np.clip((p[keep] + sp[keep] - 1) / youden[keep], 0.0, 1.0)
    return percentile_ci(rates), 1 - keep.mean()


def _unidentifiable(n: int, positives: int, negatives: int) -> str | None:
    if n == 0:
        return "no verdicts to correct"
    if positives == 0 or negatives == 0:
        return "the gold items need both passing and failing examples"
    return None


def _paired(pred: Sequence, gold: Sequence, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    if len(pred) != len(gold):
        raise ValueError("pred and gold must be equally long")
    return np.asarray(pred, dtype=dtype), np.asarray(gold, dtype=dtype)


def _kappa_figure(pred: np.ndarray, gold: np.ndarray, size: int, options: dict) -> dict:
    def per_row(rows: np.ndarray) -> np.ndarray:
        return kappa_rows(pred[rows], gold[rows], size)

    return _figure(kappa(pred, gold), bootstrap_rows_ci(len(pred), per_row, **options))


def _fisher_ci(r: float | None, n: int, variance: float) -> list[float] | None:
    """tanh(atanh(r) +- z * se), se = sqrt(variance / (n - 3)); a perfect r stays put."""
    if r is None or n <= 3:
        return None
    if abs(r) >= 1:
        return [r, r]
    z, se = math.atanh(r), math.sqrt(variance / (n - 3))
    return [math.tanh(z - Z * se), math.tanh(z + Z * se)]


def _proportion(successes: int, total: int) -> dict:
    if total == 0:
        return _figure(None, None)
    return _figure(successes / total, list(wilson(successes, total)))


def _figure(value: float | None, ci: list[float] | None) -> dict:
    """A figure with plain floats; NaN (undefined) becomes None."""
    if value is None or not math.isfinite(value):
        return {"value": None, "ci": None}
    return {"value": float(value), "ci": ci}
