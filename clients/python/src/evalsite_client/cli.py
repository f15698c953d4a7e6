"""The ``evalsite`` command: run evaluations, gate on regressions, log runs, manage evaluators.

Exit codes: 0 done (no regression), 1 a regression (a gated metric is worse, or with
``--fail-on inconclusive`` not better), 2 could not decide or could not do it (bad usage,
configuration, an API error, a failed run, a run refused over its cost cap). docs/client.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import httpx

from evalsite_client import evaluators_code, gate, reports
from evalsite_client.client import ApiError, Client, ConfigError
from evalsite_client.logged import MISSING, LoggedRun
from evalsite_client.models import FINISHED_STATUSES, Estimate, Run
from evalsite_client.progress import Progress, RunTimeout, run_wait

BASELINE_SCAN = 500  # runs of the testset with the tags looked through for a finished one


class Fail(Exception):
    """A one-line reason to stop with exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.no_wait and (args.gate_baseline or args.gate_baseline_tag):
            parser.error("--no-wait cannot gate: the gate needs the finished run")
        if args.dry_run and args.file:
            parser.error("--dry-run uploads nothing: estimate the testset as it is, without --file")
    client = None
    try:
        client = Client(url=args.url, api_key=args.api_key, timeout=args.http_timeout)
        return args.func(args, client)
    except (ConfigError, Fail) as exc:
        return _error(str(exc))
    except ApiError as exc:
        return _error(str(exc))
    except httpx.HTTPError as exc:
        where = client.url if client else "evalsite"
        return _error(f"cannot talk to {where}: {exc or type(exc).__name__}")
    except (OSError, ValueError) as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted (a run already started goes on)", file=sys.stderr)
        return 130
    except Exception as exc:  # a crash must not read as a regression (exit 1)
        return _error(f"{type(exc).__name__}: {exc}")
    finally:
        if client is not None:
            client.close()


def _error(message: str) -> int:
    print(f"evalsite: {' '.join(message.split())}", file=sys.stderr)
    return gate.UNDECIDED


