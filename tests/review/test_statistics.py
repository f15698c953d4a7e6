"""The pure statistics of annotation agreement and evaluator reliability, checked against
published values, hand computations, scipy, sklearn and the krippendorff library (no database)."""

import json
import math
import time

import krippendorff
import numpy as np
import pytest
from scipy import stats
from sklearn import metrics

from runs.compare import stats as compare_stats
from runs.review import agreement, measures
from runs.review.agreement import (
    agreement_report,
    cohen_kappa,
    krippendorff_alpha,
    level_for,
    percent_agreement,
)
from runs.statistics import SEED, Z, bootstrap_ci, bootstrap_rows_ci, resample_chunks, wilson

EXACT = 1e-9

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers
# x 12 units with missing values.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]

OTHER_MATRICES = [
    # 3 reviewers, binary labels, some missing
    [[1, 0, 1, 1, None, 0, 1, 0], [1, 0, 0, 1, 1, None, 1, 0], [None, 0, 1, 1, 1, 0, 0, 0]],
    # 2 reviewers on a 1-5 scale
    [[1, 2, 3, 4, 5, 3, 2, 4, 1, 5], [1, 3, 3, 4, 4, 3, 1, 5, 2, 5]],
    # the krippendorff library's own doctest matrix (many missing reviews)
    [
        [None, None, None, None, None, 3, 4, 1, 2, 1, 1, 3, 3, None, 3],
        [1, None, 2, 1, 3, 3, 4, 3, None, None, None, None, None, None, None],
        [None, None, 2, 1, 3, 4, 4, None, 2, 1, 1, 3, 3, None, 4],
    ],
    # 5 reviewers, sparse
    [
        [0.5, 1.5, None, 2.0, 3.5, None],
        [0.7, None, 2.5, 2.0, 3.0, 1.0],
        [None, 1.0, 2.5, None, 3.5, 1.5],
        [0.5, 1.5, 3.0, 2.5, None, None],
        [None, None, None, 2.0, 4.0, 1.0],
    ],
]

LEVELS = ["nominal", "ordinal", "interval"]


def library_alpha(matrix, level):
    data = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    return krippendorff.alpha(reliability_data=data, level_of_measurement=level)


# --- runs.statistics --------------------------------------------------------------------------


def test_wilson_matches_newcombe_1998_and_scipy():
    # Newcombe (1998), Table I: 81/263 -> 0.2553 to 0.3662; 0/20 -> 0 to 0.1611.
    assert [round(x, 4) for x in wilson(81, 263)] == [0.2553, 0.3662]
    assert round(wilson(0, 20)[1], 4) == 0.1611
    for k, n in [(81, 263), (0, 20), (15, 148), (1, 29), (10, 10)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=EXACT)


def test_compare_stats_keeps_using_the_shared_wilson_and_seed():
    assert compare_stats.wilson is wilson
    assert compare_stats.SEED == SEED == 20240917
    assert compare_stats.paired_rate_ci(5, 0, 0, 5) is not None


def test_bootstrap_ci_is_seeded_and_the_same_as_its_vectorised_twin():
    values = np.array([0.1, 0.4, 0.35, 0.8, 0.2, 0.9, 0.5])
    one = bootstrap_ci(len(values), lambda rows: float(values[rows].mean()))
    rows = bootstrap_rows_ci(len(values), lambda rows: values[rows].mean(axis=1))
    assert one == rows == bootstrap_ci(len(values), lambda rows: float(values[rows].mean()))
    assert one != bootstrap_ci(len(values), lambda rows: float(values[rows].mean()), seed=1)
    assert one[0] < values.mean() < one[1]


def test_bootstrap_ci_leaves_out_undefined_resamples_and_is_none_without_items():
    assert bootstrap_ci(0, lambda rows: 1.0) is None
    assert bootstrap_ci(5, lambda rows: None) is None
    assert bootstrap_ci(5, lambda rows: 1.0 if rows[0] % 2 else None) == [1.0, 1.0]


def test_resamples_come_in_chunks_that_add_up_to_the_same_draws():
    chunks = list(resample_chunks(3, resamples=10, seed=SEED))
    assert sum(len(chunk) for chunk in chunks) == 10
    assert all(chunk.shape[1] == 3 and chunk.max() < 3 for chunk in chunks)


# --- Cohen's kappa -----------------------------------------------------------------------------


