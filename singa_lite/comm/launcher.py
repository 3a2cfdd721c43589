"""singa-run: starts N ranks of a script on this host, sharing one NcclIdHolder, and watches them; or, with a
hostfile, on several hosts through ssh (or another remote shell), meeting through dist.init's TCP rendezvous.

    singa-run -np 2 train.py --lr 0.1            # also: python -m singa_lite.run -np 2 train.py ...
    singa-run -np 4 --backend nccl -m mypkg.train
    singa-run --hostfile hosts train.py          # every slot of the hostfile; -np N: the first N slots

Hostfiles (launch_args.read_hostfile): MPICH's form ``host:N`` or Open MPI's ``host slots=N`` (one host a line, ``#``
comments, blank lines; a host alone has 1 slot; a host named twice gets the sum). Ranks fill the hosts in
order. Each rank is started as ``CMD host WORDS...`` (CMD: ``--launcher-exec``, default ``ssh``; the words are
shell-quoted as ssh expects, so a wrapper called like ssh works too, e.g. one that enters a container or a
network namespace), where the words run this module's small rank helper with the same Python path (the same
installation on every host, as mpiexec expects): it changes to the current directory, sets the rank's
variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT: the torchrun
variables dist.init() reads, see comm/env.py), runs the script, and stops it when singa-run asks or when its
connection closes (so a killed singa-run or a dropped ssh leaves no rank behind). The ranks then meet through
the TCP store rank 0 serves at MASTER_ADDR:MASTER_PORT (``--master-addr``, default the first host;
``--master-port``, default a port free here). Signals reach them through that connection; stdin is not
passed on to them.

Each rank is ``python script.py args`` (or ``python -m module args``) with the variables below, so that a
plain ``dist.init()`` or ``opt.DistOpt(sgd)`` in the script joins the others. Output lines carry the rank
(``[rank 1] ...``; stdout and stderr stay apart; ``--no-prefix`` passes output through untouched).

How a job ends. When every rank exits 0, singa-run exits 0. When a rank fails (a non-zero exit code or a
signal), the others are stopped at once: SIGTERM to each rank's process group, SIGKILL to what is left after
``--grace`` seconds; singa-run then names the failed rank and how it ended and exits with its code (128 +
the signal number when a signal ended it). SIGINT (Ctrl-C), SIGTERM and SIGHUP sent to singa-run are passed
to every rank, SIGKILL follows after the grace period (at once on a second Ctrl-C), and singa-run exits
128 + the signal number. Every wait after a stop began is bounded: singa-run never waits forever. The
holder's shared-memory segment is removed at the end whatever happened, and each rank is killed by the
kernel if singa-run itself dies (Linux).

Restarts (``--max-restarts N``). After a failed generation has been stopped and reported as above, singa-run
waits ``--restart-delay`` seconds and starts a new generation of the same job (same job id and secret, a new
holder, ``SINGA_LITE_RESTART_COUNT`` one higher), up to N times; the script resumes from its last commit
(checkpoint.ElasticState, docs/elastic.md). With ``--hostfile`` and ``--min-np M`` the hosts are probed first
(``--launcher-exec HOST true``) and those that do not answer are left out, if the rest hold at least M ranks.
A signal to singa-run ends the job without a restart.

In-process elasticity (``--elastic``, :class:`ElasticJob`): the ranks train under dist.elastic and singa-run
serves their rendezvous store itself, so any of them may fail; a failed rank is reported and the others go on,
and ``--max-restarts N`` starts up to N new processes in failed ones' places (they join at a commit).
"""
from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .. import timeline
from . import HOLDER_VAR, auth, straggler
from .holder import NcclIdHolder
# The command line (launch_args.py); every public name of it is singa-run's too, so it can be read from here.
from .launch_args import (BACKEND_VAR, EPILOG, MAX_TIMEOUT_S, REMOTE_MARK, TIMEOUT_VAR, UsageError,  # noqa: F401
                          answering_hosts, build_parser, check_args, command, elastic_environment, free_port,
                          job_identity, parse_command_line, place, rank_environment, read_hostfile, remote_command,
                          remote_variables, replace_on_hosts)