# --- the parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalsite",
        description="evalsite from the command line and CI. Reads EVALSITE_URL and "
        "EVALSITE_API_KEY. Exit codes: 0 ok, 1 regression, 2 could not decide or failed.",
    )
    parser.add_argument("--url", help="The site (default: $EVALSITE_URL).")
    parser.add_argument("--api-key", help="An API key (default: $EVALSITE_API_KEY).")
    parser.add_argument(
        "--http-timeout", type=float, default=60.0, help="Seconds per HTTP request (60)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="Run an evaluation and wait for it (optionally gate it).",
        description="Create a run of a testset x an application x evaluators, show its "
        "progress, wait for the end. With --file, the file's rows become a new version of "
        "--testset first (or a new testset).",
    )
    run.add_argument("--testset", required=True, help="Testset slug or id.")
    run.add_argument("--file", type=Path, help="CSV, JSON or JSONL rows to upload first.")
    run.add_argument("--testset-version", type=int, help="Version (default: the newest).")
    run.add_argument("--application", required=True, help="Application slug or id.")
    run.add_argument(
        "--evaluator",
        action="append",
        default=[],
        help="Evaluator slug, id or revision slug; repeat or comma-separate.",
    )
    run.add_argument("--name", default="", help="Run name.")
    run.add_argument("--description", default="")
    run.add_argument("--repeats", type=int, default=1)
    _tag_argument(run, "--tag", "A tag NAME=VALUE for the run (repeat): branch=main.")
    run.add_argument("--max-cost-usd", type=float, help="Refuse the run if projected over it.")
    run.add_argument(
        "--dry-run", action="store_true", help="Print the projected size and cost; start nothing."
    )
    run.add_argument("--no-wait", action="store_true", help="Start it and return at once.")
    run.add_argument("--timeout", type=float, help="Give up waiting after this many seconds.")
    _wait_arguments(run)
    baseline = run.add_mutually_exclusive_group()
    baseline.add_argument("--gate-baseline", type=int, help="Gate against this run id.")
    _tag_argument(
        baseline,
        "--gate-baseline-tag",
        "Gate against the latest finished run of the testset with these tags (repeat).",
    )
    _gate_arguments(run)
    run.set_defaults(func=cmd_run)

    gated = commands.add_parser(
        "gate",
        help="Compare a run with a baseline; exit 1 on a regression.",
        description="Compare a run with a baseline on chosen metrics with evalsite's paired "
        "tests. Exit 0: no regression; 1: a metric is worse; 2: could not decide.",
    )
    gated.add_argument("run", type=int, help="The candidate run's id.")
    baseline = gated.add_mutually_exclusive_group(required=True)
    baseline.add_argument("--baseline", type=int, help="The baseline run's id.")
    _tag_argument(
        baseline,
        "--baseline-tag",
        "The latest finished run of the same testset with these tags (repeat): branch=main.",
    )
    _wait_arguments(gated)
    _gate_arguments(gated)
    gated.set_defaults(func=cmd_gate)

    log = commands.add_parser(
        "log",
        help="Log a run from a JSONL file of {inputs, outputs, trace, scores} rows.",
        description="The SDK flow from a file: open a logged run, add one scenario per line "
        "(inputs, outputs, trace, scores, error; or index for a testset's row), close it.",
    )
    log.add_argument("--file", type=Path, required=True, help="JSONL rows; - for stdin.")
    log.add_argument("--name", default="")
    log.add_argument("--description", default="")
    log.add_argument("--testset", help="Log against this testset's rows (each line an index).")
    log.add_argument("--testset-version", type=int)
    log.add_argument("--application", help="A logged application (default: sdk, made if new).")
    log.add_argument("--evaluator", action="append", default=[], help="Evaluators in scores.")
    _tag_argument(log, "--tag", "A tag NAME=VALUE (repeat).")
    log.add_argument("--markdown", type=Path, help="Write the run's summary here.")
    log.set_defaults(func=cmd_log)

    runs = commands.add_parser("runs", help="List, show and tag runs.")
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="Runs, newest first.")
    listing.add_argument("--testset")
    listing.add_argument("--status")
    listing.add_argument("--search")
    _tag_argument(listing, "--tag", "Only runs with this tag NAME=VALUE (repeat).")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true", help="One JSON object per line.")
    listing.set_defaults(func=cmd_runs_list)
    show = actions.add_parser("show", help="A run's status and metrics.")
    show.add_argument("run", type=int)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_runs_show)
    tag = actions.add_parser("tag", help="Set (NAME=VALUE) or remove (--remove NAME) tags.")
    tag.add_argument("run", type=int)
    tag.add_argument("tags", nargs="*", metavar="NAME=VALUE", type=tag_parse)
    tag.add_argument("--remove", action="append", default=[], metavar="NAME")
    tag.set_defaults(func=cmd_runs_tag)

    testsets = commands.add_parser("testsets", help="Export a testset's rows.")
    actions = testsets.add_subparsers(dest="testsets_command", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="Write a version's rows (the newest by default).")
    export.add_argument("testset", help="Testset slug or id.")
    export.add_argument("--version", type=int)
    export.add_argument("--format", choices=["jsonl", "csv", "json"], default="jsonl")
    export.add_argument("--output", "-o", type=Path, help="A file (default: standard output).")
    export.set_defaults(func=cmd_testsets_export)

    evaluators_code.register(commands)
    return parser


def _tag_argument(group, flag: str, help: str) -> None:
    group.add_argument(flag, action="append", type=tag_parse, metavar="NAME=VALUE", help=help)


def _wait_arguments(parser) -> None:
    parser.add_argument(
        "--progress",
        choices=["auto", "bar", "lines", "none"],
        default="auto",
        help="auto: a bar on a terminal, plain lines otherwise (CI).",
    )
    parser.add_argument("--poll", type=float, default=2.0, help="Seconds between polls (2).")