KAPPA_SETS = {
    "binary": ([1, 1, 0, 0, 1, 0, 1, 1, 0, 1], [1, 0, 0, 0, 1, 1, 1, 1, 0, 1]),
    "three_categories": (
        ["neg", "pos", "neg", "neu", "pos", "neu", "neu", "pos", "neg", "neg"],
        ["neg", "pos", "neg", "neu", "neg", "neu", "pos", "pos", "neu", "neg"],
    ),
    "perfect_agreement": (["a", "b", "c", "a", "b"], ["a", "b", "c", "a", "b"]),
    "chance_level": ([1, 1, 0, 0], [1, 0, 1, 0]),
    "booleans": ([True, False, True, True], [True, False, False, True]),
}


@pytest.mark.parametrize("name", KAPPA_SETS)
def test_cohen_kappa_matches_sklearn(name):
    a, b = KAPPA_SETS[name]
    assert cohen_kappa(a, b) == pytest.approx(metrics.cohen_kappa_score(a, b), abs=EXACT)


def test_cohen_kappa_matches_sklearn_on_three_categories():
    a, b = KAPPA_SETS["three_categories"]
    assert cohen_kappa(a, b) == pytest.approx(metrics.cohen_kappa_score(a, b), abs=EXACT)


def test_cohen_kappa_is_one_on_perfect_agreement_and_zero_at_chance_level():
    assert cohen_kappa(*KAPPA_SETS["perfect_agreement"]) == pytest.approx(1.0, abs=EXACT)
    assert cohen_kappa(*KAPPA_SETS["chance_level"]) == pytest.approx(0.0, abs=EXACT)


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_cohen_kappa_is_none_where_sklearn_says_undefined():
    # Both raters gave one and the same value: expected agreement 1, kappa 0/0.
    with pytest.warns(metrics._classification.UndefinedMetricWarning):
        assert math.isnan(metrics.cohen_kappa_score(["x", "x"], ["x", "x"]))
    assert cohen_kappa(["x", "x"], ["x", "x"]) is None
    assert cohen_kappa([], []) is None


# --- Krippendorff's alpha ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "published"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)]
)
def test_krippendorff_alpha_matches_the_published_example_of_krippendorff_2011(level, published):
    value = krippendorff_alpha(KRIPPENDORFF_2011, level)
    assert round(value, 3) == published
    assert value == pytest.approx(library_alpha(KRIPPENDORFF_2011, level), abs=EXACT)


def test_krippendorff_alpha_nominal_is_the_exact_fraction_of_the_worked_example():
    # n = 40 pairable values (n_1..n_5 = 9, 13, 10, 5, 3), 8 off-diagonal coincidences:
    # 1 - (n - 1) * 8 / (n^2 - sum n_c^2) = 1 - 39 * 8 / 1216 = 113/152.
    assert krippendorff_alpha(KRIPPENDORFF_2011, "nominal") == pytest.approx(113 / 152, abs=EXACT)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("index", range(len(OTHER_MATRICES)))
def test_krippendorff_alpha_matches_the_library_with_missing_reviews(index, level):
    matrix = OTHER_MATRICES[index]
    assert krippendorff_alpha(matrix, level) == pytest.approx(
        library_alpha(matrix, level), abs=EXACT
    )


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("index", range(len(OTHER_MATRICES)))
def test_hand_written_alpha_matches_the_library_on_many_values(index, level, monkeypatch):
    # The hand-written path is the one taken when the library's items x values^2 array is big.
    monkeypatch.setattr(agreement, "LIBRARY_MAX_CELLS", 0)
    for matrix in (OTHER_MATRICES[index], KRIPPENDORFF_2011):
        assert krippendorff_alpha(matrix, level) == pytest.approx(
            library_alpha(matrix, level), abs=EXACT
        )


@pytest.mark.parametrize("level", LEVELS)
def test_hand_written_alpha_matches_the_library_on_resampled_items(level):
    data = np.array(
        [[np.nan if v is None else v for v in row] for row in KRIPPENDORFF_2011], dtype=float
    )
    paired = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    domain = np.unique(paired[~np.isnan(paired)])
    counts = agreement._value_counts(paired, domain)
    rng = np.random.default_rng(7)
    for _ in range(20):
        rows = rng.integers(0, paired.shape[1], size=paired.shape[1])
        weights = np.bincount(rows, minlength=paired.shape[1])[None, :]
        ours = agreement.alpha_weighted(counts, domain, level, weights)[0]
        resampled = paired[:, rows]
        if len(np.unique(resampled[~np.isnan(resampled)])) < 2:
            assert math.isnan(ours)
            continue
        theirs = krippendorff.alpha(reliability_data=resampled, level_of_measurement=level)
        assert ours == pytest.approx(theirs, abs=EXACT)


