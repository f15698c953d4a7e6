"""Heuristic agent scoring of a long history: median time per scoring.

    uv run python benchmarks/agent_bench.py [--messages 500] [--calls 200] [--repeats 300]

Builds one realistic agent history (a system prompt, the task, assistant reasoning, tool calls
with JSON arguments, tool results of about 1.5 KB, a failed call every 25, retries, a closing
answer) and a trace with one tool span per call and an LLM span per turn, then times the
``agent_score`` kind with its default parameters (heuristics, no model connection):

- ``score``: extraction, merging with the trace, the four categories and the details;
- ``invoke``: the same through ``evaluation_invoke`` (normalisation, the outputs schema check),
  which is what a run pays per scenario.

Times are wall clock (median, p95) and this thread's CPU time (median), which stays steady
when other processes share the machine. No database is used. The target is a median under 5 ms
for ``score``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

from evaluators.kinds import get_kind  # noqa: E402
from evaluators.services import evaluation_invoke  # noqa: E402

TOOLS = ["search_docs", "read_page", "run_query", "summarise", "search_docs", "write_note"]


def history(messages: int, calls: int) -> list[dict]:
    """``messages`` messages holding ``calls`` tool calls, each answered."""
    extra = messages - 2 - 2 * calls - 1  # system, task, (call, result) pairs, the answer
    if extra < 0:
        raise SystemExit(f"{messages} messages cannot hold {calls} answered calls")
    history = [
        {"role": "system", "content": "You are a research agent. " * 40},
        {"role": "user", "content": "Compare the refund policies of our three plans. " * 5},
    ]
    for index in range(calls):
        if index < extra:
            history.append({"role": "assistant", "content": f"Step {index}: next I check " * 12})
        name = TOOLS[index % len(TOOLS)] if index % 7 else TOOLS[(index - 1) % len(TOOLS)]
        arguments = {"query": f"refund policy plan {index % 3}", "page": index, "limit": 20}
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{index}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        history.append(
            {"role": "tool", "tool_call_id": f"call_{index}", "content": json.dumps(_result(index))}
        )
    history.append({"role": "assistant", "content": "The three plans differ as follows. " * 20})
    return history


def _result(index: int) -> dict:
    if index % 25 == 24:
        return {"ok": False, "error": "upstream timeout after 5000 ms"}
    rows = [
        {"id": f"doc-{index}-{n}", "title": "Refund policy", "snippet": "x" * 90} for n in range(12)
    ]
    return {"ok": True, "results": rows}


def trace(messages: list[dict]) -> dict:
    """A root span with, per call, an LLM span (growing prompts) and a tool span (timed)."""
    calls = [c for m in messages for c in m.get("tool_calls") or []]
    children = {}
    for index, call in enumerate(calls):
        prompt = 900 + 40 * index
        tokens = {"prompt": prompt, "completion": 60, "total": prompt + 60}
        children[f"llm{index:05d}"] = _span(f"llm{index:05d}", "chat", "llm", index, {}, tokens)
        arguments = json.loads(call["function"]["arguments"])
        tool = _span(f"tool{index:05d}", call["function"]["name"], "tool", index, arguments)
        tool["attributes"]["gen_ai.tool.call.id"] = call["id"]
        children[tool["span_id"]] = tool
    root = _span("root", "agent", "agent", 0, {})
    root["children"] = children
    return {"trace_id": "b" * 32, "spans": {"root": root}}


def _span(span_id: str, name: str, kind: str, index: int, inputs: dict, tokens=None) -> dict:
    unit: dict = {"duration": {"total": 120.0 + index}}
    if tokens:
        unit["tokens"] = tokens
    minute, second = divmod(index, 60)
    millis = 500 if kind == "tool" else 0
    return {
        "span_id": span_id,
        "parent_id": None if span_id == "root" else "root",
        "name": name,
        "kind": kind,
        "start_time": f"2026-11-20T10:{minute:02d}:{second:02d}.{millis:03d}Z",
        "status": "ok",
        "attributes": {"ag": {"data": {"inputs": inputs}, "metrics": {"unit": unit}}},
        "children": {},
    }


def timed(function, repeats: int) -> tuple[list[float], list[float]]:
    """(wall times, this thread's CPU times) in ms; CPU time holds steady on a busy machine."""
    function()  # warm caches and imports
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.thread_time()
        function()
        cpu.append((time.thread_time() - started_cpu) * 1000)
        wall.append((time.perf_counter() - started) * 1000)
    return wall, cpu


def report(label: str, samples: tuple[list[float], list[float]]) -> None:
    wall, cpu = samples
    p95 = sorted(wall)[int(len(wall) * 0.95) - 1]
    print(
        f"{label:<22} median {statistics.median(wall):6.3f} ms (CPU {statistics.median(cpu):6.3f}"
        f" ms)   p95 {p95:6.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()

    messages = history(args.messages, args.calls)
    a_trace = trace(messages)
    kind = get_kind("agent_score")
    parameters = kind.parse({})
    inputs = {"task": "Compare the refund policies."}
    outputs = {"messages": messages}
    chars = sum(len(json.dumps(m)) for m in messages)
    print(
        f"history: {len(messages)} messages, {args.calls} tool calls, ~{chars // 1000} KB; "
        f"trace: {len(a_trace['spans']['root']['children'])} spans; {args.repeats} repeats"
    )
    result = kind.evaluate(parameters, inputs, outputs, a_trace)
    counts = {k: v for k, v in result["details"].items() if k not in ("trajectory", "reasoning")}
    print(f"score {result['score']}, details {json.dumps(counts)}")
    report(
        "score, messages only",
        timed(lambda: kind.evaluate(parameters, inputs, outputs, None), args.repeats),
    )
    report(
        "score, with trace",
        timed(lambda: kind.evaluate(parameters, inputs, outputs, a_trace), args.repeats),
    )
    invoke = {"kind": "agent_score", "parameters": {}, "inputs": inputs, "outputs": outputs}
    report(
        "invoke, with trace",
        timed(lambda: evaluation_invoke(**invoke, trace=a_trace), args.repeats),
    )


if __name__ == "__main__":
    main()