def _gate_arguments(parser) -> None:
    parser.add_argument(
        "--metric",
        action="append",
        default=[],
        help="A metric (exact.success) or an evaluator slug (all its metrics); repeat. "
        "Default: every metric both runs share.",
    )
    parser.add_argument(
        "--min-pairs",
        type=int,
        default=gate.DEFAULT_MIN_PAIRS,
        help=f"Fewer paired scenarios than this: could not decide ({gate.DEFAULT_MIN_PAIRS}).",
    )
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=gate.DEFAULT_MAX_ERROR_RATE,
        help="An evaluator erroring on more of a run's scenarios than this fraction: could not "
        f"decide ({gate.DEFAULT_MAX_ERROR_RATE}).",
    )
    parser.add_argument(
        "--fail-on",
        choices=["worse", "inconclusive"],
        default="worse",
        help="worse: fail on a significant regression; inconclusive: also when not "
        "significantly equal-or-better.",
    )
    parser.add_argument(
        "--fail-on-flaky", action="store_true", help="Fail when the history finds flaky cases."
    )
    parser.add_argument("--markdown", type=Path, help="Write the Markdown summary here.")
    parser.add_argument("--junit", type=Path, help="Write JUnit XML here.")
    parser.add_argument(
        "--max-scenarios", type=int, default=50, help="Regressed scenarios listed (50)."
    )
    parser.add_argument(
        "--no-history", action="store_true", help="Skip the test-case history in the report."
    )


def tag_parse(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"a tag is NAME=VALUE, got {text!r}")
    return name.strip(), value


def _tags(pairs: list[tuple[str, str]] | None) -> dict[str, str]:
    return dict(pairs or [])