def test_krippendorff_alpha_of_ordered_choices_is_the_alpha_of_their_positions():
    order = ["bad", "poor", "fair", "good", "great"]
    words = [[None if v is None else order[v - 1] for v in row] for row in KRIPPENDORFF_2011]
    assert krippendorff_alpha(words, "ordinal", order) == pytest.approx(
        library_alpha(KRIPPENDORFF_2011, "ordinal"), abs=EXACT
    )
    with pytest.raises(ValueError, match="not one of the ordered choices"):
        krippendorff_alpha([["bad", "meh"], ["bad", "bad"]], "ordinal", order)


def test_krippendorff_alpha_is_none_without_pairs_or_without_variation():
    assert krippendorff_alpha([[1, None], [None, 2]], "nominal") is None
    assert krippendorff_alpha([["yes", "yes"], ["yes", "yes", "no"][:2]], "nominal") is None
    # A value given only where nobody else reviewed adds no variation either.
    assert krippendorff_alpha([[1, 1, 2], [1, 1, None]], "interval") is None
    # What the library does there: it raises on a single value in the whole matrix.
    with pytest.raises(ValueError, match="more than one value"):
        krippendorff.alpha(
            reliability_data=[[1.0, 1.0], [1.0, 1.0]], level_of_measurement="nominal"
        )


def test_level_for_maps_field_types_to_levels_of_measurement():
    assert [level_for(t) for t in ("boolean", "categorical", "string", "integer", "number")] == [
        "nominal",
        "nominal",
        "nominal",
        "ordinal",
        "interval",
    ]
    with pytest.raises(ValueError):
        level_for("object")


# --- percent agreement and the report ---------------------------------------------------------


def test_percent_agreement_on_a_hand_computed_example_with_missing_reviews():
    # items: 3 of 3 pairs agree, 0 of 1, 1 of 3; the last item has one review and no pair.
    units = [[1, 1, 1], [1, 2], [2, 2, 3], [3]]
    assert percent_agreement(units) == pytest.approx((1 + 0 + 1 / 3) / 3, abs=EXACT)
    assert percent_agreement([[1], []]) is None
    matrix = [[1, 1, 2, 3], [1, 2, 2, None], [1, None, 3, None]]
    report = agreement_report(matrix, ["ann", "bob", "cy"], "nominal")
    assert report["percent_agreement"]["value"] == pytest.approx(4 / 9, abs=EXACT)


def test_agreement_report_is_deterministic_for_a_seed():
    reviewers = ["a", "b", "c", "d"]
    first = agreement_report(KRIPPENDORFF_2011, reviewers, "ordinal", resamples=300)
    again = agreement_report(KRIPPENDORFF_2011, reviewers, "ordinal", resamples=300)
    other = agreement_report(KRIPPENDORFF_2011, reviewers, "ordinal", resamples=300, seed=1)
    assert first == again
    assert first["krippendorff_alpha"]["ci"] != other["krippendorff_alpha"]["ci"]
    assert json.loads(json.dumps(first)) == first


def test_agreement_report_alpha_interval_is_the_library_alpha_over_the_same_resamples():
    report = agreement_report(KRIPPENDORFF_2011, list("abcd"), "interval", resamples=200)
    data = np.array(
        [[np.nan if v is None else v for v in row] for row in KRIPPENDORFF_2011], dtype=float
    )
    paired = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    alphas = [
        krippendorff.alpha(reliability_data=paired[:, rows], level_of_measurement="interval")
        for chunk in resample_chunks(paired.shape[1], resamples=200, seed=SEED)
        for rows in chunk
    ]
    expected = np.quantile(alphas, [0.025, 0.975])
    assert report["krippendorff_alpha"]["ci"] == pytest.approx(list(expected), abs=EXACT)


def test_agreement_report_counts_items_reviews_and_tables_every_pair():
    matrix = [["y", "n", "y", None], ["y", "y", None, "n"], [None, "n", "y", None]]
    report = agreement_report(matrix, ["ann", "bob", "cy"], "nominal")
    assert (report["level"], report["items"], report["reviews"]) == ("nominal", 3, 8)
    assert report["cohen_kappa"] is None  # three reviewers share items
    assert report["pairs"] == [
        {"a": "ann", "b": "bob", "items": 2, "percent_agreement": 0.5, "cohen_kappa": 0.0},
        {"a": "ann", "b": "cy", "items": 2, "percent_agreement": 1.0, "cohen_kappa": 1.0},
        {"a": "bob", "b": "cy", "items": 1, "percent_agreement": 0.0, "cohen_kappa": 0.0},
    ]
    assert report["pairs"][0]["cohen_kappa"] == metrics.cohen_kappa_score(["y", "n"], ["y", "y"])
    # one common item, the same value: agreement 1, kappa undefined
    single = agreement_report([["y", "n"], ["y", None]], ["ann", "bob"], "nominal")["pairs"]
    assert single == [
        {"a": "ann", "b": "bob", "items": 1, "percent_agreement": 1.0, "cohen_kappa": None}
    ]


