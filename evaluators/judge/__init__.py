"""LLM-as-a-judge machinery behind the ``llm_judge`` kind (``evaluators/kinds/llm_judge.py``).

- ``context``      the evaluation context (shared with code evaluators) and template variables
- ``templates``    curly and sandboxed jinja2 prompt templates
- ``scripts``      script prompt templates run in the code sandbox
- ``scores``       score shapes: answer schema, outputs schema, reading answers back
- ``client``       one chat-completions request: limiter, retries, Retry-After, costs
- ``limits``       the Redis rate limiter per connection and spend counters
- ``batch``        a batch of judgements: concurrency, repair, traces
- ``connections``  model connection services (create, update, test) and the address check
- ``crypto``       API keys encrypted at rest
- ``conf``         the settings the judge reads

Nothing here imports views; ``runs`` is reached only to record judge traces.
"""

from __future__ import annotations

from typing import Any


def structured_call(**kwargs: Any) -> dict[str, Any]:
    """One structured-output model call on a project's connection (see ``batch.structured_call``).

    Imported lazily: kinds load before Django's models are ready.
    """
    from evaluators.judge.batch import structured_call as call

    return call(**kwargs)


# The runs app registers its trace recorder here (runs.ingest.trace_record), so judge calls are
# traced without evaluators importing runs.
TRACE_RECORDERS: list = []
