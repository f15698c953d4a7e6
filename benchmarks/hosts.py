"""Throw-away worker "hosts" on one Linux machine, for benchmarks/scaleout_bench.py (needs root).

A host is a network namespace of its own (``evb-h1``, ``evb-h2``, ...) joined by a veth pair to
a bridge created on the host side (``evb-br0``, 10.199.0.1/24 by default; host N gets .10+N),
plus a CPU cgroup with a quota (cgroup v2 ``cpu.max``, or cgroup v1 ``cpu.cfs_quota_us`` where
the cpu controller is still on v1). A host cannot reach the machine's loopback, so PostgreSQL and
Redis (which listen on 127.0.0.1 only) are reached through ``forward``: a small asyncio TCP
forwarder bound to the bridge address, run as a child process:

    python benchmarks/hosts.py forward 10.199.0.1:5432=127.0.0.1:5432 \
        10.199.0.1:6379=127.0.0.1:6379 [--stats FILE] [--parent-pid PID]

It exits when its parent dies and keeps per-client counters (connections, bytes) in --stats, so
a benchmark can show that every host really came through the bridge.

Everything created here carries the ``evb`` prefix; ``cleanup_leftovers()`` removes what a
killed benchmark left behind (it kills only processes inside ``evb-*`` cgroups).
No Django here: the module is plain standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "evb"
BRIDGE = f"{PREFIX}-br0"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (ip, ...); raise with its stderr when it fails and ``check`` is set."""
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}")
    return done


# --- CPU cgroups --------------------------------------------------------------------------------


def _v1_mount(controller: str) -> Path | None:
    """Where the cgroup v1 hierarchy carrying ``controller`` is mounted (None: not on v1)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return Path(parts[1])
    return None


def cgroup_mode() -> str:
    """``v2`` when the unified hierarchy at /sys/fs/cgroup has the cpu controller, ``v1`` when a
    v1 ``cpu`` hierarchy is mounted, else an error naming what is missing."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2"
    if _v1_mount("cpu"):
        return "v1"
    raise RuntimeError("no cpu cgroup controller: neither cgroup v2 with cpu nor a v1 cpu mount")