def test_agreement_report_gives_kappa_with_an_interval_for_two_reviewers():
    a, b = KAPPA_SETS["three_categories"]
    report = agreement_report([a, b, [None] * len(a)], ["ann", "bob", "cy"], "nominal")
    kappa = report["cohen_kappa"]
    assert kappa["value"] == pytest.approx(metrics.cohen_kappa_score(a, b), abs=EXACT)
    assert kappa["ci"][0] < kappa["value"] < kappa["ci"][1]
    assert report["pairs"][0]["cohen_kappa"] == pytest.approx(kappa["value"], abs=EXACT)


def test_agreement_report_says_why_a_figure_is_undefined():
    lonely = agreement_report([[1, None], [None, 2]], ["a", "b"], "nominal")
    assert lonely["items"] == 0 and lonely["pairs"] == []
    assert lonely["percent_agreement"] == {"value": None, "ci": None, "reason": agreement.NO_PAIRS}
    same = agreement_report([["x", "x"], ["x", "x"]], ["a", "b"], "nominal")
    assert same["percent_agreement"]["value"] == 1.0
    assert same["krippendorff_alpha"]["reason"] == agreement.NO_VARIATION
    assert same["cohen_kappa"]["value"] is None


def test_agreement_report_on_a_thousand_items_and_three_reviewers_is_fast():
    rng = np.random.default_rng(0)
    truth = rng.integers(1, 6, 1000)
    matrix = [[int(min(5, max(1, t + rng.integers(-1, 2)))) for t in truth] for _ in range(3)]
    for level in LEVELS:
        start = time.perf_counter()
        report = agreement_report(matrix, ["a", "b", "c"], level, resamples=1000)
        assert time.perf_counter() - start < 3
        assert report["krippendorff_alpha"]["ci"] is not None


# --- an evaluator's reliability against the gold ----------------------------------------------

PRED = [True, True, False, False, True, False, True, True, False, True, False, True]
GOLD = [True, False, False, True, True, False, True, True, False, False, False, True]


def test_binary_record_matches_sklearn():
    record = measures.binary_record(PRED, GOLD)
    tn, fp, fn, tp = metrics.confusion_matrix(GOLD, PRED).ravel()
    assert record["confusion"] == {"tp": tp, "fp": fp, "fn": fn, "tn": tn}
    assert record["n"] == len(PRED)
    expected = {
        "accuracy": metrics.accuracy_score(GOLD, PRED),
        "precision": metrics.precision_score(GOLD, PRED),
        "recall": metrics.recall_score(GOLD, PRED),
        "specificity": metrics.recall_score(GOLD, PRED, pos_label=False),
        "f1": metrics.f1_score(GOLD, PRED),
        "kappa": metrics.cohen_kappa_score(GOLD, PRED),
    }
    for name, value in expected.items():
        assert record[name]["value"] == pytest.approx(value, abs=EXACT), name
    assert record["precision"]["ci"] == pytest.approx(list(wilson(int(tp), int(tp + fp))))
    assert record["f1"]["ci"][0] <= record["f1"]["value"] <= record["f1"]["ci"][1]


def test_binary_record_leaves_undefined_figures_empty():
    record = measures.binary_record([False, False], [False, False])
    assert record["precision"] == record["recall"] == {"value": None, "ci": None}
    assert record["specificity"]["value"] == 1.0
    assert record["kappa"] == {"value": None, "ci": None}


def test_numeric_record_correlations_match_scipy_with_fisher_intervals():
    pred = [1.0, 2.1, 2.9, 4.2, 5.5, 5.9, 7.1, 8.4, 8.8, 10.3]
    gold = [1.2, 2.5, 2.7, 4.4, 5.0, 6.5, 6.9, 8.0, 9.6, 9.9]
    record = measures.numeric_record(pred, gold)
    n, r = len(pred), stats.pearsonr(pred, gold).statistic
    rho = stats.spearmanr(pred, gold).statistic
    assert record["pearson"]["value"] == pytest.approx(r, abs=EXACT)
    assert record["spearman"]["value"] == pytest.approx(rho, abs=EXACT)
    se_r, se_rho = 1 / math.sqrt(n - 3), math.sqrt((1 + rho**2 / 2) / (n - 3))
    fisher = [math.tanh(math.atanh(r) + s * Z * se_r) for s in (-1, 1)]
    bonett_wright = [math.tanh(math.atanh(rho) + s * Z * se_rho) for s in (-1, 1)]
    assert record["pearson"]["ci"] == pytest.approx(fisher, abs=EXACT)
    assert record["spearman"]["ci"] == pytest.approx(bonett_wright, abs=EXACT)
    assert record["mae"]["value"] == pytest.approx(np.mean(np.abs(np.subtract(pred, gold))))


