"""Feedback: annotations logged by your own code (SDK / API), in whatever shape they come.

Nothing runs and no outputs schema is declared: the metrics read a schema inferred from every
annotation stored for the revision, until one is backfilled (docs/metrics.md). An annotation sent
for an unknown evaluator slug creates one of these.
"""

from __future__ import annotations

from evaluators.kinds.base import Kind, KindParameters, register


class Parameters(KindParameters):
    pass


kind = register(
    Kind(
        key="feedback",
        name="Logged feedback",
        description="Annotations your code logs through the API; the outputs schema is inferred "
        "from what arrives.",
        parameters=Parameters,
        evaluate=None,
        outputs=None,
        executes=False,
        category="human",
    )
)