from .mpi import MPI_LAUNCH_VARS

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.1  # how often the supervisor looks at signals and deadlines
REAP_S = 5.0  # after SIGKILL, how long to wait for the kernel to end a process before giving up on it
DRAIN_S = 2.0  # after the ranks ended, how long to wait for the rest of their output
SECRET_LINE = "SECRET"  # the first line singa-run writes to a remote rank's helper: "SECRET <the job's secret>"
SECRET_WAIT_S = 60.0  # how long the helper waits for that line


def describe_end(returncode: int) -> str:
    """How a process ended, in words: 'exit code 1' or 'killed by SIGKILL'."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def exit_status(returncode: int) -> int:
    """The shell's convention: a process ended by signal s reports 128 + s."""
    return returncode if returncode >= 0 else 128 - returncode


# ---------------------------------------------------------------- the job
def _die_with_parent():
    """Runs in each rank between fork and exec: the kernel sends SIGKILL to the rank if singa-run dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def setup():
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # singa-run died before the line above
            os._exit(1)

    return setup


def _binary(stream):
    return getattr(stream, "buffer", stream)


class Job:
    """One run of N ranks: start, pass output on, supervise, stop, clean up."""

    def __init__(self, args, out=None, err=None):
        self.args = args
        self.out, self.err = _binary(out or sys.stdout), _binary(err or sys.stderr)
        self.locks = {id(self.out): threading.Lock(), id(self.err): threading.Lock()}
        self.width = len(str(args.np - 1))
        self.signals: list[int] = []  # received by singa-run, not yet handled
        self.interrupted = None  # the first signal singa-run got
        self.generation = 0  # restarts so far (--max-restarts)
        self._new_generation()

    def _new_generation(self) -> None:
        """Forgets the ranks of the previous generation (all ended and reaped by now)."""
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        self.ended: queue.Queue = queue.Queue()  # (rank, returncode), in the order the processes ended
        self.codes: dict[int, int] = {}  # rank -> returncode (Popen's convention: -N for signal N)
        self.failed = None  # the rank that failed first
        self.stopping = False  # the ranks were told to stop (by a failure or a signal)
        self.kill_at = None  # when the ranks still running get SIGKILL
        self.give_up_at = None  # after SIGKILL: when to stop waiting for processes stuck in the kernel

    # ----- output
    def _write(self, stream, data: bytes) -> None:
        with self.locks[id(stream)]:
            try:
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):  # our own output is gone (a closed pipe): keep draining the ranks
                pass

    def say(self, message: str) -> None:
        self._write(self.err, f"singa-run: {message}\n".encode())

    def _pump(self, src, dst, rank: int) -> None:
        prefix = f"[rank {rank:>{self.width}}] ".encode()
        with src:
            for line in iter(src.readline, b""):
                self._write(dst, prefix + (line if line.endswith(b"\n") else line + b"\n"))

    # ----- signals
    def _on_signal(self, signum, frame):
        self.signals.append(signum)  # handled by the supervisor loop, outside the handler

    def _signal_ranks(self, sig: int, every: bool = False) -> None:
        """sig to the process group of each running rank (every: of each rank, for its leftover children).
        Safe however late: an ended rank stays a zombie until the job is over, so its process (and group)
        id cannot have been given to an unrelated process. A rank on a hostfile's host gets the signal's name
        through its helper's stdin (a remote shell does not carry signals), SIGKILL ends the remote shell
        here, and its helper then kills the rank."""
        for r, p in enumerate(self.procs):
            if every or r not in self.codes:
                if p.stdin is not None and sig != signal.SIGKILL:
                    try:
                        p.stdin.write(f"{signal.Signals(sig).name}\n".encode())
                        p.stdin.flush()
                    except (OSError, ValueError):  # its helper is gone already
                        pass
                    continue
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    # ----- life cycle
    def run(self) -> int:
        """Runs the job: a generation of ranks, and after a failure (with --max-restarts) new generations of
        the same job, until one succeeds, singa-run is interrupted, or the restarts are used up."""
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        try:
            while True:
                code = self._run_generation()
                if code == 0 or self.interrupted is not None or self.generation >= self.args.max_restarts:
                    if code != 0 and self.args.max_restarts:
                        self.say(f"giving up after {self.generation} restart(s) (--max-restarts "
                                 f"{self.args.max_restarts})" if self.interrupted is None else
                                 "not restarting: interrupted")
                    return code
                self.generation += 1
                self.say(f"restart {self.generation} of at most {self.args.max_restarts}: starting a new "
                         f"generation of {self.args.np} rank(s) in {self.args.restart_delay:g} s")
                if not self._pause(self.args.restart_delay):
                    self.say("not restarting: interrupted")
                    return code
                if self.args.placement is not None and self.args.min_np is not None:
                    try:
                        self._choose_hosts()
                    except UsageError as e:
                        self.say(f"not restarting: {e}")
                        return code
                self._new_generation()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _choose_hosts(self) -> None:
        """Before a restart with --min-np: the hosts that still answer, and the ranks they can hold."""
        alive = answering_hosts(self.args, self.args.hosts)
        lost = [h for h, _ in self.args.hosts if h not in dict(alive)]
        replace_on_hosts(self.args, alive)
        if lost:
            self.say(f"host(s) {', '.join(lost)} did not answer within {self.args.probe_timeout:g} s: left out; "
                     f"{self.args.np} rank(s) on {', '.join(h for h, _ in alive)}")
        self.width = len(str(self.args.np - 1))

    def _pause(self, seconds: float) -> bool:
        """Waits before a restart, minding signals; False when singa-run was interrupted meanwhile."""
        end = time.monotonic() + seconds
        while True:
            if self.signals:
                signum = self.signals.pop(0)
                self.interrupted = self.interrupted or signum
                return False
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, POLL_S))

    def _run_generation(self) -> int:
        holder = None
        self.args.generation = self.generation
        try:
            if self.args.placement is None:  # one host: the ranks meet through a holder (a fresh one each time)
                holder = NcclIdHolder()
                if self.args.backend == "nccl" and holder.nccl_id is None:
                    raise UsageError(f"--backend nccl, but NCCL cannot be used here: {holder.nccl_error}")
            if self.args.timeline is not None:
                os.makedirs(self.args.timeline, exist_ok=True)
            if getattr(self.args, "report", None) is not None and self.args.placement is None:  # for the end
                self.args.report_dir = tempfile.mkdtemp(prefix="singa_lite_report_")
            self._start(holder.to_string() if holder is not None else None)
            code = self._supervise()
            self._drain()
            self._report()
            if getattr(self.args, "report_dir", None):
                self._straggler_report()
            if self.args.timeline is not None:
                self._merge_timelines()
            return code
        finally:
            if getattr(self.args, "report_dir", None):
                shutil.rmtree(self.args.report_dir, ignore_errors=True)
                self.args.report_dir = None
            self._reap()
            if holder is not None:
                holder.cleanup()  # the segment's name, if the ranks did not remove it (one never joined)

    def _reap(self) -> None:
        """Kills what is left (an error in singa-run itself, or leftovers) and reaps every rank."""
        if self._running() or self.stopping:
            self._signal_ranks(signal.SIGKILL, every=True)
        for p in self.procs:  # every rank has ended by now (or singa-run gave up on it)
            if p.stdin is not None:  # a remote rank's helper: the end of its control line
                try:
                    p.stdin.close()
                except OSError:
                    pass
            try:
                p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass

    def _straggler_report(self) -> None:
        """The straggler report of the whole job, from the figures the ranks left (comm/straggler.py)."""
        found, why = straggler.final_report(self.args.report_dir, self.args.np)
        if found is None:
            self.say(f"no straggler report of the whole job: {why}")
        else:
            self.say(f"the whole job's {found}")

    def _merge_timelines(self) -> None:
        """One trace of the whole job from the ranks' files (a rank stopped by a signal wrote none)."""
        folder = self.args.timeline
        paths = [timeline.rank_path(os.path.join(folder, ""), r) for r in range(self.args.np)]
        found = [p for p in paths if os.path.exists(p)]
        if not found:
            self.say(f"no rank wrote a timeline into {folder}")
            return
        try:
            out = timeline.merge(found, os.path.join(folder, "timeline.json"))
        except ValueError as e:
            self.say(f"could not merge the timelines: {e}")
            return
        self.say(f"timeline of {len(found)} of {self.args.np} rank(s): {out}")

    def _start(self, holder_text: str | None) -> None:
        pipe = subprocess.PIPE if self.args.prefix else None
        setup = _die_with_parent()
        for rank in range(self.args.np):
            if self.signals:  # interrupted while starting: start no more
                break
            if self.args.placement is None:
                cmd, env = command(self.args), rank_environment(self.args, rank, holder_text)
                stdin = None if rank == 0 else subprocess.DEVNULL  # like mpiexec: stdin goes to rank 0
            else:  # through the remote shell; its stdin is the helper's control line
                cmd, env, stdin = remote_command(self.args, rank), None, subprocess.PIPE
            try:
                self.procs.append(subprocess.Popen(
                    cmd, env=env, stdout=pipe, stderr=pipe, stdin=stdin,
                    start_new_session=True,  # its own process group: singa-run alone decides what reaches it
                    preexec_fn=setup))
            except OSError as e:
                raise UsageError(f"could not start rank {rank} ({shlex.join(cmd)}): {e}") from None
            if self.args.placement is not None:  # the helper's first line: the job's secret, off the command line
                try:
                    self.procs[-1].stdin.write(f"{SECRET_LINE} {self.args.secret}\n".encode())
                    self.procs[-1].stdin.flush()
                except (OSError, ValueError):  # the remote shell is gone already: its exit is reported
                    pass
        # Threads only once every rank is started: preexec_fn must not run while other threads work.
        for rank, p in enumerate(self.procs):
            if self.args.prefix:
                for src, dst in ((p.stdout, self.out), (p.stderr, self.err)):
                    t = threading.Thread(target=self._pump, args=(src, dst, rank), daemon=True)
                    t.start()
                    self.pumps.append(t)
            threading.Thread(target=self._watch, args=(p, rank), daemon=True).start()

    def _watch(self, p: subprocess.Popen, rank: int) -> None:
        """Reports when rank's process ends, leaving it a zombie (WNOWAIT): run() reaps it at the end."""
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
        self.ended.put((rank, info.si_status if info.si_code == os.CLD_EXITED else -info.si_status))

    def _supervise(self) -> int:
        """Waits for the ranks, reacting to failures and signals; returns singa-run's exit status."""
        running = len(self.procs)
        while True:
            while self.signals:
                self._handle_signal(self.signals.pop(0))
            if not running:
                break
            try:
                rank, code = self.ended.get(timeout=POLL_S)
            except queue.Empty:
                rank = None
            if rank is not None:
                running -= 1
                self.codes[rank] = code
                running += self._rank_ended(rank, code, running)
            now = time.monotonic()
            if running and self.kill_at is not None and now >= self.kill_at:
                self.say(f"rank(s) {_ranks(self._running())} still running {self.args.grace:g} s after being "
                         f"told to stop: SIGKILL")
                self._kill()
            if running and self.give_up_at is not None and now >= self.give_up_at:
                left = [f"{r} (pid {self.procs[r].pid})" for r in self._running()]
                self.say(f"rank(s) {', '.join(left)} did not end {REAP_S:g} s after SIGKILL; giving up on them")
                break
        if self.interrupted is not None:
            return 128 + self.interrupted
        return self._exit_status()

    def _rank_ended(self, rank: int, code: int, running: int) -> int:
        """A rank's process ended with `code` (`running` others still run): the first failure stops the others.
        Returns how many processes it started (none here)."""
        if code != 0 and not self.stopping:
            self.failed, self.stopping = rank, True
            if running:
                self.say(f"rank {rank} failed ({self._end(rank)}): stopping the other ranks "
                         f"(SIGTERM, SIGKILL after {self.args.grace:g} s)")
                self._signal_ranks(signal.SIGTERM)
                self.kill_at = time.monotonic() + self.args.grace
        return 0

    def _exit_status(self) -> int:
        return exit_status(self.codes[self.failed]) if self.failed is not None else 0

    def _running(self) -> list[int]:
        return [r for r in range(len(self.procs)) if r not in self.codes]

    def _handle_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.interrupted is None:
            self.interrupted, self.stopping = signum, True
            self.say(f"got {name}: passing it to the ranks (SIGKILL after {self.args.grace:g} s; Ctrl-C "
                     f"again to kill them at once)")
            self._signal_ranks(signum)
            if self.give_up_at is None:  # not killed yet
                self.kill_at = min(self.kill_at or float("inf"), time.monotonic() + self.args.grace)
        elif self.give_up_at is None:
            self.say(f"got {name} again: killing the ranks")
            self._kill()

    def _kill(self) -> None:
        self._signal_ranks(signal.SIGKILL, every=True)
        self.kill_at, self.give_up_at = None, time.monotonic() + REAP_S

    def _drain(self) -> None:
        """Waits (a bounded time) for the ranks' last lines: a child a rank left behind may hold its pipes."""
        end = time.monotonic() + DRAIN_S
        for t in self.pumps:
            t.join(max(0.0, end - time.monotonic()))

    def _report(self) -> None:
        if self.interrupted is not None:
            self.say(f"interrupted by {signal.Signals(self.interrupted).name}; {self._ends()}")
        elif self.failed is not None:
            others = self._ends(skip=self.failed)
            self.say(f"rank {self.failed} failed: {self._end(self.failed)} (see its output above)"
                     + (f"; the others: {others}" if others else ""))
            early = self._finished_before(self.failed)
            if early:  # a rank that simply ran out of work first: the failure is likely a collective it left
                self.say(f"rank(s) {_ranks(early)} exited normally with code 0 while rank {self.failed} was still "
                         f"running (inside a collective, if its error names them): the number of steps probably "
                         f"differed between the ranks (uneven data?); give every rank the same number of batches, "
                         f"or train inside `with dist_opt.join():`")

    def _finished_before(self, rank: int) -> list:
        """Ranks that ended with code 0 before `rank` ended (self.codes is in the order the ranks ended)."""
        early = []
        for r, c in self.codes.items():
            if r == rank:
                break
            if c == 0:
                early.append(r)
        return early

    def _end(self, rank: int) -> str:
        """How rank ended, in words; a hostfile rank's helper reports a signal as 128 + its number."""
        code = self.codes[rank]
        text = describe_end(code)
        if self.args.placement is not None and 128 < code < 128 + 65:
            try:
                host = self.args.placement[rank]["host"]
                text += f" (= 128 + {signal.Signals(code - 128).name}: a signal on {host})"
            except ValueError:
                pass
        return text

    def _ends(self, skip=None) -> str:
        return ", ".join(f"rank {r} " + (self._end(r) if r in self.codes else "still running")
                         for r in range(len(self.procs)) if r != skip)


