"""Realistic sample cases that prefill the "try it" panels and the code playground."""

from __future__ import annotations

from typing import Any

SAMPLE_TRACE: dict[str, Any] = {
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "spans": {
        "a1b2c3d4e5f60001": {
            "span_id": "a1b2c3d4e5f60001",
            "parent_id": None,
            "name": "capital_qa",
            "kind": "workflow",
            "start_time": "2026-11-20T10:00:00.000Z",
            "end_time": "2026-11-20T10:00:01.234Z",
            "status": "ok",
            "attributes": {
                "ag": {
                    "data": {
                        "inputs": {"country": "France"},
                        "outputs": "The capital of France is Paris.",
                        "internals": {},
                    },
                    "metrics": {
                        "unit": {"duration": {"total": 1234.5}},
                        "acc": {
                            "duration": {"total": 1234.5},
                            "tokens": {"prompt": 42, "completion": 9, "total": 51},
                            "costs": {
                                "prompt": 0.000021,
                                "completion": 0.000018,
                                "total": 0.000039,
                            },
                        },
                    },
                    "meta": {"app": "capital-qa", "version": "3"},
                }
            },
            "children": {
                "a1b2c3d4e5f60002": {
                    "span_id": "a1b2c3d4e5f60002",
                    "parent_id": "a1b2c3d4e5f60001",
                    "name": "retrieve",
                    "kind": "retriever",
                    "start_time": "2026-11-20T10:00:00.010Z",
                    "end_time": "2026-11-20T10:00:00.130Z",
                    "status": "ok",
                    "attributes": {
                        "ag": {
                            "data": {
                                "inputs": {"query": "capital of France"},
                                "outputs": ["Paris is the capital of France."],
                            },
                            "metrics": {
                                "unit": {"duration": {"total": 120.0}},
                                "acc": {"duration": {"total": 120.0}},
                            },
                            "meta": {},
                        }
                    },
                    "children": {},
                },
                "a1b2c3d4e5f60003": {
                    "span_id": "a1b2c3d4e5f60003",
                    "parent_id": "a1b2c3d4e5f60001",
                    "name": "chat gpt-4o-mini",
                    "kind": "llm",
                    "start_time": "2026-11-20T10:00:00.140Z",
                    "end_time": "2026-11-20T10:00:01.220Z",
                    "status": "ok",
                    "attributes": {
                        "ag": {
                            "data": {
                                "inputs": {
                                    "messages": [
                                        {
                                            "role": "user",
                                            "content": "What is the capital of France?",
                                        }
                                    ]
                                },
                                "outputs": "The capital of France is Paris.",
                            },
                            "metrics": {
                                "unit": {
                                    "duration": {"total": 1080.0},
                                    "tokens": {"prompt": 42, "completion": 9, "total": 51},
                                    "costs": {
                                        "prompt": 0.000021,
                                        "completion": 0.000018,
                                        "total": 0.000039,
                                    },
                                },
                                "acc": {
                                    "duration": {"total": 1080.0},
                                    "tokens": {"prompt": 42, "completion": 9, "total": 51},
                                    "costs": {
                                        "prompt": 0.000021,
                                        "completion": 0.000018,
                                        "total": 0.000039,
                                    },
                                },
                            },
                            "meta": {"model": "gpt-4o-mini"},
                        },
                        "gen_ai.request.model": "gpt-4o-mini",
                    },
                    "children": {},
                },
            },
        }
    },
}

SAMPLE_INPUTS = {"country": "France", "correct_answer": "Paris"}


def sample_case(kind) -> dict[str, Any]:
    """Inputs, outputs and trace that make sense for a kind's "try it" panel."""
    samples = kind.extras.get("sample") if kind.extras else None
    if samples:
        return samples
    return {"inputs": SAMPLE_INPUTS, "outputs": "Paris", "trace": SAMPLE_TRACE}


# Other apps offer cases the playground can start from (the runs app: a scenario of a run).
# evaluators never imports them; they register here (dependencies point one way).
SAMPLE_PROVIDERS: list = []


def sample_from_request(request, project) -> dict[str, Any] | None:
    for provider in SAMPLE_PROVIDERS:
        case = provider(request, project)
        if case:
            return case
    return None
