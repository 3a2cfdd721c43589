"""singa-run's command line: its options, hostfiles, where each rank goes, and each rank's command and
environment. What is checked here is checked before anything starts; launcher.py runs and supervises the ranks.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import os
import shlex
import socket
import sys

from .. import timeline
from . import HOLDER_VAR, auth
from .env import RESTART_VAR
from .straggler import REPORT_DIR_VAR, REPORT_VAR

MAX_RESTARTS_VAR = "SINGA_LITE_MAX_RESTARTS"
DEFAULT_REPORT_EVERY = 100  # steps between two straggler reports of `--report` without N

BACKEND_VAR = "SINGA_LITE_COMM_BACKEND"
TIMEOUT_VAR = "SINGA_LITE_COMM_TIMEOUT"
HELPER_MODULE = "singa_lite.comm.launcher"  # `python -m` of it on a hostfile's host runs the rank helper
REMOTE_MARK = "--singa-run-rank"  # `python -m singa_lite.comm.launcher --singa-run-rank ...`: remote_main

EPILOG = f"""\
environment of each rank:
  {HOLDER_VAR}       the shared NcclIdHolder (NcclIdHolder.to_string()); marks a singa-run rank
  {auth.JOB_ID_VAR}, {auth.SECRET_VAR}   this job's id and a fresh random key (unless already set):
                          every connection of the job proves it (comm/auth.py); never on a command line
  RANK, WORLD_SIZE        this rank and the number of ranks
  LOCAL_RANK, LOCAL_WORLD_SIZE   the same on this host (singa-run starts ranks on one host)
  {BACKEND_VAR} --backend, when not auto
  {TIMEOUT_VAR} --timeout, when given
  {RESTART_VAR}, {MAX_RESTARTS_VAR}   with --max-restarts: this generation (0 for the first
                          start, then 1, 2...) and the most restarts; the job id and secret stay the same
  {timeline.ENV_VAR}     --timeline DIR: each rank writes DIR/timeline.rank<r>.json at exit
  {REPORT_VAR}, {REPORT_DIR_VAR}   --report N: every N steps each DistOpt compares the ranks, rank 0
                          prints the table; at exit each rank leaves its figures in a folder of singa-run's
  OMP_NUM_THREADS         cores / ranks, unless already set
  PYTHONUNBUFFERED=1      with --prefix, unless already set (so lines arrive as they are printed)
