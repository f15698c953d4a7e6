"""Reads of evaluators for pages and APIs."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from evalsite.models import Project
from evaluators.models import Evaluator, EvaluatorRevision


def evaluator_list(
    *, project: Project, search: str = "", kind: str = "", archived: bool = False
) -> QuerySet[Evaluator]:
    evaluators = Evaluator.objects.for_project(project).select_related("head")
    evaluators = evaluators.filter(archived=archived)
    if kind:
        evaluators = evaluators.filter(kind=kind)
    if search:
        evaluators = evaluators.filter(
            Q(name__icontains=search) | Q(slug__icontains=search) | Q(description__icontains=search)
        )
    return evaluators


def evaluator_list_recent(*, project: Project, limit: int = 8) -> QuerySet[Evaluator]:
    return evaluator_list(project=project).order_by("-updated_at")[:limit]


def evaluator_get(*, project: Project, ref: str | int) -> Evaluator | None:
    return Evaluator.objects.for_project(project).by_ref(ref).select_related("head").first()


def revision_resolve(*, project: Project, ref: str | int) -> EvaluatorRevision | None:
    """What a reference in a request means: an evaluator (by id or slug) stands for its head,
    else a revision by id or slug."""
    evaluator = evaluator_get(project=project, ref=ref)
    return evaluator.head if evaluator else revision_get(project=project, ref=ref)


def revision_get(*, project: Project, ref: str | int) -> EvaluatorRevision | None:
    """A revision by id or slug (``toxicity-v3``), within the project."""
    revisions = EvaluatorRevision.objects.filter(project=project).select_related("evaluator")
    if isinstance(ref, int) or str(ref).isdecimal():
        return revisions.filter(Q(pk=int(ref)) | Q(slug=str(ref))).first()
    return revisions.filter(slug=ref).first()
