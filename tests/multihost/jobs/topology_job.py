"""Run by tests/multihost/test_sim_hosts.py under mpiexec across simulated hosts: each rank prints one line,
``rank <r> local <local_rank>/<local_size> host <hostname> hosts <node count> backend <backend>``, with the node
count from an all-gather of the hostnames, then (with ``watchers``) one line per mpiexec watcher
(singa_lite/comm/watch.py) running in its network namespace, i.e. on its host:
``rank <r> sees watcher for <host argument> of ranks <r>,<r>``, then (with ``distopt``) the DistOpt scenarios
of tests/multiproc/helpers/distopt_cases.py it passed: ``rank <r> DistOpt scenarios: <names>``.
``python topology_job.py [backend|auto] [watchers] [distopt]``."""
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "multiproc", "helpers"))

from singa_lite import dist  # noqa: E402


def watchers_here() -> list:
    """(host, ranks) of every watcher process in this process's network namespace."""
    here = os.stat("/proc/self/ns/net").st_ino
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
            if os.stat(f"/proc/{pid}/ns/net").st_ino != here:
                continue
        except OSError:
            continue
        script = next((i for i, a in enumerate(argv) if a.endswith("singa_lite/comm/watch.py")), None)
        if script is not None:  # watch.py <socket name> <host> <ready fd> <rank>=<pid> ...
            found.append((argv[script + 2], ",".join(a.split("=")[0] for a in argv[script + 4:] if "=" in a)))
    return found


def main(backend="auto", *what):
    comm = dist.init(backend=None if backend == "auto" else backend)
    host = socket.gethostname()
    names = set(comm.all_gather_object(host))  # every rank's hostname, through the communicator itself
    lines = [f"rank {comm.rank} local {comm.local_rank}/{comm.local_size} host {host} hosts {len(names)} "
             f"backend {comm.backend}\n"]
    if "watchers" in what:
        lines += [f"rank {comm.rank} sees watcher for {h} of ranks {r}\n" for h, r in watchers_here()]
    if "distopt" in what:
        import distopt_cases

        lines.append(f"rank {comm.rank} DistOpt scenarios: {', '.join(distopt_cases.run_all(comm))}\n")
    os.write(1, "".join(lines).encode())  # one write: mpiexec may interleave the ranks' pieces
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