with --hostfile: no {HOLDER_VAR} and no OMP_NUM_THREADS (dist.init() shares each host's cores), but
  MASTER_ADDR, MASTER_PORT       where rank 0 serves the rendezvous store (see --master-addr, --master-port)
  {auth.SECRET_VAR}   reaches each host through the remote shell's stdin, not its command line
  LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK   from the hostfile (dist.init() checks the hosts itself)

restarts (--max-restarts N): when a rank fails, the others are stopped as always, and then (after
--restart-delay seconds) a new generation of ranks of the same job starts, up to N times; a script resumes
from its last commit (singa_lite.checkpoint.ElasticState; docs/elastic.md). With --hostfile and --min-np M,
a restart leaves out the hosts that no longer answer (--launcher-exec HOST true fails or hangs for
--probe-timeout seconds) and starts on the slots left, if they hold at least M ranks.

--elastic (in-process elasticity, dist.elastic): no {HOLDER_VAR}; MASTER_ADDR=127.0.0.1 and MASTER_PORT
  where singa-run itself serves the job's store, SINGA_LITE_STORE_SERVER=singa-run, and
  SINGA_LITE_ELASTIC_MIN_NP, SINGA_LITE_ELASTIC_MAX_NP (--min-np, --max-np). A failed rank is reported and the
  others go on; with --max-restarts N a new process (RANK of the failed one) takes its place, up to N times,
  while fewer than --max-np run; exit 0 when ranks finished and none failed after the first one finished.

exit status: 0 when every rank succeeded (in the last generation); the failed rank's exit code, or 128 +
signal number when a signal ended it; 128 + signal number when singa-run was interrupted (130 for Ctrl-C); 2
for a bad command line or a job that cannot start.
"""


class UsageError(Exception):
    """A problem with the command line or the situation, reported in one line with exit code 2."""


# ---------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="singa-run", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG, allow_abbrev=False,
        description="Start N ranks of a Python script on this host (or on the hosts of a hostfile) for "
                    "singa_lite's data-parallel training.")
    p.add_argument("-np", "-n", "--np", dest="np", type=int, default=None, metavar="N",
                   help="number of ranks to start (with --hostfile: default, and at most, its slots)")
    p.add_argument("--hostfile", "-f", metavar="FILE",
                   help="start the ranks on the hosts of FILE (MPICH's 'host:N' or Open MPI's 'host slots=N' "
                        "lines) through --launcher-exec, filling the hosts in order")
    p.add_argument("--launcher-exec", default="ssh", metavar="CMD",
                   help="with --hostfile: how a rank is started on its host, called as 'CMD host words...' like "
                        "ssh (default: ssh; e.g. 'ssh -o BatchMode=yes')")
    p.add_argument("--master-addr", metavar="ADDR",
                   help="with --hostfile: the address the ranks reach rank 0 at (default: the first host)")
    p.add_argument("--master-port", type=int, metavar="PORT",
                   help="with --hostfile: the port rank 0 serves the rendezvous on (default: one free here)")
    p.add_argument("--backend", choices=("auto", "shm", "nccl", "tcp"), default=None,
                   help=f"communication backend of dist.init() in the ranks (sets {BACKEND_VAR}); auto: shm "
                        f"for CPU tensors (tcp across the hosts of a hostfile), nccl when the script made a GPU "
                        f"its default device first (default: {BACKEND_VAR} when set, else auto)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help=f"communicator timeout in the ranks (sets {TIMEOUT_VAR}; default 300)")
    p.add_argument("--timeline", metavar="DIR",
                   help=f"record a Chrome-trace timeline of every rank (sets {timeline.ENV_VAR}=DIR/): each "
                        f"rank writes DIR/timeline.rank<r>.json at exit, and singa-run then merges them into "
                        f"DIR/timeline.json, one process per rank (open it in ui.perfetto.dev)")
    p.add_argument("--report", type=int, default=None, metavar="N",
                   help=f"the straggler report (docs/straggler.md): every N steps (default {DEFAULT_REPORT_EVERY}) "
                        f"each DistOpt compares the ranks' step phases and collectives and rank 0 prints which "
                        f"rank the others wait for, and where its time goes; at the end singa-run prints the table "
                        f"of the whole job (sets {REPORT_VAR})")
    p.add_argument("--prefix", action=argparse.BooleanOptionalAction, default=True,
                   help="prefix every output line with its rank")
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="after stopping the ranks with SIGTERM (or a forwarded signal), how long before SIGKILL")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a rank fails, stop the others and start a new generation of ranks of the same job, "
                        "at most N times (the script resumes from its commits: docs/elastic.md)")
    p.add_argument("--restart-delay", type=float, default=1.0, metavar="SECONDS",
                   help="with --max-restarts: how long to wait after a failed generation ended before the next")
    p.add_argument("--min-np", type=int, default=None, metavar="M",
                   help="with --hostfile and --max-restarts: a restart leaves out hosts that no longer answer and "
                        "runs on the slots left, with at least M ranks (default: -np, no host may be lost); with "
                        "--elastic: the fewest ranks the job trains on (dist.elastic's min_np, default 1)")
    p.add_argument("--elastic", action="store_true",
                   help="in-process elasticity (dist.elastic, docs/elastic.md): a rank that fails is reported and "
                        "the others go on; singa-run serves the job's store, so any rank may fail; with "
                        "--max-restarts N, up to N new processes take failed ones' places (they join at a commit)")
    p.add_argument("--max-np", type=int, default=None, metavar="N",
                   help="with --elastic: the most ranks at once (dist.elastic's max_np; default -np)")
    p.add_argument("--probe-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="with --min-np: how long a host has to answer '--launcher-exec HOST true' before a restart")
    p.add_argument("-m", dest="module", action="store_true",
                   help="run the target as a module (python -m), not as a script file")
    p.add_argument("--dry-run", action="store_true", help="print what would be started, start nothing")
    p.add_argument("target", metavar="script.py | module", help="the script (or, with -m, the module) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on to the script")
    return p


_TAKE_A_VALUE = {"-np", "-n", "--np", "--backend", "--timeout", "--grace", "--timeline", "--hostfile", "-f",
                 "--launcher-exec", "--master-addr", "--master-port", "--max-restarts", "--restart-delay", "--min-np",
                 "--probe-timeout", "--max-np"}


def parse_command_line(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """singa-run's own options stop at the script (or module): everything after it belongs to the script,
    even words that look like singa-run's options (argparse alone parsed `--n 5` meant for the script as
    an abbreviation of `--np`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":  # an explicit end of singa-run's options
            return _with_script_args(parser.parse_args(argv[:i] + argv[i + 1:i + 2]), argv[i + 2:])
        if word == "--report":  # N is optional: a next word that is no number is the script
            if i + 1 < len(argv) and argv[i + 1].lstrip("-").isdigit():
                i += 2
                continue
            argv[i] = f"--report={DEFAULT_REPORT_EVERY}"
        if not word.startswith("-") or word == "-":
            return _with_script_args(parser.parse_args(argv[:i + 1]), argv[i + 1:])
        i += 2 if word in _TAKE_A_VALUE else 1
    return parser.parse_args(argv)  # no script: argparse reports what is missing (or prints --help)


def _with_script_args(args: argparse.Namespace, rest: list) -> argparse.Namespace:
    args.args = list(args.args) + rest
    return args


MAX_TIMEOUT_S = 1e7  # the largest communicator timeout every backend takes (the shm one refuses more)
MAX_RESTARTS = 1000
MAX_RESTART_DELAY_S = 3600.0


def check_args(args) -> None:
    args.placement = None
    args.job_id, args.secret = job_identity()  # checks a secret the user gave, before anything starts
    if args.hostfile is None:
        if args.np is None:
            raise UsageError("the following arguments are required: -np (or --hostfile)")
        for flag, value in (("--master-addr", args.master_addr), ("--master-port", args.master_port)):
            if value is not None:
                raise UsageError(f"{flag} is for jobs on several hosts: give --hostfile too")
        if args.backend == "tcp":
            raise UsageError("--backend tcp is for the ranks of a --hostfile; ranks on this host share memory "
                             "(--backend shm)")
    else:
        hosts = read_hostfile(args.hostfile)
        slots = sum(n for _, n in hosts)
        if args.np is None:
            args.np = slots
        elif args.np > slots:
            raise UsageError(f"-np {args.np}, but {args.hostfile} has {slots} slot(s) "
                             f"({', '.join(f'{h}: {n}' for h, n in hosts)}): add slots or hosts, or start fewer ranks")
        args.placement = place(hosts, args.np) if args.np >= 1 else None
        args.hosts, args.chosen_addr, args.chosen_port = hosts, args.master_addr, args.master_port
        args.requested_np = args.np
        if args.master_addr is None:
            args.master_addr = hosts[0][0]
        if args.master_port is None:
            args.master_port = free_port()
        if args.master_port is not None and not 1 <= args.master_port <= 65535:
            raise UsageError(f"--master-port must be a TCP port (1 to 65535), got {args.master_port}")
        try:
            launcher_words = shlex.split(args.launcher_exec)
        except ValueError as e:  # an unbalanced quote
            raise UsageError(f"--launcher-exec {args.launcher_exec!r}: {e}") from None
        if not launcher_words:
            raise UsageError("--launcher-exec must name a command (e.g. ssh)")
        if not args.master_addr or any(c.isspace() for c in args.master_addr):
            raise UsageError(f"--master-addr must be a host name or address, got {args.master_addr!r}")
    if args.np < 1:
        raise UsageError(f"-np must be at least 1, got {args.np}")
    if args.timeout is not None and not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}, got "
                         f"{args.timeout}")
    if not 0 <= args.max_restarts <= MAX_RESTARTS:
        raise UsageError(f"--max-restarts must be a number of restarts from 0 to {MAX_RESTARTS}, got "
                         f"{args.max_restarts}")
    if not 0 <= args.restart_delay <= MAX_RESTART_DELAY_S:
        raise UsageError(f"--restart-delay must be a number of seconds from 0 to {MAX_RESTART_DELAY_S:g}, got "
                         f"{args.restart_delay}")
    args.elastic = bool(getattr(args, "elastic", False))
    if args.elastic:
        _check_elastic(args)
    elif getattr(args, "max_np", None) is not None:
        raise UsageError("--max-np is for --elastic jobs (the most ranks at once)")
    if args.min_np is not None and not args.elastic:
        if args.hostfile is None:
            raise UsageError("--min-np is for jobs on the hosts of a --hostfile (a restart leaves out hosts that no "
                             "longer answer); on one host every restart starts -np ranks")
        if not 1 <= args.min_np <= args.np:
            raise UsageError(f"--min-np must be from 1 to -np ({args.np}), got {args.min_np}")
        if not 0 < args.probe_timeout <= MAX_RESTART_DELAY_S:
            raise UsageError(f"--probe-timeout must be a positive number of seconds, at most "
                             f"{MAX_RESTART_DELAY_S:g}, got {args.probe_timeout}")
    if not 0 <= args.grace < float("inf"):  # infinite: a rank that ignores SIGTERM would be waited for forever
        raise UsageError(f"--grace must be a finite number of seconds >= 0, got {args.grace}")
    if args.timeline is not None:
        _check_timeline(args.timeline)
    if args.report is not None and args.report < 1:
        raise UsageError(f"--report wants a number of steps >= 1 between two reports, got {args.report}")
    if args.module:
        top = args.target.split(".")[0]
        if not all(part.isidentifier() for part in args.target.split(".")):
            raise UsageError(f"-m: {args.target!r} is not a module name")
        # Where `python -m` will look: the current directory first. The top-level package is found
        # without importing anything.
        if importlib.machinery.PathFinder.find_spec(top, [os.getcwd()] + sys.path) is None \
                and top not in sys.builtin_module_names:
            raise UsageError(f"-m: no module named {top!r} (looked in the current directory and sys.path)")
    elif not os.path.isfile(args.target):
        what = "is a directory" if os.path.isdir(args.target) else "does not exist"
        raise UsageError(f"script {args.target!r} {what} (to run a module, use -m)")
    if args.timeline is not None and not args.dry_run:  # last: only a good command line creates anything
        try:
            os.makedirs(args.timeline, exist_ok=True)
        except OSError as e:  # what _check_timeline cannot foresee (a full disk, a name too long, /proc)
            raise UsageError(f"--timeline {args.timeline!r}: cannot create the directory: {e.strerror or e}") from None


