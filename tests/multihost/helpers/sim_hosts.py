"""Simulated hosts on one machine, for tests that must cross a host boundary (issue 16).

Each simulated host is a Linux network namespace with one interface, ``eth0``, its own address in
10.231.0.0/24, and its own hostname (a UTS namespace, made per process by the launcher wrapper
``netns_rsh`` next to this file). A "switch" namespace holds a bridge; a veth pair joins each host's
``eth0`` to a port of the bridge. mpiexec runs in one more namespace, the "launcher" host (address .254,
also an ``eth0`` on the bridge, hostname ``launcher``), not in the switch: hydra hands its ``-iface`` to
every proxy, so the interface it names must exist under that name in every namespace that runs a hydra
process, and the launcher then stays reachable from every host whose own link is up (a host whose link is
cut loses only its own ranks, as a real node would).

Every interface and address lives in namespaces made here: nothing is added to the root namespace (the
veths are created inside the switch namespace with their peer born in the host's). Names carry the test
process's pid (``slh<pid>x<n>-h0``...): parallel runs do not collide, and namespaces whose pid is gone
(an aborted run) are removed, with their processes, by the next run (``remove_stale``).

Limits of the simulation, and what the fixture does about them:
- The hosts share one kernel, one /dev/shm and one boot id. UCX (MPICH's network module here) identifies a
  machine by its boot id, so it would move data between the simulated hosts through shared memory (cma,
  posix), past the links: the cluster's environment sets ``UCX_TLS=tcp,self`` and ``UCX_NET_DEVICES=eth0``
  so traffic between hosts crosses the veths and a cut link really cuts it. Ranks of one host still talk
  through MPICH's own shared memory (hydra tells each rank which ranks share its host).
- /dev/shm is shared by all hosts: anything keyed by a shared-memory name must be unique machine-wide
  (tests check that nothing is left there).
- Abstract Unix sockets are per network namespace, as on separate machines.

``slow_links(hosts, rate, delay)`` shapes the hosts' links with ``tc netem``, or only their rate with ``tbf``
where the kernel has no netem (as on our CI machines).

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2's ``ip`` and util-linux's ``unshare``; ``why_not()``
says what is missing, for a precise skip.
"""
from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "10.231.0"  # /24: host i is .(i+1), the launcher .254
LAUNCHER_ADDRESS = f"{SUBNET}.254"
IFACE = "eth0"  # the name of every namespace's one interface (hydra's -iface)
PREFIX = "slh"  # namespace names: slh<pid>x<n>-<role>
WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_rsh")
PREFIX_VAR = "SINGA_LITE_SIM_PREFIX"  # tells netns_rsh the namespaces' common prefix
# The environment a simulated cluster adds to its jobs: see the module docstring (UCX and the boot id).
SIM_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": IFACE}
_counter = itertools.count()