# ---------------------------------------------------------------- --elastic: ranks may fail, the job goes on
# Started before each elastic rank's program (exec keeps it): the kernel kills the rank if singa-run dies. A
# helper process, not preexec_fn: singa-run's threads (the store, the output) run while ranks are started.
DIE_WITH_PARENT = ("import ctypes, os, sys\n"
                   "if sys.platform.startswith('linux'):\n"
                   "    ctypes.CDLL(None, use_errno=True).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
                   "    if os.getppid() != int(sys.argv[1]):\n"
                   "        os._exit(1)\n"
                   "os.execv(sys.argv[2], sys.argv[2:])\n")


class ElasticJob(Job):
    """``singa-run --elastic``: the ranks train with dist.elastic (docs/elastic.md). singa-run serves the job's
    store itself (so any rank may fail, rank 0 included), a rank's failure is reported and the others go on,
    and with ``--max-restarts N`` a new process takes a failed one's place (up to N in all, at most
    ``--max-np`` running at once); it joins the job at its next commit. The job ends when every process has
    ended: 0 when ranks finished and none failed after the first one finished."""

    def __init__(self, args, out=None, err=None):
        super().__init__(args, out, err)
        self.slots: list[int] = []  # process index -> the RANK it was started with
        self.replaced = 0
        self.finished = False  # a rank ended with 0: the job is ending, no more replacements
        self.width = len(str(args.max_np + args.max_restarts - 1))

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        try:
            return self._run_generation()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _run_generation(self) -> int:
        from .store import TcpStore

        store = TcpStore("127.0.0.1", 0, self.args.np, True, timeout=60.0, credentials=elastic_credentials(self.args))
        self.port = store.port
        try:
            if self.args.timeline is not None:
                os.makedirs(self.args.timeline, exist_ok=True)
            self._start(None)
            code = self._supervise()
            self._drain()
            self._report()
            if self.args.timeline is not None:
                self._merge_timelines()
            return code
        finally:
            self._reap()
            store.close()

    def _start(self, holder_text) -> None:
        for slot in range(self.args.np):
            if self.signals:  # interrupted while starting: start no more
                break
            self._spawn(slot)

    def _spawn(self, slot: int) -> int:
        """Starts a process with RANK=slot; returns its index (its label in the output)."""
        index = len(self.procs)
        pipe = subprocess.PIPE if self.args.prefix else None
        cmd = [sys.executable, "-S", "-c", DIE_WITH_PARENT, str(os.getpid())] + command(self.args)
        try:
            p = subprocess.Popen(cmd, env=elastic_environment(self.args, slot, self.port), stdout=pipe, stderr=pipe,
                                 stdin=None if index == 0 else subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise UsageError(f"could not start rank {index} ({shlex.join(command(self.args))}): {e}") from None
        self.procs.append(p)
        self.slots.append(slot)
        if self.args.prefix:
            for src, dst in ((p.stdout, self.out), (p.stderr, self.err)):
                t = threading.Thread(target=self._pump, args=(src, dst, index), daemon=True)
                t.start()
                self.pumps.append(t)
        threading.Thread(target=self._watch, args=(p, index), daemon=True).start()
        return index

    def _rank_ended(self, rank: int, code: int, running: int) -> int:
        """A failure is reported and the others go on; a replacement starts while the job is not ending (no rank
        has finished), fewer than --max-np run and --max-restarts allows. Returns the processes started."""
        self.finished = self.finished or code == 0
        if code == 0 or self.stopping:
            return 0
        self.failed = rank
        what = f"rank {rank} failed ({self._end(rank)}): " + (
            f"the {running} other(s) go on (--elastic)" if running else "no rank is left")
        started = 0
        if (not self.finished and running and self.replaced < self.args.max_restarts
                and running < self.args.max_np):
            self.replaced += 1
            new = self._spawn(self.slots[rank])
            started = 1
            what += (f"; starting rank {new} in its place (replacement {self.replaced} of at most "
                     f"{self.args.max_restarts}): it joins at the job's next commit")
        self.say(what)
        return started

    def _exit_status(self) -> int:
        return elastic_status(list(self.codes.items()))

    def _report(self) -> None:
        if self.interrupted is not None:
            super()._report()
            return
        done = [r for r, c in self.codes.items() if c == 0]
        failed = [f"{r} ({self._end(r)})" for r, c in self.codes.items() if c != 0]
        code = elastic_status(list(self.codes.items()))
        self.say(f"elastic job {'finished' if code == 0 else 'failed'}: rank(s) {_ranks(done) or 'none'} ended "
                 f"with exit code 0" + (f"; failed: {', '.join(failed)}" if failed else "")
                 + (f"; {self.replaced} replacement(s) started" if self.replaced else ""))


def elastic_status(ends: list) -> int:
    """The exit status of an elastic job from its processes' ends [(index, returncode)] in the order they
    ended: 0 when some finished (exit code 0) and none failed after the first of them; else the last failure's
    (the job did not finish: the last failure is what ended it)."""
    first_done = next((i for i, (_, c) in enumerate(ends) if c == 0), None)
    late = [c for _, c in ends[first_done:] if c != 0] if first_done is not None else [c for _, c in ends if c != 0]
    return exit_status(late[-1]) if late else 0


def elastic_credentials(args):
    """The job's identity and key, for the store singa-run serves to its --elastic ranks (comm/auth.py)."""
    environ = dict(os.environ)
    environ[auth.JOB_ID_VAR] = args.job_id
    if args.secret:
        environ[auth.SECRET_VAR] = args.secret
    return auth.credentials(environ, single_host=True)


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))