def _check_elastic(args) -> None:
    if args.hostfile is not None:
        raise UsageError("--elastic runs the ranks on this host (singa-run serves their store); across hosts, "
                         "start the processes with the job's variables (docs/elastic.md) or use --max-restarts")
    if args.report is not None:
        raise UsageError("--report compares a fixed set of ranks; it cannot be used with --elastic")
    if args.max_np is None:
        args.max_np = args.np
    if args.max_np < args.np:
        raise UsageError(f"--max-np ({args.max_np}) must be at least -np ({args.np})")
    if args.min_np is not None and not 1 <= args.min_np <= args.np:
        raise UsageError(f"--min-np must be from 1 to -np ({args.np}), got {args.min_np}")


def _check_timeline(path: str) -> None:
    """--timeline names a directory that singa-run creates if needed and every rank writes into: it must be
    a directory already, or one that can be made where it is (its nearest existing ancestor a directory
    this user can write into)."""
    if not path:
        raise UsageError("--timeline wants a directory name for the ranks' files, got ''")
    full = os.path.abspath(path)
    probe = full
    while not os.path.lexists(probe):  # the nearest part of the path that exists: where creation starts
        probe = os.path.dirname(probe)
    where = "" if probe == full else f" (in --timeline {path!r})"
    if os.path.islink(probe) and not os.path.exists(probe):
        raise UsageError(f"--timeline wants a directory for the ranks' files, but {probe!r}{where} is a "
                         f"symbolic link to nothing")
    if not os.path.isdir(probe):
        raise UsageError(f"--timeline wants a directory for the ranks' files, but {probe!r}{where} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        action = "write into" if probe == full else "create directories in"
        raise UsageError(f"--timeline {path!r}: this user cannot {action} {probe!r}; choose another directory")


# ---------------------------------------------------------------- hostfiles
def read_hostfile(path: str) -> list[tuple[str, int]]:
    """[(host, slots)] from an MPICH (``host:N``) or Open MPI (``host slots=N [max_slots=M]``) hostfile, in
    the order of first appearance; ``#`` starts a comment; a host alone has 1 slot; a host named on several
    lines gets the sum of their slots. UsageError naming the file and line for anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read the hostfile {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the hostfile {path!r} is not a text file (not UTF-8); expected lines of 'host', "
                         f"'host:N' or 'host slots=N'") from None
    slots: dict = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        expected = "expected 'host', 'host:N' (MPICH) or 'host slots=N' (Open MPI)"
        words = line.split()
        host, count = words[0], None
        if ":" in host:
            host, _, n = host.rpartition(":")
            count = _slot_count(n, where, raw)
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key == "slots" and eq and count is None:
                count = _slot_count(value, where, raw)
            elif key in ("max_slots", "max-slots") and eq:
                _slot_count(value, where, raw)  # checked, not needed: singa-run never oversubscribes
            else:
                raise UsageError(f"{where}: {raw.strip()!r}: unexpected {word!r}; {expected}")
        if not host or "=" in host or "[" in host:
            raise UsageError(f"{where}: {raw.strip()!r}: no host name; {expected}")
        slots[host] = slots.get(host, 0) + (1 if count is None else count)
    if not slots:
        raise UsageError(f"the hostfile {path!r} names no host (only blank lines and comments)")
    return list(slots.items())


def _slot_count(text: str, where: str, raw: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{where}: {raw.strip()!r}: the number of slots must be a positive integer, got {text!r}")
    return n


def place(hosts: list, np: int) -> list[dict]:
    """Where each rank goes: the hosts' slots in order, each rank with its host, node index, local rank and
    the number of ranks on its host."""
    placement = []
    for node, (host, slots) in enumerate(hosts):
        here = min(slots, np - len(placement))
        placement += [{"host": host, "node": node, "local_rank": k, "local_size": here} for k in range(here)]
        if len(placement) == np:
            break
    return placement


def free_port() -> int:
    """A TCP port free on this host now (the first host usually has it free too; else use --master-port)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def job_identity(base=None) -> tuple[str, str]:
    """(job id, secret) of a new job: the user's SINGA_LITE_JOB_ID and SINGA_LITE_JOB_SECRET when set (checked
    here, before anything starts), else fresh ones, so that two singa-run jobs never mix and no stranger joins
    one. The secret is "" when the ranks read it from SINGA_LITE_JOB_SECRET_FILE themselves."""
    base = os.environ if base is None else base
    try:
        job = auth.job_id({auth.JOB_ID_VAR: base.get(auth.JOB_ID_VAR, "")}) or auth.new_job_id()
        given = auth.given_secret(base)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if base.get(auth.SECRET_FILE_VAR):
        return job, ""
    return job, given.decode() if given is not None else auth.new_secret()


def remote_variables(args, rank: int) -> dict:
    """What a rank of a hostfile job needs (dist.init's torchrun variables) and singa-run's own settings. Not
    the job's secret: that reaches the host through the remote shell's stdin (remote_main)."""
    where = args.placement[rank]
    env = {"RANK": rank, "WORLD_SIZE": args.np, "LOCAL_RANK": where["local_rank"],
           "LOCAL_WORLD_SIZE": where["local_size"], "GROUP_RANK": where["node"], "MASTER_ADDR": args.master_addr,
           "MASTER_PORT": args.master_port, auth.JOB_ID_VAR: args.job_id, **restart_variables(args)}
    if os.environ.get(auth.SECRET_FILE_VAR):
        env[auth.SECRET_FILE_VAR] = os.environ[auth.SECRET_FILE_VAR]
    if args.backend not in (None, "auto"):
        env[BACKEND_VAR] = args.backend
    if args.timeout is not None:
        env[TIMEOUT_VAR] = repr(args.timeout)
    if args.timeline is not None:
        env[timeline.ENV_VAR] = os.path.join(os.path.abspath(args.timeline), "")
    if getattr(args, "report", None) is not None:  # no folder: the ranks' hosts are not this one
        env[REPORT_VAR] = args.report
    if args.prefix:
        env["PYTHONUNBUFFERED"] = "1"
    return {k: str(v) for k, v in env.items()}


def remote_command(args, rank: int) -> list[str]:
    """``CMD host words...``: the rank helper (remote_main) on the rank's host, each word quoted for the remote
    shell as ssh expects (a plain word stays as it is)."""
    words = [sys.executable, "-m", HELPER_MODULE, REMOTE_MARK, os.getcwd()]
    words += [f"{k}={v}" for k, v in remote_variables(args, rank).items()]
    words += ["--"] + command(args)
    return shlex.split(args.launcher_exec) + [args.placement[rank]["host"]] + [shlex.quote(w) for w in words]


def command(args) -> list[str]:
    """The command line of every rank: this interpreter, so that the ranks see the same packages."""
    return [sys.executable] + (["-m"] if args.module else []) + [args.target] + list(args.args)


def rank_environment(args, rank: int, holder_text: str, base=None) -> dict:
    """The environment of one rank: the parent's, plus what dist.init() needs to find the job."""
    env = dict(os.environ if base is None else base)
    env.update({HOLDER_VAR: holder_text, "RANK": str(rank), "WORLD_SIZE": str(args.np),
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(args.np), auth.JOB_ID_VAR: args.job_id,
                **restart_variables(args)})
    if args.secret:
        env[auth.SECRET_VAR] = args.secret
    if args.backend == "auto":
        env.pop(BACKEND_VAR, None)
    elif args.backend is not None:
        env[BACKEND_VAR] = args.backend
    if args.timeout is not None:
        env[TIMEOUT_VAR] = repr(args.timeout)
    if getattr(args, "timeline", None) is not None:  # a directory: the rank names its own file in it
        env[timeline.ENV_VAR] = os.path.join(os.path.abspath(args.timeline), "")
    if getattr(args, "report", None) is not None:
        env[REPORT_VAR] = str(args.report)
        if getattr(args, "report_dir", None):  # where the ranks leave their figures for the job's table
            env[REPORT_DIR_VAR] = args.report_dir
    if "OMP_NUM_THREADS" not in env:  # N ranks of all cores each would oversubscribe the CPU
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, cores // args.np))
    if args.prefix:
        env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def elastic_environment(args, slot: int, port, base=None) -> dict:
    """The environment of a --elastic rank: dist.init's torchrun variables (no holder: dist.elastic regroups
    through the store, which singa-run serves on this host at `port`), and min_np / max_np."""
    from .env import STORE_SERVER_VAR
    from .membership import MAX_NP_VAR, MIN_NP_VAR

    env = rank_environment(args, slot, "", base)
    for name in (HOLDER_VAR, RESTART_VAR, MAX_RESTARTS_VAR):
        env.pop(name, None)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), STORE_SERVER_VAR: "singa-run",
                MAX_NP_VAR: str(args.max_np)})
    if args.min_np is not None:
        env[MIN_NP_VAR] = str(args.min_np)
    return env


