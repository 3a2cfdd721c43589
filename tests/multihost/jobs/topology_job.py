"""Run by tests/multihost/test_sim_hosts.py under mpiexec across simulated hosts: each rank prints one line,
``rank <r> local <local_rank>/<local_size> host <hostname> hosts <node count> backend <backend>``, with the node
count from an all-gather of the hostnames. ``python topology_job.py [backend]`` (default: auto-detected)."""
import os
import socket
import sys

from singa_lite import dist


def main(backend=None):
    comm = dist.init(backend=backend)
    host = socket.gethostname()
    names = set(comm.all_gather_object(host))  # every rank's hostname, through the communicator itself
    os.write(1, f"rank {comm.rank} local {comm.local_rank}/{comm.local_size} host {host} hosts {len(names)} "
                f"backend {comm.backend}\n".encode())  # one write: mpiexec may interleave the ranks' pieces
    comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:2])