def dry_run(args) -> None:
    print(f"singa-run would start {args.np} rank(s) of: {shlex.join(command(args))}")
    if args.placement is not None:
        for rank in range(args.np):
            print(f"  rank {rank}: {shlex.join(remote_command(args, rank))}")
        return
    for rank in range(args.np):
        env = (elastic_environment(args, rank, "<the store singa-run serves>") if args.elastic else
               rank_environment(args, rank, "<a new NcclIdHolder>"))
        if auth.SECRET_VAR in env and env[auth.SECRET_VAR] != os.environ.get(auth.SECRET_VAR):
            env[auth.SECRET_VAR] = "<a fresh secret>"
        new = {k: v for k, v in env.items() if os.environ.get(k) != v}
        print(f"  rank {rank}: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(new.items())))


def main(argv=None) -> int:
    """singa-run's entry point; returns the exit status (argparse exits with 2 itself on a bad command line)."""
    parser = build_parser()
    args = parse_command_line(parser, argv)
    try:
        check_args(args)
    except UsageError as e:
        parser.error(str(e))  # usage, the message, exit code 2
    if args.dry_run:
        dry_run(args)
        return 0
    try:
        return (ElasticJob if args.elastic else Job)(args).run()
    except UsageError as e:
        print(f"singa-run: error: {e}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------- the rank helper on a hostfile's host
def remote_main(argv) -> int:
    """``python -m singa_lite.comm.launcher --singa-run-rank DIR NAME=VALUE... -- COMMAND...``, started by
    singa-run through the remote shell: runs COMMAND in DIR with the variables, in its own process group, and
    exits with its exit code (128 + the signal number when a signal ended it). A line naming a signal on
    stdin (SIGTERM, SIGINT, SIGHUP) is passed to the rank; the end of stdin (singa-run or the connection
    gone) kills it. The rank is killed too if this helper dies (Linux)."""
    if REMOTE_MARK in argv[:1]:
        argv = argv[1:]
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        print(f"singa-run rank helper: expected DIR NAME=VALUE... -- COMMAND..., got {argv!r}", file=sys.stderr)
        return 2
    sep = argv.index("--")
    directory, assignments, cmd = argv[0], argv[1:sep], argv[sep + 1:]
    env = {k: v for k, v in os.environ.items() if k != HOLDER_VAR and k not in MPI_LAUNCH_VARS}
    for item in assignments:
        name, eq, value = item.partition("=")
        if not eq or not name:
            print(f"singa-run rank helper: expected NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        env[name] = value
    where = f"rank {env.get('RANK', '?')} on {socket.gethostname()}"
    try:
        secret, pending = _read_secret_line()
    except ValueError as e:
        print(f"singa-run: {where}: {e}", file=sys.stderr)
        return 2
    if secret:
        env[auth.SECRET_VAR] = secret
    try:
        rank = subprocess.Popen(cmd, cwd=directory, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent())
    except OSError as e:
        print(f"singa-run: could not start {where} ({shlex.join(cmd)} in {directory}): {e}", file=sys.stderr)
        return 127

    def signal_rank(sig):
        try:
            os.killpg(rank.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def control():
        nonlocal pending
        chunk = b""  # lines that came with the secret are handled first
        while True:
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                name = line.decode(errors="replace").strip()
                if name in ("SIGTERM", "SIGINT", "SIGHUP"):
                    signal_rank(getattr(signal, name))
            try:
                chunk = os.read(0, 1024)  # the raw descriptor: no buffered reader left locked at exit
            except OSError:
                chunk = b""
            if not chunk:
                break
        signal_rank(signal.SIGKILL)  # singa-run, or the connection to it, is gone

    for sig in FORWARDED:  # a remote shell may still signal us (sshd's SIGHUP when the connection drops)
        signal.signal(sig, lambda signum, frame: signal_rank(signum))
    threading.Thread(target=control, daemon=True).start()
    while True:
        try:
            code = rank.wait()
            break
        except InterruptedError:  # pragma: no cover -- PEP 475 retries, kept for clarity
            continue
    return exit_status(code)


def _read_secret_line() -> tuple[str, bytes]:
    """The first line singa-run writes to this helper's stdin ("SECRET <secret>", the secret empty when the
    ranks read SINGA_LITE_JOB_SECRET_FILE), and whatever came after it. ValueError when it does not come."""
    import select

    data, deadline = b"", time.monotonic() + SECRET_WAIT_S
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([0], [], [], left)[0]:
            raise ValueError(f"singa-run sent no job secret within {SECRET_WAIT_S:g} s on stdin")
        chunk = os.read(0, 4096)
        if not chunk:
            raise ValueError("stdin ended before singa-run sent the job secret")
        data += chunk
        if len(data) > auth.MAX_SECRET + 64:
            raise ValueError("the first line on stdin is not singa-run's job secret")
    line, _, rest = data.partition(b"\n")
    word, _, secret = line.decode(errors="replace").partition(" ")
    if word != SECRET_LINE:
        raise ValueError("the first line on stdin is not singa-run's job secret (is singa-run the same version?)")
    return secret.strip(), rest


if __name__ == "__main__":
    status = remote_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # at once: the control thread may still be reading stdin