def test_numeric_record_has_no_correlation_below_three_items_or_without_variance():
    assert measures.numeric_record([1.0, 2.0], [1.0, 3.0])["pearson"]["value"] is None
    flat = measures.numeric_record([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    assert flat["pearson"]["value"] is None and flat["spearman"]["value"] is None
    assert flat["mae"]["value"] == 1.5


def test_categorical_record_matches_sklearn_and_appends_unseen_values():
    gold = ["a", "b", "b", "a", "c", "c", "a", "b"]
    pred = ["a", "b", "c", "a", "c", "x", "b", "b"]
    record = measures.categorical_record(pred, gold, ["a", "b", "c"])
    assert record["labels"] == ["a", "b", "c", "x"]
    expected = metrics.confusion_matrix(gold, pred, labels=record["labels"]).tolist()
    assert record["confusion"] == expected
    assert record["accuracy"]["value"] == pytest.approx(5 / 8)
    assert record["kappa"]["value"] == pytest.approx(
        metrics.cohen_kappa_score(gold, pred), abs=EXACT
    )


def test_consistency_on_a_hand_computed_example():
    groups = [[True, True, True], [True, False, True], [False], [None, False, False], ["a", "b"]]
    result = measures.consistency(groups)
    # items with two verdicts or more: 4; all equal: 2; consecutive pairs 2+2+1+1, flips 0+2+0+1
    assert result["items"] == 4
    assert result["stable"]["value"] == 0.5
    assert result["stable"]["ci"] == pytest.approx(list(wilson(2, 4)))
    assert result["flip_rate"]["value"] == pytest.approx(3 / 6)
    assert measures.consistency([[1]]) == {
        "items": 0,
        "stable": {"value": None, "ci": None},
        "flip_rate": {"value": None, "ci": None},
    }


def test_rogan_gladen_on_a_hand_computed_example():
    # p = 0.6, Se = 0.9, Sp = 0.8: (0.6 + 0.8 - 1) / (0.9 + 0.8 - 1) = 0.4 / 0.7
    result = measures.rogan_gladen(60, 100, {"tp": 90, "fn": 10, "tn": 80, "fp": 20})
    assert result["value"] == pytest.approx(4 / 7, abs=EXACT)
    assert result["identifiable"] is True and result["reason"] is None
    assert result["sensitivity"]["value"] == pytest.approx(0.9)
    assert result["specificity"]["value"] == pytest.approx(0.8)
    assert result["observed"]["value"] == pytest.approx(0.6)
    assert result["ci"][0] < result["value"] < result["ci"][1]
    again = measures.rogan_gladen(60, 100, {"tp": 90, "fn": 10, "tn": 80, "fp": 20})
    assert again == result


def test_rogan_gladen_interval_widens_with_fewer_gold_items():
    many = measures.rogan_gladen(60, 100, {"tp": 90, "fn": 10, "tn": 80, "fp": 20})
    few = measures.rogan_gladen(60, 100, {"tp": 9, "fn": 1, "tn": 8, "fp": 2})
    assert few["value"] == pytest.approx(many["value"], abs=EXACT)
    assert few["ci"][1] - few["ci"][0] > many["ci"][1] - many["ci"][0]


def test_rogan_gladen_is_clipped_and_refuses_a_chance_level_evaluator():
    assert measures.rogan_gladen(5, 100, {"tp": 9, "fn": 1, "tn": 8, "fp": 2})["value"] == 0.0
    chance = measures.rogan_gladen(60, 100, {"tp": 5, "fn": 5, "tn": 5, "fp": 5})
    assert chance["identifiable"] is False and chance["value"] is None
    assert chance["reason"] == measures.NO_BETTER_THAN_CHANCE
    shaky = measures.rogan_gladen(60, 100, {"tp": 3, "fn": 1, "tn": 2, "fp": 1})
    assert shaky["identifiable"] is True and "draws" in shaky["reason"]
    no_negatives = measures.rogan_gladen(60, 100, {"tp": 3, "fn": 1, "tn": 0, "fp": 0})
    assert no_negatives["identifiable"] is False and no_negatives["value"] is None