def ip(*args, check=True, ns=None) -> subprocess.CompletedProcess:
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def why_not() -> str | None:
    """Why simulated hosts cannot be made here (None when they can): the reason a test is skipped with."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return (f"simulated hosts need root (ip netns, veth, bridge, unshare --uts); running as uid {os.geteuid()}: "
                f"run as root, as CI does")
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` on PATH (iproute2 / util-linux)"
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/uts"):
        return "this kernel has no network or UTS namespaces (/proc/self/ns/net, /proc/self/ns/uts)"
    probe = f"{PREFIX}{os.getpid()}x0-probe"  # removed by remove_stale() if this process dies meanwhile
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    try:
        for args in (("link", "add", "br0", "type", "bridge"), ("link", "add", "v0", "type", "veth", "peer", "name",
                                                                "v1")):
            done = ip(*args, ns=probe, check=False)
            if done.returncode != 0:
                return f"`ip {' '.join(args)}` fails in a network namespace: {done.stderr.strip()}"
        uts = subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True, text=True, timeout=30)
        if uts.returncode != 0:
            return f"`unshare --uts` fails here: {uts.stderr.strip()}"
    finally:
        ip("netns", "delete", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace_processes(ns: str, wait_s: float = 5.0) -> list:
    """SIGKILLs every process inside network namespace `ns`; returns their pids once they are gone (or after
    `wait_s`)."""
    found = ip("netns", "pids", ns, check=False).stdout.split()
    pids = [int(p) for p in found if p.isdigit() and int(p) != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and ip("netns", "pids", ns, check=False).stdout.split():
        time.sleep(0.02)
    return pids


def delete_namespace(ns: str) -> None:
    kill_namespace_processes(ns)
    ip("netns", "delete", ns, check=False)


def remove_stale() -> list:
    """Deletes the namespaces (and kills the processes) of earlier runs whose process is gone; returns them."""
    listed = ip("netns", "list", check=False).stdout
    stale = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(rf"{PREFIX}(\d+)x\d+-\w+", name)
        if found and not _pid_alive(int(found.group(1))):
            delete_namespace(name)
            stale.append(name)
    return stale


class SimCluster:
    """`n` simulated hosts h0 .. h<n-1> joined by a bridge, and a launcher namespace; see the module docstring.
    Use as a context manager (or call close()): everything it made is removed, its processes killed."""

    def __init__(self, n: int = 2):
        if n < 1 or n > 200:
            raise ValueError(f"a simulated cluster has 1 to 200 hosts, got {n}")
        self.prefix = f"{PREFIX}{os.getpid()}x{next(_counter)}-"
        self.hosts = [f"h{i}" for i in range(n)]
        self.address = {h: f"{SUBNET}.{i + 1}" for i, h in enumerate(self.hosts)}
        self.address["launcher"] = LAUNCHER_ADDRESS
        self.switch = self.prefix + "sw"
        self.namespaces = []  # everything made so far, removed by close()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def ns(self, host: str) -> str:
        """The network namespace of `host` (h0 ..., or "launcher")."""
        return self.prefix + host

    def port(self, host: str) -> str:
        """The bridge-side end of `host`'s link, in the switch namespace."""
        return f"p{host}"

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("link", "set", "lo", "up", ns=name)

    def _build(self) -> None:
        self._add_ns(self.switch)
        ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        ip("link", "set", "br0", "up", ns=self.switch)
        for host in [*self.hosts, "launcher"]:
            ns = self.ns(host)
            self._add_ns(ns)
            # Born inside the switch namespace, its peer inside the host's: never in the root namespace.
            ip("link", "add", self.port(host), "type", "veth", "peer", "name", IFACE, "netns", ns, ns=self.switch)
            ip("link", "set", self.port(host), "master", "br0", "up", ns=self.switch)
            ip("addr", "add", f"{self.address[host]}/24", "dev", IFACE, ns=ns)
            ip("link", "set", IFACE, "up", ns=ns)

    # ----- running things
    def env(self, base: dict | None = None) -> dict:
        """The environment for a job on this cluster: `base` (default os.environ) without the variables of an
        enclosing launcher, plus the cluster's (SIM_ENV, the wrapper's prefix)."""
        base = dict(os.environ if base is None else base)
        for k in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "HYDRA_CONTROL_FD"):
            base.pop(k, None)
        return {**base, **SIM_ENV, PREFIX_VAR: self.prefix}

    def hostfile(self, path, slots: int = 2, form: str = "colon") -> str:
        """Writes an MPICH hostfile giving each host `slots` ranks (``h0:2`` lines); returns its path."""
        if form != "colon":
            raise ValueError(f"hostfile form must be 'colon', got {form!r}")
        with open(path, "w") as f:
            f.write("".join(f"{h}:{slots}\n" for h in self.hosts))
        return str(path)

    def mpiexec_command(self, hostfile: str, n: int, argv: list, mpiexec: str | None = None) -> list:
        """The command that runs `argv` on `n` ranks over the hostfile's hosts, mpiexec in the launcher host."""
        mpiexec = mpiexec or os.path.join(os.path.dirname(sys.executable), "mpiexec")
        return ["ip", "netns", "exec", self.ns("launcher"), WRAPPER, "--here", "launcher",
                mpiexec, "-launcher", "rsh", "-launcher-exec", WRAPPER, "-iface", IFACE, "-f", hostfile,
                "-n", str(n), *argv]

    def popen(self, command: list, env: dict | None = None, **kw) -> subprocess.Popen:
        """Starts `command` in its own session (so a test can kill the whole process group)."""
        return subprocess.Popen(command, env=self.env() if env is None else env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)

    def run(self, command: list, timeout: float, env: dict | None = None, **kw) -> tuple:
        """Runs `command` (e.g. mpiexec_command(...)) to its end, at most `timeout` seconds: then its process
        group and every process in the cluster are killed and TimeoutError raised with what it printed.
        Returns (exit code, stdout + stderr, seconds)."""
        start = time.monotonic()
        proc = self.popen(command, env=env, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(proc)
            self.kill_all()
            out, err = proc.communicate()
            raise TimeoutError(f"{' '.join(command)} still ran after {timeout:g} s (killed)\n{out}{err}") from None
        return proc.returncode, out + err, time.monotonic() - start

    @staticmethod
    def kill_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill_all(self) -> list:
        """Kills every process in the cluster's namespaces; returns their pids."""
        return [p for ns in self.namespaces for p in kill_namespace_processes(ns)]

    def processes(self, host: str) -> list:
        """PIDs of the processes now running in `host`'s namespace."""
        return [int(p) for p in ip("netns", "pids", self.ns(host), check=False).stdout.split()]

    # ----- faults
    def cut(self, host: str) -> None:
        """Cuts `host`'s link (its eth0 goes down, inside its namespace): packets to and from it stop."""
        ip("link", "set", IFACE, "down", ns=self.ns(host))

    def mend(self, host: str) -> None:
        ip("link", "set", IFACE, "up", ns=self.ns(host))

    def rx_bytes(self, host: str) -> int:
        """Bytes `host` has received on its link (its eth0 counter)."""
        counter = f"/sys/class/net/{IFACE}/statistics/rx_bytes"  # /sys as that namespace sees it
        out = subprocess.run(["ip", "netns", "exec", self.ns(host), "cat", counter], capture_output=True, text=True,
                             timeout=30, check=True)
        return int(out.stdout)

    # ----- teardown
    def close(self) -> None:
        for ns in reversed(self.namespaces):
            delete_namespace(ns)
        self.namespaces = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def slow_links(cluster: SimCluster, hosts=None, rate: str = "1gbit", delay: str = "100us") -> str:
    """Shapes the links of `hosts` (default: all of the cluster's, the launcher's too): `rate` and one-way
    `delay` with tc netem on each host's outgoing traffic and on the bridge's traffic towards it, so both
    directions are slowed. A kernel without netem (sch_netem) gets the rate alone, from a token bucket (tbf).
    Returns what was applied ("netem ..." or "tbf ..."); RuntimeError naming the cause when neither works."""
    hosts = list(cluster.hosts) + ["launcher"] if hosts is None else list(hosts)
    if shutil.which("tc") is None:
        raise RuntimeError("slow_links needs `tc` (iproute2) on PATH")
    # tbf: a burst of ~1 ms at the rate (at least 64 KiB: a full TSO segment), packets queued up to 50 ms
    choices = [["netem", "rate", rate, "delay", delay], ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]]
    for i, qdisc in enumerate(choices):
        failed = None
        for host in hosts:
            for ns, dev in ((cluster.ns(host), IFACE), (cluster.switch, cluster.port(host))):
                cmd = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *qdisc]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    failed = f"{' '.join(cmd)} failed: {proc.stderr.strip()}"
                    break
            if failed:
                break
        if failed is None:
            return " ".join(qdisc)
        if i == 0 and "unknown" not in failed.lower():
            raise RuntimeError(failed)
    raise RuntimeError(f"{failed} (a kernel without sch_netem and sch_tbf?)")
