"""Scale-out benchmark: one run of 50,000 rows x 2 evaluators (a built-in exact match and a Python
code evaluator) on 1, 2 and 4 worker "hosts", each a network namespace of its own with a CPU
quota, then a failure phase that SIGKILLs one host in the middle of a run.

    uv run python benchmarks/scaleout_bench.py [--rows 50000] [--hosts 1,2,4] [--cpu 0.2]
        [--chunk 250] [--no-kill-test] [--kill-at 0.3] [--kill-timeout 120] [--broker-db 7]
    smoke test:  uv run python benchmarks/scaleout_bench.py --rows 2000 --hosts 1,2
    after a crash:  uv run python benchmarks/hosts.py cleanup

Run it as root (namespaces, veth, a bridge, cgroups), with DATABASE_URL / CELERY_BROKER_URL (Redis)
pointing at servers on this machine. Each host ``evb-hN`` is a network namespace joined by a veth
pair to a bridge ``evb-br0`` (10.199.0.1/24, host N = .10+N) and a cgroup with ``--cpu`` CPUs
(cgroup v2 cpu.max, or v1 cpu.cfs_quota_us). Its one Celery worker (``-c 1``) reaches PostgreSQL
and Redis over the bridge through a small TCP forwarder on 10.199.0.1 (benchmarks/hosts.py),
never over loopback. One celery beat runs on the host side. Celery uses Redis database
``--broker-db`` (same server as CELERY_BROKER_URL), so no other worker steals the tasks; its keys
are removed at the end.

Throughput is measured like run_bench.py: from queueing the run to its status being final and its
metrics stored; the table gives evaluations/s and the speed-up against the first host count.
With 0.2 CPU per host, 4 hosts use 0.8 CPU of a 2-core machine, so PostgreSQL, Redis and the
forwarder keep what they need; at 0.4 CPU the 4-host phase saturates the machine (2 of 2 CPUs busy
while each host uses half its quota) and the figure says more about the machine than the engine.
Each phase prints the CPU each host used and how busy the whole machine was.
The failure phase SIGKILLs every process of the last host once --kill-at of the cells
are stored and measures the time until the WorkUnits it held are done again by the other
hosts and until the run finishes (capped by --kill-timeout), and checks every cell was stored once.
Everything is removed at the end (workers, beat, forwarder, namespaces, links, cgroups, the
throw-away project), on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

from benchmarks import hosts as hostlib  # noqa: E402  (plain standard library, no Django)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--hosts", default="1,2,4", help="host counts to measure, e.g. 1,2,4")
    parser.add_argument("--cpu", type=float, default=0.2, help="CPU quota of each host")
    parser.add_argument("--chunk", type=int, default=250, help="EVALSITE_RUN_CHUNK_SIZE")
    parser.add_argument("--subnet", default="10.199.0.0/24", help="private test range to create")
    parser.add_argument("--broker-db", type=int, default=7, help="Redis database for Celery")
    parser.add_argument("--kill-test", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--kill-hosts",
        type=int,
        default=0,
        help="hosts in the failure phase (default: the largest of --hosts, at least 2)",
    )
    parser.add_argument("--kill-at", type=float, default=0.3, help="kill when this share is done")
    parser.add_argument("--kill-timeout", type=float, default=120.0)
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="cap per measured run")
    args = parser.parse_args()
    args.host_counts = [int(n) for n in args.hosts.split(",") if n.strip()]
    if not args.host_counts or min(args.host_counts) < 1:
        parser.error("--hosts needs positive host counts, e.g. 1,2,4")
    return args


def _redis_db_url(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    if os.geteuid() != 0:
        raise SystemExit("needs root: it creates network namespaces, a bridge and cgroups")
    if not os.environ.get("DATABASE_URL"):
        raise SystemExit("set DATABASE_URL (a PostgreSQL on this machine the hosts can reach)")
    if not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"):
        raise SystemExit("set CELERY_BROKER_URL to a redis:// URL on this machine")
    # Celery of this process, the beat and every worker use their own Redis database.
    os.environ["CELERY_BROKER_URL"] = _redis_db_url(os.environ["CELERY_BROKER_URL"], ARGS.broker_db)
    os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"]
    os.environ["EVALSITE_RUN_CHUNK_SIZE"] = str(ARGS.chunk)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from evalsite.celery import QUEUES  # noqa: E402
from evalsite.celery import app as celery_app  # noqa: E402
from evalsite.models import Project  # noqa: E402
from evalsite.services import project_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create, run_start  # noqa: E402
from runs.models import Result, Run, Scenario, Trace, WorkUnit  # noqa: E402
from runs.testsets import testset_create  # noqa: E402

PYTHON = "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n"
ACTIVE = ("pending", "queued", "running")
FINAL_CELL = ("success", "error", "skipped", "cancelled")  # a Result's final statuses
LOCK = (
    Path("/run/lock" if Path("/run/lock").is_dir() else tempfile.gettempdir()) / "evb-scaleout.lock"
)
PROGRESS_EVERY = 5.0
BROKER_MARK = "evb-scaleout"  # marks the Redis database as this benchmark's until it ends


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S ") + message, flush=True)


def celery_command() -> list[str]:
    script = Path(sys.executable).parent / "celery"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def url_via(url: str, host: str, port: int) -> str:
    """``url`` with its host and port replaced (user, password, path and query kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def endpoint(url: str, default_port: int) -> tuple[str, int]:
    """The server's (host, port); it must listen on this machine's loopback, which is what the
    forwarder exposes to the hosts."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise SystemExit(
            f"{url.split('@')[-1]}: needs a TCP host (a unix socket cannot be forwarded)"
        )
    address = socket.gethostbyname(parts.hostname)
    if not ipaddress.ip_address(address).is_loopback:
        raise SystemExit(f"{parts.hostname} is not on this machine's loopback ({address})")
    return address, parts.port or default_port


@dataclass
class Phase:
    hosts: int
    seconds: float = 0.0
    cells: int = 0
    evaluations: int = 0
    status: str = ""
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="evb-scaleout-"))
        self.bridge = hostlib.Bridge(ipaddress.ip_network(args.subnet))
        self.hosts: list[hostlib.Host] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self.forwarder: subprocess.Popen | None = None
        self.side: hostlib.CpuCgroup | None = None
        self.beat: subprocess.Popen | None = None
        self.project: Project | None = None
        self.cleaned = False
        self.keep_logs = False
        self.db_url = os.environ["DATABASE_URL"]
        self.broker_url = os.environ["CELERY_BROKER_URL"]
        self.pg = endpoint(self.db_url, 5432)
        self.redis = endpoint(self.broker_url, 6379)

    # --- machinery ------------------------------------------------------------------------------

    def check_broker_db(self) -> None:
        """The Redis database must be empty, or marked as this benchmark's by an earlier run
        that could not clean up; then it is emptied and marked."""
        import redis

        client = redis.Redis.from_url(self.broker_url)
        if client.dbsize() and not client.exists(BROKER_MARK):
            raise SystemExit(
                f"Redis database {self.args.broker_db} is not empty and not this benchmark's: "
                "pick a free one with --broker-db"
            )
        self.clear_broker_db()
        client.set(BROKER_MARK, str(os.getpid()))

    def clear_broker_db(self) -> None:
        import redis

        client = redis.Redis.from_url(self.broker_url)
        keys = list(client.scan_iter(count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])

    def setup_network(self, count: int) -> None:
        self.bridge.create()
        log(f"bridge {hostlib.BRIDGE} {self.bridge.address}/{self.bridge.subnet.prefixlen}")
        for index in range(1, count + 1):
            host = hostlib.Host(index, self.bridge, self.args.cpu).create()
            self.hosts.append(host)
            log(
                f"host {host.name}: {host.address}, cgroup {host.cgroup.mode} "
                f"{host.cgroup.dirs[0]} quota {self.args.cpu} CPU"
            )
        bridge = self.bridge.address
        routes = [
            f"{bridge}:{self.pg[1]}={self.pg[0]}:{self.pg[1]}",
            f"{bridge}:{self.redis[1]}={self.redis[0]}:{self.redis[1]}",
        ]
        self.stats_file = self.tmp / "forwarder.json"
        # Host-side helpers (forwarder, beat) share a cgroup without a quota: whatever happens to
        # this process, the next start (or hosts.py cleanup) finds and ends them.
        self.side = hostlib.CpuCgroup(f"{hostlib.PREFIX}-side", None).create()
        self.forwarder = subprocess.Popen(
            self.side.command(
                [
                    sys.executable,
                    str(Path(hostlib.__file__)),
                    "forward",
                    *routes,
                    "--stats",
                    str(self.stats_file),
                    "--parent-pid",
                    str(os.getpid()),
                ]
            ),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.forwarder.stdout.readline().strip()
        if not line.startswith("forwarding"):
            raise RuntimeError(f"the forwarder did not start (exit {self.forwarder.poll()})")
        log(f"forwarder pid {self.forwarder.pid}: {line}")

    def worker_env(self) -> dict[str, str]:
        bridge = self.bridge.address
        return {
            **os.environ,
            "DATABASE_URL": url_via(self.db_url, bridge, self.pg[1]),
            "CELERY_BROKER_URL": url_via(self.broker_url, bridge, self.redis[1]),
            "REDIS_URL": url_via(self.broker_url, bridge, self.redis[1]),
            "EVALSITE_APPLICATIONS_ALLOW_PRIVATE": "1",
            "EVALSITE_RUN_CHUNK_SIZE": str(self.args.chunk),
            "PYTHONPATH": str(ROOT),
        }

    def check_hosts_reach_servers(self) -> None:
        """From inside every namespace: PostgreSQL and Redis answer on the bridge address, and
        the machine's loopback servers are out of reach (so nothing can take a shortcut)."""
        probe = (
            "import os, socket, psycopg, redis\n"
            "url = os.environ['DATABASE_URL']\n"
            "with psycopg.connect(url, connect_timeout=5) as c:\n"
            "    c.execute('select 1').fetchone()\n"
            "redis.Redis.from_url(os.environ['CELERY_BROKER_URL'], socket_timeout=5).ping()\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {self.pg[1]}), timeout=2).close()\n"
            "    print('LOOPBACK-REACHABLE')\n"
            "except OSError:\n"
            "    print('ok')\n"
        )
        env = self.worker_env()
        for host in self.hosts:
            done = subprocess.run(
                ["ip", "netns", "exec", host.name, sys.executable, "-c", probe],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode or done.stdout.strip() != "ok":
                raise RuntimeError(
                    f"{host.name} cannot use the servers through the bridge: "
                    f"{(done.stderr or done.stdout).strip()[-500:]}"
                )
            log(
                f"{host.name} ({host.address}): PostgreSQL and Redis answer via "
                f"{self.bridge.address}; loopback {self.pg[1]} unreachable inside the namespace"
            )

    def start_beat(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.tmp / "beat.log", "w") as output:
            self.beat = subprocess.Popen(
                self.side.command(
                    [
                        *celery_command(),
                        "-A",
                        "evalsite",
                        "beat",
                        "-l",
                        "warning",
                        "-s",
                        str(self.tmp / "beat-schedule"),
                        "--pidfile",
                        str(self.tmp / "beat.pid"),
                    ]
                ),
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        log(f"celery beat pid {self.beat.pid} (root namespace, loopback, for the failure phase)")

    def start_workers(self, count: int) -> None:
        queues = ",".join(q for q in QUEUES if q != "ingest")
        env = self.worker_env()
        for host in self.hosts[:count]:
            argv = [
                *celery_command(),
                "-A",
                "evalsite",
                "worker",
                "-Q",
                queues,
                "-c",
                "1",
                "-n",
                f"{host.name}@evb",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "warning",
            ]
            with open(self.tmp / f"{host.name}.log", "a") as output:
                self.workers[host.name] = subprocess.Popen(
                    host.command(argv),
                    cwd=ROOT,
                    env=env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        names = [f"{host.name}@evb" for host in self.hosts[:count]]
        started, last = time.monotonic(), 0.0
        while True:
            replies = celery_app.control.ping(destination=names, timeout=1.0) or []
            ready = {name for reply in replies for name in reply}
            if ready >= set(names):
                break
            for name, worker in self.workers.items():
                if worker.poll() is not None:
                    self.keep_logs = True
                    raise RuntimeError(
                        f"worker of {name} exited ({worker.returncode}); "
                        f"see {self.tmp / (name + '.log')}"
                    )
            if time.monotonic() - started > 180:
                self.keep_logs = True
                raise RuntimeError(f"workers not ready after 180 s: {sorted(set(names) - ready)}")
            if time.monotonic() - last > PROGRESS_EVERY:
                last = time.monotonic()
                log(f"  waiting for workers: {len(ready)}/{len(names)} answer ping")
        log(f"{count} worker(s) ready in {time.monotonic() - started:.1f} s")

    def stop_workers(self) -> None:
        for worker in self.workers.values():
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)  # warm shutdown: finish the current task
        deadline = time.monotonic() + 20
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=max(0.1, deadline - time.monotonic()))
        for host in self.hosts:
            host.kill()  # whatever is left in the cgroup (sandbox processes, a stuck worker)
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=5)
        self.workers.clear()

    def cleanup(self) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # finish cleaning up whatever arrives now
        log("cleaning up")
        steps = [
            ("workers", self.stop_workers),
            ("beat", lambda: _stop(self.beat)),
            ("forwarder", lambda: _stop(self.forwarder)),
            ("side cgroup", lambda: self.side and self.side.remove()),
            ("hosts", lambda: [h.remove() for h in self.hosts]),
            ("bridge", self.bridge.remove),
            ("broker keys", self.clear_broker_db),
            ("project rows", self.delete_project),
            ("leftovers", hostlib.cleanup_leftovers),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as exc:  # keep going: every other step still has to run
                print(f"  cleanup of {name} failed: {str(exc)[:300]}", file=sys.stderr)
        if self.keep_logs:
            print(f"  logs kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # --- data -----------------------------------------------------------------------------------

    def setup_project(self) -> None:
        stamp = time.strftime("%Y%m%d%H%M%S")
        self.project = project_create(
            name=f"scaleout {stamp}", slug=f"scaleout-{stamp}", owner=None
        )
        self.app = application_create(
            project=self.project, name="column", kind="column", config={"outputs_column": "outputs"}
        )
        self.revisions = [
            evaluator_create(project=self.project, kind="exact_match", name="exact").head,
            evaluator_create(
                project=self.project,
                kind="code",
                name="python",
                parameters={"runtime": "python", "code": PYTHON},
            ).head,
        ]
        started = time.perf_counter()
        self.testset = self.make_testset("bench rows", self.args.rows)
        log(f"testset of {self.args.rows:,} rows stored in {time.perf_counter() - started:.1f} s")
        warm = max(self.hosts_needed(), 1) * self.args.chunk
        self.warm_testset = self.make_testset("warm-up rows", warm)

    def make_testset(self, name: str, count: int):
        rows = [
            {
                "question": f"q{i}",
                "correct_answer": str(i % 10),
                "outputs": str(i % 10 if i % 4 else (i + 1) % 10),
            }
            for i in range(count)
        ]
        return testset_create(project=self.project, name=name, rows=rows)

    def new_run(self, testset) -> Run:
        return run_create(
            project=self.project,
            testset_version=testset.head,
            application=self.app,
            revisions=self.revisions,
        )

    def delete_project(self) -> None:
        if self.project is None:
            return
        started = time.perf_counter()
        self.delete_runs()
        Project.objects.filter(pk=self.project.pk).delete()
        log(f"throw-away project deleted in {time.perf_counter() - started:.1f} s")
        self.project = None

    def delete_runs(self) -> None:
        """The project's runs, then its traces (the invocations, their spans and annotations):
        what a run leaves behind once its cells are gone."""
        Run.objects.filter(project=self.project).delete()
        Trace.objects.filter(project=self.project).delete()

    def hosts_needed(self) -> int:
        needed = max(self.args.host_counts)
        if self.args.kill_test:
            needed = max(needed, self.kill_hosts())
        return needed

    def kill_hosts(self) -> int:
        return self.args.kill_hosts or max(2, max(self.args.host_counts))

    # --- measuring ------------------------------------------------------------------------------

    def wait_for_end(self, run: Run, label: str, timeout: float) -> float | None:
        """Seconds from now until the run is final with metrics stored; None on timeout."""
        started = last = time.perf_counter()
        last_done = 0
        while True:
            run.refresh_from_db(
                fields=["status", "done_cells", "total_cells", "metrics_refreshed_at"]
            )
            now = time.perf_counter()
            if run.status not in ACTIVE and run.metrics_refreshed_at:
                return now - started
            if now - started > timeout:
                return None
            if now - last >= PROGRESS_EVERY:
                rate = (run.done_cells - last_done) / (now - last)
                log(
                    f"  [{label}] {now - started:6.1f} s  {run.done_cells:,}/{run.total_cells:,} "
                    f"cells ({100 * run.done_cells / max(run.total_cells, 1):.1f} %), "
                    f"{rate:,.0f} cells/s, status {run.status}"
                )
                last, last_done = now, run.done_cells
            self.check_workers_alive()
            time.sleep(0.25)

    def check_workers_alive(self, except_for: str = "") -> None:
        for name, worker in self.workers.items():
            if name != except_for and worker.poll() is not None:
                self.keep_logs = True
                raise RuntimeError(
                    f"worker of {name} died ({worker.returncode}); see {self.tmp / (name + '.log')}"
                )

    def warm_up(self, count: int) -> None:
        run = self.new_run(self.warm_testset)
        run_start(run=run)
        if self.wait_for_end(run, f"warm-up {count}", 180) is None:
            raise RuntimeError("the warm-up run did not finish within 180 s: see the worker logs")
        Run.objects.filter(pk=run.pk).delete()

    def throughput(self, count: int) -> Phase:
        log(
            f"=== {count} host(s), {self.args.cpu} CPU each; load average "
            f"{os.getloadavg()[0]:.2f} ==="
        )
        self.start_workers(count)
        try:
            self.warm_up(count)
            run = self.new_run(self.testset)
            before = {h.name: h.cgroup.stats() for h in self.hosts[:count]}
            side_before, machine_before = self.side.stats(), machine_cpu()
            started = time.perf_counter()
            run_start(run=run)
            wall = self.wait_for_end(run, f"{count} host(s)", self.args.run_timeout)
            if wall is None:
                raise RuntimeError(f"the run did not finish within {self.args.run_timeout} s")
            wall = time.perf_counter() - started
            after = {h.name: h.cgroup.stats() for h in self.hosts[:count]}
            side_after, machine_after = self.side.stats(), machine_cpu()
        finally:
            self.stop_workers()
        phase = Phase(hosts=count, seconds=wall, status=run.status, cells=run.done_cells)
        phase.evaluations = Result.objects.filter(
            run=run, step_key__startswith="evaluator-", status="success"
        ).count()
        phase.cpu = {
            name: {k: after[name].get(k, 0) - v for k, v in before[name].items()} for name in before
        }
        log(
            f"{count} host(s): run {run.pk} {run.status} in {wall:.1f} s, {phase.cells:,} cells, "
            f"{phase.evaluations:,} evaluations -> {phase.evaluations / wall:,.0f} evaluations/s"
        )
        for name, cpu in phase.cpu.items():
            log(
                f"  {name}: {cpu.get('cpu_s', float('nan')):.1f} CPU s used "
                f"({cpu.get('cpu_s', 0) / wall:.2f} CPU), throttled {cpu.get('throttled_s', 0):.1f} s"
            )
        busy = (machine_after[0] - machine_before[0]) / max(machine_after[1] - machine_before[1], 1)
        side = side_after.get("cpu_s", 0) - side_before.get("cpu_s", 0)
        log(
            f"  whole machine: {busy * (os.cpu_count() or 1):.2f} of {os.cpu_count()} CPUs busy; "
            f"forwarder + beat {side / wall:.2f} CPU; the rest is PostgreSQL, Redis, this process "
            "and anything else running"
        )
        started = time.perf_counter()
        self.delete_runs()
        log(
            f"  (run rows, traces and annotations deleted in {time.perf_counter() - started:.1f} s)"
        )
        return phase

    def victim_units(self, host: hostlib.Host, run: Run) -> tuple[int, list[LostUnit]]:
        """What the host holds, read while its task processes are stopped (SIGSTOP) so nothing
        finishes in between (its main process still answers Celery's inspect). Returns how many
        tasks it has (active and reserved) and the units it holds: leased WorkUnit rows whose
        owner is one of its pids."""
        main = self.workers[host.name].pid
        pids = host.cgroup.pids()
        for pid in pids - {main}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        name = f"{host.name}@evb"
        inspect = celery_app.control.inspect(destination=[name], timeout=2.0)
        tasks = [
            task
            for call in (inspect.active, inspect.reserved)
            for task in (call() or {}).get(name) or []
        ]
        return len(tasks), leased_units(run, pids)

    def kill_test(self) -> None:
        count = self.kill_hosts()
        victim = self.hosts[count - 1]
        log(
            f"=== failure phase: {count} hosts, SIGKILL {victim.name} at "
            f"{100 * self.args.kill_at:.0f} % ==="
        )
        # The engine's periodic recovery (beat) is needed here only. It acts on every run in the
        # database, so it does not run during the throughput phases.
        self.start_beat()
        self.start_workers(count)
        self.warm_up(count)
        run = self.new_run(self.testset)
        started = time.perf_counter()
        run_start(run=run)
        last, asked_since = started, None
        while True:
            run.refresh_from_db(fields=["status", "done_cells", "total_cells", "scenario_count"])
            if run.status not in ACTIVE:
                raise RuntimeError("the run ended before the host could be killed: more --rows")
            if run.total_cells and run.done_cells >= self.args.kill_at * run.total_cells:
                asked_since = asked_since or time.perf_counter()
                held, units = self.victim_units(victim, run)
                if units or (held and time.perf_counter() - asked_since > 5):
                    break  # it holds work: kill it now, while it is still stopped
                if time.perf_counter() - asked_since > 20:
                    break  # never seen holding anything: kill it anyway
                for pid in victim.cgroup.pids():  # between two tasks: let it take the next
                    os.kill(pid, signal.SIGCONT)
            if time.perf_counter() - last > PROGRESS_EVERY:
                last = time.perf_counter()
                log(f"  [kill] {run.done_cells:,}/{run.total_cells:,} cells")
            self.check_workers_alive()
            time.sleep(0.2)
        killed_at = time.perf_counter()
        signalled = victim.kill()
        self.workers.pop(victim.name).wait(timeout=10)
        held_text = (
            f"it held {', '.join(str(u) for u in units)}"
            if units
            else f"it held {held} task(s) but no unit this benchmark can name"
        )
        log(
            f"killed {victim.name} ({signalled} processes) {killed_at - started:.1f} s into the "
            f"run at {run.done_cells:,}/{run.total_cells:,} cells; {held_text}"
        )

        expected = sum(unit.expected for unit in units)

        def cells_redone() -> int:
            return sum(min(unit.stored(), unit.expected) for unit in units)

        redone_at = finished_at = None
        last = changed_at = time.perf_counter()
        seen_done = run.done_cells
        while time.perf_counter() - killed_at < self.args.kill_timeout:
            now = time.perf_counter()
            run.refresh_from_db(
                fields=["status", "done_cells", "total_cells", "metrics_refreshed_at"]
            )
            done = cells_redone() if units else 0
            if units and redone_at is None and done >= expected:
                redone_at = now
                log(f"  killed host's units done again at +{now - killed_at:.1f} s")
            if run.status not in ACTIVE and run.metrics_refreshed_at:
                finished_at = now
                break
            if run.done_cells != seen_done:
                seen_done, changed_at = run.done_cells, now
            if now - last >= PROGRESS_EVERY:
                mine = f", killed host's cells stored {done:,}/{expected:,}" if units else ""
                log(
                    f"  [after kill +{now - killed_at:5.1f} s] {run.done_cells:,}/"
                    f"{run.total_cells:,} cells{mine}, status {run.status}"
                )
                last = now
            self.check_workers_alive(except_for=victim.name)
            time.sleep(0.25)
        ended = time.perf_counter()
        self.stop_workers()
        _stop(self.beat)
        if finished_at is not None:
            after = finished_at - killed_at
            if redone_at is not None:
                print(
                    f"killed host's units redone in {redone_at - killed_at:.1f} s; run finished "
                    f"{after:.1f} s after the kill (status {run.status})"
                )
            else:  # the run cannot end before they are: an upper bound
                print(
                    f"killed host's units redone in {after:.1f} s at most: the run finished "
                    f"{after:.1f} s after the kill (status {run.status})"
                )
            stored = Result.objects.filter(run=run).count()
            once = "yes" if stored == run.total_cells == run.done_cells else "NO"
            print(
                f"every cell stored exactly once: {once} ({stored:,} results, {run.total_cells:,} cells)"
            )
        else:
            missing = run.total_cells - run.done_cells
            idle = ended - changed_at
            stuck = (
                f"; no cell stored since +{changed_at - killed_at:.0f} s after the kill (the "
                f"surviving hosts had nothing left to do for the last {idle:.0f} s)"
                if idle > 10
                else ""
            )
            mine = f"{cells_redone():,}/{expected:,} of its cells stored, " if units else ""
            print(
                f"killed host's units NOT redone within --kill-timeout {self.args.kill_timeout:.0f}"
                f" s: did not recover in time. {mine}run {run.status} at "
                f"{run.done_cells:,}/{run.total_cells:,} cells ({missing:,} missing){stuck}."
            )
            print(f"  recovery settings of this engine: {engine_settings()}")

    def forwarder_report(self) -> None:
        try:
            stats = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return
        print("forwarder traffic by client (every host came through the bridge):")
        for key, counter in sorted(stats.items()):
            port, client = key.split()
            print(
                f"  {client:>15} -> :{port:<5} {counter['connections']:5} connections  "
                f"{counter['bytes_in'] / 1e6:8.1f} MB in  {counter['bytes_out'] / 1e6:8.1f} MB out"
            )


class LostUnit:
    """Scenarios ``first..last`` of a run that the killed host held (a leased WorkUnit's). Redone when all their cells are stored with a final status: counted from
    the cells, since an engine may mark scenarios before (or without) storing every cell."""

    def __init__(self, run: Run, first: int, last: int, label: str = "chunk"):
        self.run, self.first, self.last, self.label = run, first, last, label
        scenarios = Scenario.objects.filter(run=run, index__gte=first, index__lte=last).count()
        self.expected = scenarios * (run.total_cells // max(run.scenario_count, 1))

    def stored(self) -> int:
        return Result.objects.filter(
            run=self.run,
            scenario__index__gte=self.first,
            scenario__index__lte=self.last,
            status__in=FINAL_CELL,
        ).count()

    def __str__(self) -> str:
        return f"{self.label} {self.first}..{self.last} ({self.last - self.first + 1} scenarios)"


def leased_units(run: Run, pids: set[int]) -> list[LostUnit]:
    """The run's leased WorkUnit rows whose owner (``host:pid:token``) is one of ``pids``."""
    rows = WorkUnit.objects.filter(run=run, status="leased").values(
        "lane", "first", "last", "owner"
    )
    mine = []
    for row in rows:
        parts = str(row["owner"]).split(":")
        if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids:
            mine.append(LostUnit(run, row["first"], row["last"], f"{row['lane']} unit"))
    return mine


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def engine_settings() -> str:
    """The settings that decide when lost work is redone (whatever this engine calls them)."""
    found = [
        f"{name}={getattr(settings, name)}"
        for name in sorted(dir(settings))
        if name.startswith(("EVALSITE_RUN_", "EVALSITE_UNIT_")) or "LEASE" in name
    ]
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    if "visibility_timeout" in options:
        found.append(f"broker visibility_timeout={options['visibility_timeout']}")
    for entry, spec in (getattr(settings, "CELERY_BEAT_SCHEDULE", {}) or {}).items():
        found.append(f"beat {entry} every {spec.get('schedule')} s")
    return ", ".join(found) or "none found"


def _stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = ARGS
    lock = open(LOCK, "w")  # noqa: SIM115 (held until the process exits)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another scale-out benchmark holds {LOCK}")
    removed = hostlib.cleanup_leftovers()
    if removed:
        log(f"removed leftovers of an earlier run: {', '.join(removed)}")
    # Throw-away projects of an earlier run that was killed before it could delete them (the lock
    # above guarantees no other instance is using them).
    for project in Project.objects.filter(
        slug__startswith="scaleout-", name__startswith="scaleout "
    ):
        Run.objects.filter(project=project).delete()
        Trace.objects.filter(project=project).delete()
        project.delete()
        log(f"deleted the throw-away project {project.slug} of an earlier run")
    others = Run.objects.filter(status__in=("queued", "running")).count()
    if others:
        log(
            f"note: {others} other run(s) are queued/running in this database; during the "
            "failure phase the beat started here may send their stalled work to these workers"
        )

    bench = Bench(args)
    atexit.register(bench.cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    phases: list[Phase] = []
    try:
        bench.check_broker_db()
        bench.setup_network(bench.hosts_needed())
        bench.check_hosts_reach_servers()
        bench.setup_project()
        for count in args.host_counts:
            phases.append(bench.throughput(count))
        base = phases[0]
        print()
        print(
            f"{args.rows:,} rows x 2 evaluators, chunk {args.chunk}, {args.cpu} CPU per host, "
            f"{os.cpu_count()} cores"
        )
        print(
            f"{'hosts':>5} {'CPU':>5} {'seconds':>9} {'cells/s':>9} {'evaluations/s':>14} "
            f"{'speed-up':>9}  status"
        )
        for p in phases:
            rate = p.evaluations / p.seconds
            speedup = rate / (base.evaluations / base.seconds)
            print(
                f"{p.hosts:>5} {p.hosts * args.cpu:>5.1f} {p.seconds:>9.1f} "
                f"{p.cells / p.seconds:>9,.0f} {rate:>14,.0f} {speedup:>8.2f}x  {p.status}"
            )
        if base.hosts != 1:
            print(f"(speed-up against {base.hosts} hosts)")
        print()
        if args.kill_test:
            bench.kill_test()
            print()
        bench.forwarder_report()
        print(
            f"database {settings.DATABASES['default']['HOST']} via {bench.bridge.address}, "
            f"broker db {args.broker_db}"
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130)
    except Exception:
        bench.keep_logs = True
        raise
    finally:
        bench.cleanup()


if __name__ == "__main__":
    main()
