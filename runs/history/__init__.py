"""Test-case history: each test case's verdicts across a testset's runs (docs/history.md)."""

from runs.history.cases import (
    CLASSES,
    DEFAULT_LIMIT,
    DEFAULT_RUNS,
    MAX_LIMIT,
    MAX_RUNS,
    MIN_RUNS,
    VERDICTS,
    CaseHistory,
    History,
    HistoryEvaluator,
    HistoryQuery,
    classify,
    history_run_get,
    testcase_history,
)

__all__ = [
    "CLASSES",
    "DEFAULT_LIMIT",
    "DEFAULT_RUNS",
    "MAX_LIMIT",
    "MAX_RUNS",
    "MIN_RUNS",
    "VERDICTS",
    "CaseHistory",
    "History",
    "HistoryEvaluator",
    "HistoryQuery",
    "classify",
    "history_run_get",
    "testcase_history",
]
