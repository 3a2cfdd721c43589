"""Run by tests/multihost/test_sim_hosts.py under mpiexec across simulated hosts: each rank prints one line,
``rank <r> local <local_rank>/<local_size> host <hostname> hosts <node count> backend <backend>``, with the node
count from an all-gather of the hostnames, then (with ``watchers``) one line per mpiexec watcher
(singa_lite/comm/watch.py) running in its network namespace, i.e. on its host:
``rank <r> sees watcher for <host argument> of ranks <r>,<r>``, then (with ``distopt``) the DistOpt scenarios
of tests/multiproc/helpers/distopt_cases.py it passed: ``rank <r> DistOpt scenarios: <names>``, then (with
``gpus``) the GPU the nccl backend would give this rank on hosts of 2 GPUs and what it says on hosts of 1:
``rank <r> gpu cuda:<i>; on 1 GPU: <error>`` (no GPU here: the device count and the device are stood in for, so
what is checked is the mapping from the host's local ranks, as SINGA's ``create_cuda_gpu_on(local_rank)``).
``python topology_job.py [backend|auto] [watchers] [distopt] [gpus]``."""
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


def gpu_mapping(comm) -> str:
    """Which GPU nccl.choose_device gives this rank on hosts of 2 GPUs, and its error on hosts of 1."""
    from singa_lite import _core, device
    from singa_lite.comm import nccl

    real = _core.cuda_device_count, device.create_cuda_gpu_on
    device.create_cuda_gpu_on = lambda i: f"cuda:{i}"
    try:
        _core.cuda_device_count = lambda: 2
        chosen = nccl.choose_device(None, comm.local_rank, comm.local_size)
        _core.cuda_device_count = lambda: 1
        try:
            nccl.choose_device(None, comm.local_rank, comm.local_size)
            one = "fits"
        except ValueError as e:
            one = str(e)
    finally:
        _core.cuda_device_count, device.create_cuda_gpu_on = real
    return f"rank {comm.rank} gpu {chosen}; on 1 GPU: {one}\n"


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
    if "gpus" in what:
        lines.append(gpu_mapping(comm))
    os.write(1, "".join(lines).encode())  # one write: mpiexec may interleave the ranks' pieces
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
