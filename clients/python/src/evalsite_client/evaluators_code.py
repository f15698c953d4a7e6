"""``evalsite evaluators pull|diff|push``: evaluators as YAML files in the user's repository.

Calling convention (shared with cli.py): ``register(subparsers)`` adds the ``evaluators``
command; each sub-command sets ``func=<callable(args, client) -> int>`` and the main cli does
``args = parser.parse_args(); client = Client(); sys.exit(args.func(args, client))``.

- ``pull`` writes the server's evaluators as files (``evaluators_yaml`` is the format).
- ``diff`` compares the files with the server's head revisions: exit 0 when nothing would
  change, 1 when something would, 2 on an error.
- ``push`` creates what is missing and revises what changed, one request (so at most one new
  revision) per evaluator, with the example cases required to pass unless ``--allow-failing``;
  exit 0, or 2 when anything failed. A second push finds nothing to do: the client compares
  first, and the server makes no revision for a configuration equal to its head.
docs/evaluators-as-code.md is the user's guide.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from evalsite_client.client import ApiError, Client
from evalsite_client.evaluators_yaml import (
    FormatError,
    Kinds,
    Local,
    effective,
    pulled,
    read_file,
    read_folder,
    remote_doc,
    render,
    revision_changes,
    secrets_in,
    sendable,
)

OK, CHANGES, FAILED = 0, 1, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluators",
        help="Evaluators as code: pull, diff, push YAML files.",
        description="Evaluators as YAML files in your repository (docs/evaluators-as-code.md).",
    )
    commands = parser.add_subparsers(dest="evaluators_command", required=True)
    for name, func, help_ in (
        ("pull", pull, "Write the server's evaluators as YAML files (and their code files)."),
        ("diff", diff, "Show what push would change; exit 1 when something would, 0 when not."),
        ("push", push, "Create missing evaluators and revise changed ones."),
    ):
        sub = commands.add_parser(name, help=help_, description=help_)
        sub.add_argument("--dir", default="evaluators/", help="Folder of YAML files (evaluators/).")
        sub.add_argument("slugs", nargs="*", help="Only these evaluators (default: all).")
        sub.set_defaults(func=func)
        if name == "push":
            sub.add_argument("-m", "--message", default="", help="Message of new revisions.")
            sub.add_argument(
                "--allow-failing",
                action="store_true",
                help="Save revisions whose example cases fail (default: refuse them).",
            )
            sub.add_argument(
                "--dry-run", action="store_true", help="Only show what would change (as diff)."
            )


# --- pull ---------------------------------------------------------------------------------------


def pull(args: argparse.Namespace, client: Client) -> int:
    folder = Path(args.dir)
    try:
        kinds = Kinds.from_api(client.get("kinds"))
        folder.mkdir(parents=True, exist_ok=True)
        existing = _existing_files(folder, kinds)
        evaluators = _remote_list(client, args.slugs)
    except (ApiError, httpx.HTTPError, FormatError) as exc:
        return _fail(exc)
    written = 0
    for evaluator in evaluators:
        local = existing.get(evaluator["slug"])
        yaml_path = local.path if local else folder / f"{evaluator['slug']}.yaml"
        try:
            files = pulled(remote_doc(evaluator, kinds), yaml_path, folder, local, kinds)
        except FormatError as exc:
            return _fail(exc)
        for path, text in files.items():
            written += _write(path, text)
    only_here = sorted(set(existing) - {e["slug"] for e in evaluators})
    if only_here and not args.slugs:
        _say(f"Not on the server (push creates them): {', '.join(only_here)}")
    _say(f"Pulled {len(evaluators)} evaluator(s); {written} file(s) written.")
    return OK


def _existing_files(folder: Path, kinds: Kinds) -> dict[str, Local]:
    """The folder's evaluator files by slug; one that does not read is rewritten from the
    server (and said so) rather than stopping the pull."""
    found = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        try:
            local = read_file(path, folder, kinds)
        except FormatError as exc:
            _say(f"warning: {exc}; pull rewrites it if the server has it")
            continue
        found[local.slug] = local
    return found


def _write(path: Path, text: str) -> int:
    old = _read(path)
    if old == text:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    _say(f"{'updated' if old is not None else 'created'} {path}")
    return 1


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _remote_list(client: Client, slugs: list[str]) -> list[dict[str, Any]]:
    if not slugs:
        return sorted(client.pages("evaluators"), key=lambda e: e["slug"])
    found = []
    for slug in slugs:
        evaluator = _remote_get(client, slug)
        if evaluator is None:
            raise FormatError(f"No evaluator {slug!r} on the server.")
        found.append(evaluator)
    return found


def _remote_get(client: Client, slug: str) -> dict[str, Any] | None:
    try:
        return client.get(f"evaluators/{slug}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


# --- the plan that diff shows and push carries out ----------------------------------------------


@dataclass
class Item:
    local: Local
    remote: dict[str, Any] | None  # the server's evaluator (GET /evaluators/{slug}), or None
    before: dict[str, Any] | None  # the server's evaluator as a document
    after: dict[str, Any]  # the document after a push
    secrets: list[tuple[str, str, Any]] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return self.local.slug

    @property
    def action(self) -> str:
        """create | revise (a new revision) | update (name/description) | unchanged"""
        if self.before is None:
            return "create"
        if revision_changes(self.before, self.after):
            return "revise"
        if any(self.before[key] != self.after[key] for key in ("name", "description")):
            return "update"
        return "unchanged"


@dataclass
class Plan:
    kinds: Kinds
    items: list[Item]
    only_on_server: list[str]


def _plan(args: argparse.Namespace, client: Client) -> Plan:
    """Raises ``FormatError`` (a local file), ``ApiError`` or ``httpx.HTTPError``."""
    kinds = Kinds.from_api(client.get("kinds"))
    locals_ = read_folder(Path(args.dir), kinds)
    missing = [slug for slug in args.slugs if slug not in locals_]
    if missing:
        raise FormatError(f"No file in {args.dir} for {', '.join(missing)}.")
    chosen = [locals_[slug] for slug in sorted(args.slugs or locals_)]
    active = {e["slug"]: e for e in client.pages("evaluators")}
    items = []
    for local in chosen:
        remote = active.get(local.slug) or _remote_get(client, local.slug)  # archived ones too
        if remote is not None and remote["kind"] != local.kind:
            raise FormatError(
                f"{local.path}: kind {local.kind!r}, but {local.slug} is a {remote['kind']} "
                f"evaluator on the server; a kind cannot change (give the file a new slug)"
            )
        before = remote_doc(remote, kinds) if remote else None
        items.append(
            Item(local, remote, before, effective(local, before, kinds), secrets_in(local, kinds))
        )
    only = [] if args.slugs else sorted(set(active) - set(locals_))
    return Plan(kinds, items, only)


# --- diff ---------------------------------------------------------------------------------------


def diff(args: argparse.Namespace, client: Client) -> int:
    try:
        plan = _plan(args, client)
    except (ApiError, httpx.HTTPError, FormatError) as exc:
        return _fail(exc)
    counts = {"create": 0, "update": 0, "unchanged": 0}
    for item in plan.items:
        action = item.action
        counts["update" if action in ("revise", "update") else action] += 1
        if action != "unchanged":
            _say(_unified(item), end="")
        if item.secrets and item.before is not None:
            names = ", ".join(f"parameters.{setting}.{name}" for setting, name, _ in item.secrets)
            _say(
                f"{item.slug}: {names} is a sealed value from the file or the environment; "
                f"only the server can compare it (push makes a revision if it changed)."
            )
    if plan.only_on_server:
        _say(f"Only on the server (push leaves them): {', '.join(plan.only_on_server)}")
    _say(f"create {counts['create']}, update {counts['update']}, unchanged {counts['unchanged']}")
    return CHANGES if counts["create"] or counts["update"] else OK


def _unified(item: Item) -> str:
    before = render(item.before).splitlines(keepends=True) if item.before else []
    where = f"server: {item.slug}"
    if item.remote and item.remote.get("head"):
        where += f" ({item.remote['head']['slug']})"
    lines = difflib.unified_diff(
        before, render(item.after).splitlines(keepends=True), where, str(item.local.path)
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


# --- push ---------------------------------------------------------------------------------------


def push(args: argparse.Namespace, client: Client) -> int:
    if args.dry_run:
        return diff(args, client)
    try:
        plan = _plan(args, client)
        # Every file is read, and every secret found, before anything is sent.
        bodies = {item.slug: _body(item, args, plan.kinds) for item in plan.items}
    except (ApiError, httpx.HTTPError, FormatError) as exc:
        return _fail(exc)
    done = {"created": 0, "revised": 0, "updated": 0, "unchanged": 0, "failed": 0}
    for item in plan.items:
        body = bodies[item.slug]
        if body is None:
            _say(f"unchanged {item.slug}")
            done["unchanged"] += 1
            continue
        try:
            if item.remote is None:
                evaluator = client.post("evaluators", body)
            else:
                path = f"evaluators/{item.slug}"
                evaluator = client.patch(path, body)
        except ApiError as exc:
            _say_error(item, exc)
            done["failed"] += 1
            continue
        except httpx.HTTPError as exc:
            _say(f"error {item.slug}: {exc}", error=True)
            done["failed"] += 1
            continue
        done[_report(item, evaluator, args.allow_failing)] += 1
    if plan.only_on_server:
        _say(f"Only on the server (left as they are): {', '.join(plan.only_on_server)}")
    _say(", ".join(f"{what} {count}" for what, count in done.items()))
    return FAILED if done["failed"] else OK


def _body(item: Item, args: argparse.Namespace, kinds: Kinds) -> dict[str, Any] | None:
    """The one request that brings the server to the file: a POST for a new evaluator, a PATCH
    (missing keys keep the server's values) for a changed one, None when nothing changes."""
    local, action = item.local, item.action
    if action == "unchanged" and not item.secrets:
        return None
    body: dict[str, Any] = {
        "message": args.message or f"evalsite evaluators push ({local.path.name})",
        "examples_must_pass": not args.allow_failing,
    }
    if action == "create":
        return {
            **body,
            "slug": local.slug,
            "name": local.doc["name"],
            "description": local.doc.get("description", ""),
            "kind": local.kind,
            "parameters": sendable(local, kinds),
            "outputs_schema": local.doc.get("outputs_schema") or None,
            "examples": local.doc.get("examples", []),
        }
    before, after = item.before or {}, item.after
    body |= {key: after[key] for key in ("name", "description") if before[key] != after[key]}
    if action == "revise" or item.secrets:
        body["parameters"] = sendable(local, kinds)
        if "examples" in local.doc:
            body["examples"] = local.doc["examples"]
        if "outputs_schema" in after:
            body["outputs_schema"] = after["outputs_schema"]
        elif "outputs_schema" in before and before["parameters"] == after["parameters"]:
            # Back to the kind's own schema with the same parameters: send it (null would mean
            # "unchanged"); with new parameters the new revision derives it anyway.
            body["outputs_schema"] = item.remote["head"].get("kind_outputs_schema") or {}
    return body


def _report(item: Item, evaluator: dict[str, Any], allow_failing: bool) -> str:
    head = evaluator.get("head") or {}
    old = (item.remote or {}).get("head") or {}
    if item.remote is None:
        _say(f"created {item.slug} ({head.get('slug')})")
        outcome = "created"
    elif head.get("version") != old.get("version"):
        changed = ", ".join(revision_changes(item.before or {}, item.after)) or "a sealed value"
        _say(f"revised {item.slug}: {old.get('slug')} -> {head.get('slug')} ({changed})")
        outcome = "revised"
    elif item.action == "update":
        _say(f"updated {item.slug} (name/description; no new revision)")
        return "updated"
    else:
        hint = ""
        if item.action == "revise":
            hint = f"; the file differs only in form: `evalsite evaluators pull {item.slug}`"
        _say(f"unchanged {item.slug} (the server found no change{hint})")
        return "unchanged"
    _say_examples(head.get("examples_report") or [], allow_failing)
    return outcome


def _say_examples(report: list[dict[str, Any]], allow_failing: bool) -> None:
    if not report:
        return
    passed = sum(1 for case in report if case.get("passed") is True)
    _say(f"  examples: {passed} of {len(report)} passed")
    for case in report:
        if case.get("passed") is not True:
            why = "; ".join(case.get("problems") or []) or case.get("status", "")
            prefix = "warning: " if allow_failing else ""
            _say(f"  {prefix}{case.get('name')}: {why}")


def _say_error(item: Item, exc: ApiError) -> None:
    _say(f"error {item.slug}: HTTP {exc.status}", error=True)
    error = exc.body.get("error") if isinstance(exc.body, dict) else None
    fields = (error or {}).get("fields") or {}
    if not fields:
        _say(f"  {exc.message}", error=True)
    for name, reasons in fields.items():
        source = item.local.file_for(name)
        where = f" (in {source})" if source else ""
        for reason in reasons if isinstance(reasons, list) else [reasons]:
            _say(f"  {name}{where}: {reason}", error=True)
    _say(f"  nothing was saved for {item.slug} ({item.local.path})", error=True)


# --- output -------------------------------------------------------------------------------------


def _say(text: str, *, error: bool = False, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr if error else sys.stdout)


def _fail(exc: Exception) -> int:
    text = exc.message if isinstance(exc, ApiError) else str(exc)
    if isinstance(exc, ApiError):
        text = f"HTTP {exc.status} from {exc.method} {exc.path}: {text}"
    _say(f"error: {text}", error=True)
    return FAILED