def _evaluators(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _out(text: str = "", stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)


# --- run -------------------------------------------------------------------------------------


def cmd_run(args, client: Client) -> int:
    project = client.project()
    links = reports.Links(client.url, project.slug)
    testset, version = args.testset, args.testset_version
    if args.file is not None:
        uploaded = client.testset_upload(testset, args.file)
        testset, version = uploaded.slug, uploaded.version
        _out(
            f"testset {uploaded.slug}: {args.file.name} uploaded as v{uploaded.version} "
            f"({uploaded.row_count} rows)"
        )
    fields = {
        "name": args.name or None,
        "description": args.description or None,
        "testset": testset,
        "testset_version": version,
        "application": args.application,
        "evaluators": _evaluators(args.evaluator),
        "repeats": args.repeats,
        "max_cost_usd": args.max_cost_usd,
    }
    estimate = client.run_estimate(**fields)
    _out(estimate_text(estimate))
    if args.dry_run:
        return gate.PASS
    if estimate.over_cap:
        raise Fail(
            f"refused: {_money(estimate.cost_usd)} projected, over the cap of "
            f"{_money(estimate.cap_usd)}; nothing was started"
        )
    run = client.run_create(**fields, tags=_tags(args.tag) or None)
    _out(f"run #{run.id} started: {links.run(run.id)}")
    if args.no_wait:
        return gate.PASS
    run = _wait(client, run, args, timeout=args.timeout)
    _out(run_summary(client, run))
    baseline_tags = _tags(args.gate_baseline_tag)
    if args.gate_baseline is None and not baseline_tags:
        _reports_of_run(client, run, links, args)
        return gate.PASS if run.status in FINISHED_STATUSES else gate.UNDECIDED
    return gate_and_report(client, run, args.gate_baseline, baseline_tags, args, links)


def _wait(client: Client, run: Run, args, timeout: float | None = None) -> Run:
    progress = Progress(stream=sys.stdout, mode=args.progress)
    try:
        return run_wait(client, run.id, progress=progress, poll=args.poll, timeout=timeout)
    except RunTimeout as exc:
        raise Fail(f"{exc}; it goes on (see it on the site)")


def _reports_of_run(client: Client, run: Run, links: reports.Links, args) -> None:
    if args.markdown:
        metrics = client.get(f"runs/{run.id}/metrics").get("run") or {}
        _write(args.markdown, reports.run_markdown(run, links, metrics))
    if args.junit:
        tables = list(client.scenario_tables(run.id))
        _write(args.junit, reports.junit_xml(run, tables, links))


def estimate_text(estimate: Estimate) -> str:
    lines = [
        f"estimate: {estimate.scenarios} scenarios x {estimate.repeats} repeat(s), "
        f"{estimate.cells} cells, {estimate.application_calls} application calls, "
        f"{estimate.judge_calls} judge calls"
        + (
            f", {estimate.tokens.total:,} tokens"
            if estimate.tokens and estimate.tokens.total
            else ""
        )
        + f", cost {_money(estimate.cost_usd)}"
    ]
    for step in estimate.steps:
        tokens = f", {step.tokens.total:,} tokens" if step.tokens and step.tokens.total else ""
        cost = f", {_money(step.cost_usd)}" if step.type == "annotation" and step.judge else ""
        lines.append(
            f"  {step.type} {step.key}: {step.cells} cells, {step.calls} calls{tokens}{cost}"
        )
        lines += [f"    {note}" for note in step.notes]
    caps = estimate.caps
    if caps.run is not None or caps.project is not None:
        over = "OVER THE CAP" if estimate.over_cap else "within the cap"
        lines.append(f"  caps: run {_cap(caps.run)}, project {_cap(caps.project)}: {over}")
    lines += [f"  {note}" for note in estimate.notes]
    return "\n".join(lines)


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def _cap(value: float | None) -> str:
    return "none" if value is None else f"${value:,.4f}"


def run_summary(client: Client, run: Run) -> str:
    errors = f", {run.error_cells} errored cells" if run.error_cells else ""
    lines = [f"run #{run.id} ended {run.status}: {run.scenario_count} scenarios{errors}"]
    metrics = client.get(f"runs/{run.id}/metrics").get("run") or {}
    for name, stats in reports.metric_rows(run, metrics):
        if stats.get("type") == "binary" and stats.get("rate") is not None:
            value = f"{stats['rate']:.1%}"
        elif stats.get("mean") is not None:
            value = f"{stats['mean']:.4g}"
        else:
            value = "–"
        failed = f", {stats['errors']} errors" if stats.get("errors") else ""
        lines.append(f"  {name}: {value} (n={stats.get('count', 0)}{failed})")
    return "\n".join(lines)


# --- gate ------------------------------------------------------------------------------------


def cmd_gate(args, client: Client) -> int:
    project = client.project()
    links = reports.Links(client.url, project.slug)
    run = client.run(args.run)
    if run.active:
        _out(f"run #{run.id} is {run.status}: waiting for it")
        run = _wait(client, run, args)
    return gate_and_report(client, run, args.baseline, _tags(args.baseline_tag), args, links)


def baseline_find(client: Client, candidate: Run, tags: dict[str, str]) -> Run | None:
    """The newest finished batch run of the candidate's testset with every one of ``tags``,
    created before the candidate (a later main run is not what the candidate changed)."""
    if candidate.testset is None:
        return None
    runs = client.runs(testset=candidate.testset.id, tags=tags)
    for i, run in enumerate(runs):
        if i >= BASELINE_SCAN:
            return None
        matches = all(run.tags.get(k) == v for k, v in tags.items())  # an older server ignores ?tag
        same = run.testset is not None and run.testset.id == candidate.testset.id
        older = run.id < candidate.id
        if older and same and matches and run.status in FINISHED_STATUSES:
            return run
    return None


def gate_and_report(
    client: Client,
    candidate: Run,
    baseline_id: int | None,
    baseline_tags: dict[str, str],
    args,
    links: reports.Links,
) -> int:
    options = gate.Options(
        metrics=args.metric,
        min_pairs=args.min_pairs,
        max_error_rate=args.max_error_rate,
        fail_on=args.fail_on,
        fail_on_flaky=args.fail_on_flaky,
    )
    baseline, comparison, history, note = None, None, None, ""
    if baseline_id is not None:
        baseline = _run_or_none(client, baseline_id)
        how, testset = f"run #{baseline_id}", None
        why = f"no baseline: there is no run #{baseline_id} in this project"
    else:
        wanted = ", ".join(f"{k}={v}" for k, v in baseline_tags.items())
        baseline = baseline_find(client, candidate, baseline_tags)
        testset = candidate.testset.slug if candidate.testset else None
        how = f"the latest finished run of testset {testset} tagged {wanted}"
        why = (
            f"no baseline: testset {testset} has no finished run tagged {wanted} "
            f"older than #{candidate.id}"
            if testset
            else f"no baseline: run #{candidate.id} is not over a testset"
        )
    if baseline is None:
        decision = gate.undecided(why, candidate_id=candidate.id)
    else:
        _out(f"gate: run #{candidate.id} against baseline #{baseline.id} ({how})")
        try:
            comparison = client.compare(
                baseline.id, candidate.id, filter="regressions", limit=min(args.max_scenarios, 500)
            )
        except ApiError as exc:
            if exc.status not in (400, 404):
                raise
            decision = gate.undecided(
                f"cannot compare: {exc.message}", baseline_id=baseline.id, candidate_id=candidate.id
            )
        else:
            history, note = _history(client, candidate, baseline, baseline_tags, args)
            decision = gate.decide(comparison, candidate, options, history, baseline)
    rows, count = _regressions(client, comparison, decision, args)
    _print_decision(decision, count, links)
    if args.markdown:
        text = reports.gate_markdown(
            decision,
            baseline=baseline,
            candidate=candidate,
            links=links,
            regressions=rows,
            regression_count=count,
            history=history,
            history_note=note,
        )
        _write(args.markdown, text)
    if args.junit:
        tables = list(client.scenario_tables(candidate.id))
        _write(args.junit, reports.junit_xml(candidate, tables, links, decision))
    return decision.code


def _run_or_none(client: Client, run_id: int) -> Run | None:
    try:
        return client.run(run_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _history(client: Client, candidate: Run, baseline: Run, tags: dict[str, str], args):
    """The regressed and flaky cases, over the runs with the baseline's tags (the history of
    main, say) ending at the candidate."""
    if args.no_history or candidate.testset is None:
        return None, "not asked for"
    try:
        history = client.history(
            candidate.testset.id,
            baseline=baseline.id,
            candidate=candidate.id,
            classes=["regressed", "flaky"],
            tags=tags,
        )
    except ApiError as exc:
        if exc.status == 404:
            return None, "not available on this server (GET /testsets/{ref}/history: 404)"
        return None, f"unavailable ({exc.message})"
    return history, ""


def _regressions(client: Client, comparison, decision: gate.Decision, args):
    """The regressed rows of the gated metrics (a page of them) and how many there are."""
    if comparison is None or not decision.metrics:
        return [], 0
    names = [v.name for v in decision.metrics]
    if len(names) == 1 and len(comparison.metrics) > 1:
        comparison = client.compare(
            comparison.baseline,
            decision.candidate_id,
            metric=names[0],
            filter="regressions",
            limit=min(args.max_scenarios, 500),
        )
    elif len(names) < len(comparison.metrics):  # several of the metrics: pick rows here
        comparison = client.compare(
            comparison.baseline, decision.candidate_id, filter="regressions", limit=500
        )
        rows = [r for r in comparison.rows if _regressed(r, decision)]
        return rows[: args.max_scenarios], len(rows)
    return comparison.rows[: args.max_scenarios], comparison.count


def _regressed(row, decision: gate.Decision) -> bool:
    cell = row.cell(decision.candidate_id)
    if cell is None:
        return False
    for verdict in decision.metrics:
        delta = cell.deltas.get(verdict.name)
        sign = 1 if verdict.metric.higher_is_better else -1
        if delta is not None and delta * sign < 0:
            return True
    return False


def _print_decision(decision: gate.Decision, regressions: int, links: reports.Links) -> None:
    for v in decision.metrics:
        m, test = v.metric, v.test
        _out(
            f"  {v.name}: baseline {reports.value_text(v.baseline and v.baseline.value, m)}, "
            f"candidate {reports.value_text(v.candidate and v.candidate.value, m)}, "
            f"delta {reports.delta_text(test and test.difference, m)} "
            f"{reports.interval_text(test and test.ci, m)}: "
            f"{'could not decide' if v.code == gate.UNDECIDED else test.verdict} "
            f"({gate.p_text(test and test.p_value)}, n={test.n if test else 0})"
        )
    if decision.baseline_id is not None and decision.metrics:
        _out(f"  regressed scenarios: {regressions}")
    _out(f"gate: {decision.outcome} (exit {decision.code})")
    for reason in decision.reasons:
        _out(f"  - {reason}")
    for note in decision.notes:
        _out(f"  note: {note}")


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    _out(f"wrote {path}", sys.stderr)


# --- log -------------------------------------------------------------------------------------


def cmd_log(args, client: Client) -> int:
    rows = list(_jsonl(args.file))
    project = client.project()
    links = reports.Links(client.url, project.slug)
    logged = LoggedRun(
        client,
        name=args.name,
        testset=args.testset,
        testset_version=args.testset_version,
        application=args.application,
        evaluators=_evaluators(args.evaluator),
        tags=_tags(args.tag) or None,
        description=args.description,
    )
    with logged:
        _out(f"run #{logged.run.id} opened: {links.run(logged.run.id)}")
        for row in rows:
            logged.log(
                inputs=row.get("inputs"),
                outputs=row.get("outputs", MISSING),
                trace=row.get("trace"),
                scores=row.get("scores"),
                error=row.get("error"),
                index=row.get("index"),
                duration_ms=row.get("duration_ms"),
            )
    run = logged.run
    _out(f"run #{run.id} closed: {logged.logged} scenarios logged")
    _out(run_summary(client, run))
    if args.markdown:
        metrics = client.get(f"runs/{run.id}/metrics").get("run") or {}
        _write(args.markdown, reports.run_markdown(run, links, metrics))
    return gate.PASS if run.status in FINISHED_STATUSES else gate.UNDECIDED


def _jsonl(path: Path):
    handle = sys.stdin if str(path) == "-" else path.open(encoding="utf-8")
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise Fail(f"{path}:{number}: not JSON ({exc})")
            if not isinstance(row, dict):
                raise Fail(f"{path}:{number}: a row is a JSON object")
            yield row


# --- testsets -------------------------------------------------------------------------------


def cmd_testsets_export(args, client: Client) -> int:
    if args.output is None:
        client.testset_export(
            args.testset, sys.stdout.buffer, format=args.format, version=args.version
        )
        sys.stdout.buffer.flush()
        return gate.PASS
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("wb") as out:
        client.testset_export(args.testset, out, format=args.format, version=args.version)
    _out(f"wrote {args.output}", sys.stderr)
    return gate.PASS


# --- runs ------------------------------------------------------------------------------------


def cmd_runs_list(args, client: Client) -> int:
    runs = client.runs(
        testset=args.testset, tags=_tags(args.tag), status=args.status, search=args.search
    )
    for i, run in enumerate(runs):
        if i >= args.limit:
            break
        if args.json:
            _out(run.model_dump_json())
            continue
        tags = " ".join(f"{k}={v}" for k, v in run.tags.items())
        testset = f"{run.testset.slug} v{run.testset.version}" if run.testset else "-"
        _out(f"#{run.id}\t{run.status}\t{testset}\t{run.name}\t{tags}")
    return gate.PASS


def cmd_runs_show(args, client: Client) -> int:
    run = client.run(args.run)
    if args.json:
        _out(run.model_dump_json(indent=2))
        return gate.PASS
    project = client.project()
    _out(f"{reports.Links(client.url, project.slug).run(run.id)}")
    _out(
        f"{run.name}: {run.status}, {run.progress:.0f}% ({run.done_cells}/{run.total_cells} cells)"
    )
    if run.tags:
        _out("tags: " + " ".join(f"{k}={v}" for k, v in run.tags.items()))
    if not run.active:
        _out(run_summary(client, run))
    return gate.PASS


def cmd_runs_tag(args, client: Client) -> int:
    run = client.run(args.run)
    tags: dict[str, Any] = dict(run.tags)
    for name in args.remove:
        tags.pop(name, None)
    tags.update(dict(args.tags))
    run = client.run_update(run.id, tags=tags)
    _out(f"run #{run.id}: " + (" ".join(f"{k}={v}" for k, v in run.tags.items()) or "no tags"))
    return gate.PASS


if __name__ == "__main__":
    sys.exit(main())
