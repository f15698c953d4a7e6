"""Where judge calls are recorded as traces.

The runs app registers its trace recorder here in ``RunsConfig.ready()``, so judge calls are
traced without evaluators importing runs. ``batch`` uses the first one; with none registered, an
evaluation simply has no trace.
"""

from __future__ import annotations

TRACE_RECORDERS: list = []