@dataclass
class CpuCgroup:
    """A cgroup limited to ``cpus`` CPUs (None: no limit, a group only to find and kill its
    processes). ``dirs[0]`` carries the quota; on v1 a separate cpuacct hierarchy (when there is
    one) is joined too, for the CPU time actually used."""

    name: str
    cpus: float | None
    mode: str = field(default_factory=cgroup_mode)
    dirs: list[Path] = field(default_factory=list)

    def create(self) -> CpuCgroup:
        quota = max(1000, int(self.cpus * PERIOD_US)) if self.cpus else -1
        if self.mode == "v2":
            subtree = CGROUP_ROOT / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu")
            path = CGROUP_ROOT / self.name
            path.mkdir(exist_ok=True)
            (path / "cpu.max").write_text(f"{quota if quota > 0 else 'max'} {PERIOD_US}")
            self.dirs = [path]
        else:
            cpu = _v1_mount("cpu")
            path = cpu / self.name
            path.mkdir(exist_ok=True)
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
            self.dirs = [path]
            acct = _v1_mount("cpuacct")
            if acct and acct != cpu:
                (acct / self.name).mkdir(exist_ok=True)
                self.dirs.append(acct / self.name)
        return self

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` started by a shell that first moves itself into this cgroup, then execs (so
        a Popen of it has argv's pid, and everything argv forks stays in the cgroup)."""
        join = " && ".join(f'echo $$ > "{d / "cgroup.procs"}"' for d in self.dirs)
        return ["sh", "-c", f'{join} && exec "$@"', "sh", *argv]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return found

    def kill(self, timeout: float = 10.0) -> int:
        """SIGKILL every process in the cgroup (``cgroup.kill`` on v2; on v1 a loop until empty,
        which also catches children forked meanwhile). Returns how many pids were signalled."""
        killed: set[int] = set()
        kill_file = self.dirs[0] / "cgroup.kill" if self.dirs else None
        if kill_file is not None and kill_file.exists():
            killed |= self.pids()
            kill_file.write_text("1")
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return len(killed)

    def stats(self) -> dict[str, float]:
        """CPU seconds used and seconds throttled so far (what is available in this mode)."""
        out: dict[str, float] = {}
        for d in self.dirs:
            stat = d / "cpu.stat"
            if stat.exists():
                values = dict(line.split() for line in stat.read_text().splitlines() if line)
                if "usage_usec" in values:
                    out["cpu_s"] = int(values["usage_usec"]) / 1e6
                if "throttled_usec" in values:
                    out["throttled_s"] = int(values["throttled_usec"]) / 1e6
                elif "throttled_time" in values:
                    out["throttled_s"] = int(values["throttled_time"]) / 1e9
            usage = d / "cpuacct.usage"
            if usage.exists():
                out["cpu_s"] = int(usage.read_text()) / 1e9
        return out

    def remove(self) -> None:
        if self.pids():
            self.kill()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


# --- network ------------------------------------------------------------------------------------


def check_subnet_free(subnet: ipaddress.IPv4Network) -> None:
    """Refuse a test range that any interface of this machine already uses."""
    for line in sh("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        cidr = parts[parts.index("inet") + 1]
        if ipaddress.ip_interface(cidr).network.overlaps(subnet) and parts[1] != BRIDGE:
            raise RuntimeError(f"{subnet} is already used on {parts[1]} ({cidr}); pick --subnet")


@dataclass
class Bridge:
    subnet: ipaddress.IPv4Network

    @property
    def address(self) -> str:
        return str(self.subnet.network_address + 1)

    def create(self) -> Bridge:
        check_subnet_free(self.subnet)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        return self

    def remove(self) -> None:
        sh("ip", "link", "del", BRIDGE, check=False)


@dataclass
class Host:
    """Network namespace ``evb-hN`` with address .10+N on the bridge, and its CPU cgroup."""

    index: int
    bridge: Bridge
    cpus: float
    cgroup: CpuCgroup | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}-h{self.index}"

    @property
    def address(self) -> str:
        return str(self.bridge.subnet.network_address + 10 + self.index)

    def create(self) -> Host:
        outside, inside = f"{self.name}h", f"{self.name}n"
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        sh("ip", "link", "set", inside, "netns", self.name)
        sh("ip", "link", "set", outside, "master", BRIDGE, "up")
        prefix = self.bridge.subnet.prefixlen
        sh("ip", "-n", self.name, "addr", "add", f"{self.address}/{prefix}", "dev", inside)
        sh("ip", "-n", self.name, "link", "set", inside, "up")
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        self.cgroup = CpuCgroup(self.name, self.cpus).create()
        return self

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host: a shell that moves itself into the cgroup, then
        ``ip netns exec`` (which execs too, so the returned Popen pid is argv's process)."""
        assert self.cgroup is not None
        return self.cgroup.command(["ip", "netns", "exec", self.name, *argv])

    def kill(self) -> int:
        return self.cgroup.kill() if self.cgroup else 0

    def remove(self) -> None:
        if self.cgroup:
            self.cgroup.remove()
        sh("ip", "netns", "del", self.name, check=False)
        sh("ip", "link", "del", f"{self.name}h", check=False)


def cleanup_leftovers() -> list[str]:
    """Remove every ``evb-*`` cgroup (killing what runs in it), namespace and link that an earlier
    benchmark left behind. Returns what it removed."""
    removed = []
    mounts = [CGROUP_ROOT] + [m for c in ("cpu", "cpuacct") if (m := _v1_mount(c))]
    for mount in dict.fromkeys(mounts):
        for path in sorted(mount.glob(f"{PREFIX}-*")):
            if path.is_dir():
                group = CpuCgroup(path.name, 1.0, mode="v1", dirs=[path])
                group.remove()
                removed.append(str(path))
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-"):
            sh("ip", "netns", "del", name, check=False)
            removed.append(f"netns {name}")
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{PREFIX}-"):
            sh("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed


# --- TCP forwarder ------------------------------------------------------------------------------


class Forwarder:
    """listen address -> target address, one asyncio task pair per connection."""

    def __init__(self, routes: list[tuple[str, int, str, int]], stats_path: str | None):
        self.routes = routes
        self.stats_path = stats_path
        # "listen_port client_ip" -> {connections, open, bytes_in, bytes_out}
        self.stats: dict[str, dict[str, int]] = {}
        self.writers: set[asyncio.StreamWriter] = set()

    async def _pipe(self, reader, writer, counter: dict[str, int], key: str) -> None:
        try:
            while data := await reader.read(256 * 1024):
                counter[key] += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r, client_w, target_host: str, target_port: int, port: int):
        peer = (client_w.get_extra_info("peername") or ("?",))[0]
        counter = self.stats.setdefault(
            f"{port} {peer}", {"connections": 0, "open": 0, "bytes_in": 0, "bytes_out": 0}
        )
        counter["connections"] += 1
        try:
            target_r, target_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        counter["open"] += 1
        self.writers |= {client_w, target_w}
        try:
            await asyncio.gather(
                self._pipe(client_r, target_w, counter, "bytes_in"),
                self._pipe(target_r, client_w, counter, "bytes_out"),
            )
        except asyncio.CancelledError:
            pass  # shutting down: end quietly
        finally:
            counter["open"] -= 1
            self.writers -= {client_w, target_w}

    def write_stats(self) -> None:
        if self.stats_path:
            tmp = f"{self.stats_path}.tmp"
            Path(tmp).write_text(json.dumps(self.stats))
            os.replace(tmp, self.stats_path)

    async def serve(self, parent_pid: int | None) -> None:
        servers = []
        for listen_host, listen_port, target_host, target_port in self.routes:

            async def handler(r, w, th=target_host, tp=target_port, lp=listen_port):
                await self._handle(r, w, th, tp, lp)

            servers.append(
                await asyncio.start_server(handler, listen_host, listen_port, reuse_address=True)
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        print("forwarding " + ", ".join(f"{a}:{b} -> {c}:{d}" for a, b, c, d in self.routes))
        sys.stdout.flush()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            self.write_stats()
            if parent_pid and os.getppid() != parent_pid:
                break  # the benchmark died: do not outlive it
        for server in servers:
            server.close()
        for writer in list(self.writers):
            writer.close()  # every pipe ends, every connection handler returns
        await asyncio.sleep(0.2)
        self.write_stats()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description="TCP forwarder for the scale-out benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    forward = sub.add_parser("forward", help="LISTEN_HOST:PORT=TARGET_HOST:PORT ...")
    forward.add_argument("routes", nargs="+")
    forward.add_argument("--stats")
    forward.add_argument("--parent-pid", type=int)
    sub.add_parser("cleanup", help="remove evb-* namespaces, links and cgroups left behind")
    args = parser.parse_args()
    if args.command == "cleanup":
        print("\n".join(cleanup_leftovers()) or "nothing to remove")
        return
    routes = []
    for route in args.routes:
        listen, _, target = route.partition("=")
        routes.append((*_address(listen), *_address(target)))
    asyncio.run(Forwarder(routes, args.stats).serve(args.parent_pid))


if __name__ == "__main__":
    main()
