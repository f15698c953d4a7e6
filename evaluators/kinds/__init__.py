"""Every evaluator kind, registered on import. Add a new kind's module here."""

from evaluators.kinds import exact_match, regex  # noqa: F401
from evaluators.kinds.base import REGISTRY, Kind, get_kind

__all__ = ["REGISTRY", "Kind", "get_kind"]