def restart_variables(args) -> dict:
    """The generation of the ranks singa-run starts now, and the most restarts (with --max-restarts)."""
    if not getattr(args, "max_restarts", 0):
        return {}
    return {RESTART_VAR: str(getattr(args, "generation", 0)), MAX_RESTARTS_VAR: str(args.max_restarts)}


def answering_hosts(args, hosts: list) -> list:
    """The hosts of `hosts` ([(host, slots)]) on which ``--launcher-exec HOST true`` succeeds within
    --probe-timeout seconds (probed together)."""
    import subprocess

    words = shlex.split(args.launcher_exec)
    probes = []
    for host, _ in hosts:
        try:
            probes.append(subprocess.Popen(words + [host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
        except OSError:
            probes.append(None)
    import time

    deadline, alive = time.monotonic() + args.probe_timeout, []
    for (host, slots), p in zip(hosts, probes):
        if p is None:
            continue
        try:
            ok = p.wait(timeout=max(deadline - time.monotonic(), 0.01)) == 0
        except subprocess.TimeoutExpired:
            ok = False
            p.kill()
            p.wait()
        if ok:
            alive.append((host, slots))
    return alive


def replace_on_hosts(args, hosts: list) -> None:
    """Places the job again on `hosts` (those that still answer): -np as first asked when they have the
    slots, else as many ranks as they hold; UsageError when that is fewer than --min-np."""
    slots = sum(n for _, n in hosts)
    np_ = min(args.requested_np, slots)
    if np_ < (args.min_np or args.requested_np):
        names = ", ".join(h for h, _ in hosts) or "none"
        raise UsageError(f"only {slots} slot(s) left on the hosts that answer ({names}), fewer than --min-np "
                         f"{args.min_np or args.requested_np}")
    args.np, args.placement = np_, place(hosts, np_)
    if args.chosen_addr is None:
        args.master_addr = hosts[0][0]
    if args.chosen_port is None:
        args.master_port = free_port()
