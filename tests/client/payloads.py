"""Answers of the API as the server shapes them (runs/api/compare.py, runs/api/history.py), for
the tests of what the client makes of them without a server."""

from __future__ import annotations

from evalsite_client.models import Comparison, History, Run

BASE, CAND = 10, 12


def run(run_id: int = CAND, status: str = "success", **extra) -> Run:
    """A run of 200 scenarios x 3 steps; ``progress`` follows ``done_cells`` as the server's."""
    extra.setdefault("done_cells", 600)
    extra.setdefault("progress", 100.0 * extra["done_cells"] / 600)
    return Run.model_validate(
        {
            "id": run_id,
            "name": f"run {run_id}",
            "status": status,
            "testset": {"id": 1, "slug": "qa", "version": 2},
            "steps": [
                {"key": "testset-qa", "type": "input", "references": {}},
                {"key": "application-column", "type": "invocation", "references": {}},
                {
                    "key": "evaluator-exact-v1",
                    "type": "annotation",
                    "references": {"evaluator": {"id": 3, "slug": "exact"}},
                },
            ],
            "mappings": [
                _mapping("input", "question", "testset-qa", "data.question"),
                _mapping("outputs", "outputs", "application-column", "attributes.ag.data.outputs"),
                _mapping(
                    "annotation",
                    "exact.success",
                    "evaluator-exact-v1",
                    "attributes.ag.data.outputs.success",
                    "binary",
                ),
            ],
            "scenario_count": 200,
            "total_cells": 600,
            **extra,
        }
    )


def _mapping(kind, name, step, path, type_=""):
    column = {"kind": kind, "name": name} | ({"type": type_} if type_ else {})
    return {"column": column, "step": {"key": step, "path": path}}


def metric(
    name: str = "exact.success",
    *,
    verdict: str = "worse",
    n: int = 200,
    base: float = 0.9,
    cand: float = 0.6,
    base_errors: int = 0,
    cand_errors: int = 0,
    p: float = 1e-9,
    type_: str = "binary",
    higher_is_better: bool = True,
) -> dict:
    evaluator, key = name.split(".", 1)
    return {
        "metric": name,
        "evaluator": evaluator,
        "key": key,
        "type": type_,
        "higher_is_better": higher_is_better,
        "runs": [
            {"run": BASE, "value": base, "count": n, "errors": base_errors},
            {"run": CAND, "value": cand, "count": n, "errors": cand_errors},
        ],
        "tests": [
            {
                "test": "mcnemar",
                "method": "chi-square, continuity-corrected",
                "n": n,
                "difference": cand - base,
                "ci": [cand - base - 0.06, cand - base + 0.06],
                "p_value": p,
                "table": {},
                "verdict": verdict,
                "run": CAND,
                "excluded": {"errors": base_errors + cand_errors, "missing": 0},
            }
        ],
    }


def comparison(*metrics: dict, rows: list[dict] = (), count: int | None = None) -> Comparison:
    return Comparison.model_validate(
        {
            "runs": [
                {
                    "id": BASE,
                    "name": "baseline",
                    "status": "success",
                    "testset": {"id": 1, "slug": "qa", "version": 1},
                    "baseline": True,
                },
                {
                    "id": CAND,
                    "name": "candidate",
                    "status": "success",
                    "testset": {"id": 1, "slug": "qa", "version": 2},
                    "baseline": False,
                },
            ],
            "baseline": BASE,
            "alignment": "testcase index",
            "metrics": list(metrics),
            "count": len(rows) if count is None else count,
            "offset": 0,
            "rows": list(rows),
        }
    )


def regressed_row(index: int, question: str = "What is 2 + 2?") -> dict:
    return {
        "index": index,
        "inputs": {"question": question},
        "runs": [
            {"run": BASE, "present": True, "values": {"exact.success": True}, "errors": {}},
            {
                "run": CAND,
                "present": True,
                "values": {"exact.success": False},
                "errors": {},
                "deltas": {"exact.success": -1.0},
            },
        ],
    }


def history(regressed: int = 0, flaky: int = 0) -> History:
    cases = [
        {
            "index": i,
            "inputs": f"question {i}",
            "evaluator": "exact",
            "class": klass,
            "flips": 1 if klass == "regressed" else 3,
            "flip_rate": 0.5,
            "verdicts": ["pass", "pass", "fail"]
            if klass == "regressed"
            else ["pass", "fail", "pass", "fail"],
        }
        for klass, count in (("regressed", regressed), ("flaky", flaky))
        for i in range(count)
    ]
    counts = {"regressed": regressed, "flaky": flaky, "stable_pass": 100}
    return History.model_validate(
        {"runs": [], "counts": counts, "count": len(cases), "cases": cases}
    )
