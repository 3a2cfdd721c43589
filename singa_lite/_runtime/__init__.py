"""What singa_lite settles with the process it runs in, before and beside the C++ core: glibc malloc's
thresholds (malloc.py), the OpenBLAS and numpy thread pools (threads.py), where NVIDIA's pip wheels put their
libraries (wheels.py), and GPU facts read from the CUDA driver (cuda_query.py). Internal: no public API."""
