"""Scenarios for the communication hooks (singa_lite.parallel.hooks / powersgd) on real communicators: each
takes a Communicator, builds GradBuckets itself (as a reducer does) and checks the hooks against numpy
references computed from *every* rank's buffer (each rank can compute them: the buffers are deterministic
functions of the rank and the step). Run by tests/multiproc/test_comm_hooks_dist.py on shm and tcp, and by
jobs/comm_hooks_job.py under mpiexec.

`run_tcp` / `run_shm` start the ranks (forked processes joined by a TcpCommunicator, or the shm backend with a
shared NcclIdHolder)."""
from __future__ import annotations

import numpy as np

from singa_lite import tensor
from singa_lite.parallel import hooks
from singa_lite.parallel.bucket import GradBucket
from singa_lite.parallel.powersgd import PowerSGDState, powerSGD_hook

HOST = "127.0.0.1"


# ----------------------------------------------------------------------------------------- starting ranks
def run_tcp(fn, world_size, *, timeout=180.0, comm_timeout=60.0, args=()):
    """fn(comm, *args) on world_size forked processes joined by a TcpCommunicator (store served here).
    Returns {rank: ("ok", value) | ("error", type name, message)}."""
    from ranks import run_group
    from singa_lite.comm.store import TcpStore

    server = TcpStore(HOST, 0, world_size, is_server=True, timeout=30)
    try:
        group = run_group(_tcp_main, range(world_size), (fn, server.port, world_size, comm_timeout, args),
                          ctx="fork", timeout=timeout, strict=False, exit_grace=None)
    finally:
        server.close()
    return {r: ("ok", v) if kind == "ok" else ("error", *v) for r, (kind, v) in group.results.items()}


def _tcp_main(rank, fn, port, world_size, comm_timeout, args):
    from singa_lite.comm.store import TcpStore
    from singa_lite.comm.tcp import TcpCommunicator

    store = TcpStore(HOST, port, world_size, is_server=False, timeout=30)
    comm = TcpCommunicator(store, rank, world_size, rank, world_size, timeout=comm_timeout)
    try:
        return fn(comm, *args)
    finally:
        if comm._broken is None:
            comm.barrier()
        comm.close()
        store.close()


def run_shm(fn, world_size, *, timeout=180.0, comm_timeout=60.0, args=()):
    """fn(comm, *args) on world_size forked processes over the shm backend. Same result form as run_tcp."""
    from dist_cases import run_ranks

    out, _, _ = run_ranks(fn, world_size, method="fork", timeout=timeout, comm_timeout=comm_timeout, args=args)
    return out


def run(backend: str, fn, world_size, **kw):
    return {"tcp": run_tcp, "shm": run_shm}[backend](fn, world_size, **kw)


# ----------------------------------------------------------------------------------------- buckets
def params(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [tensor.Tensor(data=rng.standard_normal(s).astype(np.float32), stores_grad=True, name=f"p{i}")
            for i, s in enumerate(shapes)]


def bucket(index, flat: np.ndarray, ps, comm, last=True):
    return GradBucket(index, tensor.from_numpy(np.ascontiguousarray(flat)), ps, last, comm)


def grads(rank: int, step: int, n: int, seed: int = 0) -> np.ndarray:
    """A rank's flat gradient at a step: smooth low-rank-ish structure plus rank-dependent noise, float32."""
    rng = np.random.default_rng([seed, rank, step])
    base = np.random.default_rng([seed, 1000 + step]).standard_normal(n)  # shared by the ranks
    return (base + 0.3 * rng.standard_normal(n)).astype(np.float32)


def every_rank(comm, step, n, seed=0):
    return [grads(r, step, n, seed) for r in range(comm.world_size)]


def numpy_of(t) -> np.ndarray:
    return tensor.to_numpy(t) if isinstance(t, tensor.Tensor) else np.asarray(t)


def same_bits_everywhere(comm, a: np.ndarray, what: str) -> None:
    rows = numpy_of(comm.all_gather(tensor.from_numpy(np.ascontiguousarray(a, np.float32))))
    for r in range(comm.world_size):
        assert rows[r].tobytes() == np.asarray(a, np.float32).tobytes(), f"{what}: rank {r} differs from {comm.rank}"


# ----------------------------------------------------------------------------------------- plain hooks
def check_plain_hooks(comm):
    """allreduce_hook: exact (small integers, so every sum is exact); fp16 / bf16: within their precision;
    byte counters; each state form (None, a Communicator, a HookState)."""
    P, r = comm.world_size, comm.rank
    ps = params([(6, 5), (5,), (7,)])
    n = sum(p.size() for p in ps)
    rows = [((np.arange(n) * 7 + q * 5) % 97 - 40).astype(np.float32) for q in range(P)]
    want = np.sum(rows, axis=0, dtype=np.float32) / np.float32(P)  # the sum is exact; one rounding for /P
    for state in (None, comm, hooks.HookState(), hooks.HookState(comm)):
        b = bucket(0, rows[r], ps, comm)
        out = hooks.run_comm_hook(hooks.allreduce_hook, state, b).wait()
        assert out is b.buffer()
        np.testing.assert_array_equal(numpy_of(out), want, err_msg=f"allreduce_hook, state {state!r}")
        if isinstance(state, hooks.HookState):
            assert state.bytes_sent == state.bytes_plain == 4 * n and state.buckets == 1, state

    every = [np.random.default_rng(q).standard_normal(n).astype(np.float32) * 3 for q in range(P)]
    for hook, rel in ((hooks.fp16_compress_hook, 2.0 ** -10), (hooks.bf16_compress_hook, 2.0 ** -7)):
        state = hooks.HookState()
        b = bucket(3, every[r], ps, comm)
        out = numpy_of(hooks.run_comm_hook(hook, state, b).wait())
        assert b.buffer().dtype == tensor.float32  # cast back into the float32 buffer
        exact = np.mean(np.stack(every).astype(np.float64), axis=0)
        # Each rank's value rounded once to 16 bits, the mean rounded once more: 2 half-ulps of the largest.
        tol = 2 * rel * np.abs(np.stack(every)).max()
        np.testing.assert_allclose(out, exact, rtol=0, atol=tol, err_msg=hook.__name__)
        assert np.abs(out - exact).max() > 0 or P == 1, f"{hook.__name__}: no rounding at all (nothing compressed?)"
        assert state.bytes_sent * 2 == state.bytes_plain == 4 * n, state
        same_bits_everywhere(comm, out, hook.__name__)
    # float16 overflow: the mean of 40000 is representable, the sum over 2+ ranks is not
    b = bucket(0, np.full(n, 40000, np.float32), ps, comm)
    np.testing.assert_array_equal(numpy_of(hooks.run_comm_hook(hooks.fp16_compress_hook, None, b).wait()),
                                  np.full(n, 40000, np.float32))
    return "plain"


# ----------------------------------------------------------------------------------------- PowerSGD in numpy
def np_orthogonalize(a: np.ndarray, eps: float) -> np.ndarray:
    a = a.copy()
    for i in range(a.shape[1]):
        norm = np.sqrt((a[:, i] ** 2).sum())
        a[:, i] /= norm + eps if eps else (norm if norm else 1.0)
        a[:, i + 1:] -= (a[:, i:i + 1] * a[:, i + 1:]).sum(0, keepdims=True) * a[:, i:i + 1]
    return a


class NumpyPowerSGD:
    """The algorithm of powerSGD_hook, in float64 numpy, run on every rank's buffers at once: the reference.
    One instance per bucket layout (shapes); the Q seed drawn the way the hook draws it."""

    def __init__(self, shapes, world, rank=1, start=0, min_rate=2.0, error_feedback=True, warm_start=True,
                 eps=0.0, seed=0):
        self.world, self.start, self.ef, self.warm, self.eps = world, start, error_feedback, warm_start, eps
        self.rng = np.random.RandomState(seed)
        self.matrices, self.plain, offset, q_total = [], [], 0, 0
        for s in shapes:
            size = int(np.prod(s))
            if len(s) >= 2:
                n, m = s[0], size // s[0]
                r = min(n, m, rank)
                if n * m > (n + m) * r * min_rate:
                    self.matrices.append((offset, n, m, r, q_total))
                    q_total += m * r
                    offset += size
                    continue
            self.plain.append((offset, size))
            offset += size
        self.q_total, self.iter, self.q = q_total, 0, None
        self.errors = [[np.zeros((n, m)) for _, n, m, _, _ in self.matrices] for _ in range(world)]

    def step(self, bufs):
        """bufs: every rank's flat float32 buffer -> the averaged buffer the hook must return (float64)."""
        bufs = [b.astype(np.float64) for b in bufs]
        out = np.mean(bufs, axis=0)
        self.iter += 1
        if self.iter - 1 < self.start or not self.matrices:
            return out
        ms = [[b[o:o + n * m].reshape(n, m) + (self.errors[k][i] if self.ef else 0)
               for i, (o, n, m, _, _) in enumerate(self.matrices)] for k, b in enumerate(bufs)]
        if self.q is None or not self.warm:
            seed = self.rng.randint(1_000_000_000)
            flat = np.random.default_rng(seed).standard_normal(self.q_total).astype(np.float32).astype(np.float64)
            self.q = [flat[qo:qo + m * r].reshape(m, r) for _, _, m, r, qo in self.matrices]
        else:
            self.q = [np_orthogonalize(q, self.eps) for q in self.q]
        for i, (o, n, m, _, _) in enumerate(self.matrices):
            p = np_orthogonalize(sum(ms[k][i] @ self.q[i] for k in range(self.world)), self.eps)
            self.q[i] = sum(ms[k][i].T @ p for k in range(self.world)) / self.world
            approx = p @ self.q[i].T
            for k in range(self.world):
                self.errors[k][i] = ms[k][i] - approx
            out[o:o + n * m] = approx.reshape(-1)
        return out


def check_powersgd_matches_numpy(comm, steps=4):
    """Several steps of two buckets (a matrix and a bias; a 4-D conv kernel, a matrix too small to pay and a
    bias) against NumpyPowerSGD: every step's averaged buffer, every rank's error memory, the same bits on
    every rank, the byte counters."""
    P, r = comm.world_size, comm.rank
    layouts = [[(16, 12), (12,)], [(12, 3, 2, 2), (3, 2), (10,)]]
    for opts in ({"rank": 2, "start": 1}, {"rank": 1, "start": 0, "warm_start": False, "eps": 1e-8},
                 {"rank": 3, "start": 0, "error_feedback": False}):
        state = PowerSGDState(matrix_approximation_rank=opts["rank"], start_powerSGD_iter=opts["start"],
                              use_error_feedback=opts.get("error_feedback", True),
                              warm_start=opts.get("warm_start", True),
                              orthogonalization_epsilon=opts.get("eps", 0.0), random_seed=7)
        ps = [params(shapes, seed=i) for i, shapes in enumerate(layouts)]
        refs = [NumpyPowerSGD(shapes, P, rank=opts["rank"], start=opts["start"],
                              error_feedback=opts.get("error_feedback", True),
                              warm_start=opts.get("warm_start", True), eps=opts.get("eps", 0.0), seed=7)
                for shapes in layouts]
        # The hook draws one seed per bucket in bucket order, the reference per instance: share one stream.
        refs[1].rng = refs[0].rng
        for step in range(steps):
            handles, wants = [], []
            for i, shapes in enumerate(layouts):
                n = sum(int(np.prod(s)) for s in shapes)
                bufs = every_rank(comm, 10 * step + i, n, seed=i)
                handles.append(hooks.run_comm_hook(powerSGD_hook, state,
                                                   bucket(i, bufs[r], ps[i], comm, last=i == len(layouts) - 1)))
                wants.append(refs[i].step(bufs))
            for i, (h, want) in enumerate(zip(handles, wants)):
                got = numpy_of(h.wait())
                scale = np.abs(want).max()
                np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale,
                                           err_msg=f"{opts} step {step} bucket {i}")
                same_bits_everywhere(comm, got, f"powerSGD {opts} step {step} bucket {i}")
                mem = state._buckets.get(i)
                if step >= opts["start"] and refs[i].matrices and mem.error is not None:
                    e = numpy_of(mem.error)
                    want_e = np.concatenate([x.reshape(-1) for x in refs[i].errors[r]])
                    np.testing.assert_allclose(e, want_e, rtol=0, atol=2e-5 * scale, err_msg=f"error {opts}")
        assert state.iter == steps
        # bytes: plain steps send the buffers; compressed ones P, Q and the uncompressed gradients
        plain = sum(4 * sum(int(np.prod(s)) for s in shapes) for shapes in layouts)
        compressed = sum(4 * (sum((n + m) * rr for _, n, m, rr, _ in ref.matrices) + sum(s for _, s in ref.plain))
                         for ref in refs)
        assert state.bytes_plain == steps * plain, state
        assert state.bytes_sent == opts["start"] * plain + (steps - opts["start"]) * compressed, state
        assert state.compression_rate > 1.2, state  # fewer bytes than plain, even at rank 3
    return "powersgd"


def check_rank1_exact_and_residual(comm):
    """Rank-1 PowerSGD of ranks' matrices u v_k^T (one column space): the average exactly; and each rank's
    error + the approximation == its input (error feedback loses nothing)."""
    P, r = comm.world_size, comm.rank
    u = np.linspace(-1, 2, 20)
    vs = [np.cos(np.arange(15) * (q + 1)) + q for q in range(P)]
    mats = [np.outer(u, v).astype(np.float32) for v in vs]
    ps = params([(20, 15), (15,)])
    bias = [np.full(15, q, np.float32) for q in range(P)]
    state = PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=0)
    b = bucket(0, np.concatenate([mats[r].reshape(-1), bias[r]]), ps, comm)
    got = numpy_of(hooks.run_comm_hook(powerSGD_hook, state, b).wait())
    want = np.mean(np.stack(mats).astype(np.float64), axis=0)
    np.testing.assert_allclose(got[:300].reshape(20, 15), want, rtol=0, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(got[300:], np.full(15, (P - 1) / 2), rtol=1e-6)
    # a full-rank input on rank 0 now: the approximation differs from the average, and error + approximation
    # is still exactly this rank's input
    rng = np.random.default_rng(r)
    m = rng.standard_normal((20, 15)).astype(np.float32)
    state = PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=0)
    b = bucket(0, np.concatenate([m.reshape(-1), bias[r]]), ps, comm)
    got = numpy_of(hooks.run_comm_hook(powerSGD_hook, state, b).wait())[:300].reshape(20, 15)
    e = numpy_of(state._buckets[0].error).reshape(20, 15)
    np.testing.assert_allclose(e + got, m, rtol=0, atol=1e-6 * np.abs(m).max())
    assert np.abs(e).max() > 0.1  # a rank-2 approximation of a random 20 x 15 matrix is far from it
    assert np.linalg.matrix_rank(got.astype(np.float64), tol=1e-4) == 2
    return "rank1"


# ----------------------------------------------------------------------------------------- convergence
def least_squares(comm, hook, state, steps=300, lr=0.05, seed=0):
    """Linear regression Y = X W* + b* on this rank's shard, W 24 x 16, trained by SGD on the gradients the
    hook averages (one bucket: W then b). Returns the full-data loss after each of the last steps, the same on
    every rank."""
    P, r = comm.world_size, comm.rank
    rng = np.random.default_rng(seed)
    d, k, n = 24, 16, 96 * P
    X = rng.standard_normal((n, d))
    W_true, b_true = rng.standard_normal((d, k)), rng.standard_normal(k)
    Y = X @ W_true + b_true + 0.01 * rng.standard_normal((n, k))
    Xs, Ys = X[r::P], Y[r::P]
    W, b = np.zeros((d, k)), np.zeros(k)
    ps = [tensor.Tensor(data=W.astype(np.float32), stores_grad=True), tensor.Tensor(data=b.astype(np.float32),
                                                                                     stores_grad=True)]
    losses = []
    for _ in range(steps):
        err = Xs @ W + b - Ys
        gW, gb = Xs.T @ err / len(Xs), err.mean(0)
        flat = np.concatenate([gW.reshape(-1), gb]).astype(np.float32)
        avg = numpy_of(hooks.run_comm_hook(hook, state, bucket(0, flat, ps, comm)).wait()).astype(np.float64)
        W -= lr * avg[:d * k].reshape(d, k)
        b -= lr * avg[d * k:]
        losses.append(float(((X @ W + b - Y) ** 2).mean()))
    return losses


def check_powersgd_converges(comm):
    plain = least_squares(comm, hooks.allreduce_hook, None)
    state = PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10)
    psgd = least_squares(comm, powerSGD_hook, state)
    start = plain[0]
    assert plain[-1] < 1e-2 * start, plain[-1]
    # with error feedback the compressed run reaches the plain run's loss (the noise floor here)...
    assert psgd[-1] < 1.05 * plain[-1], (psgd[-1], plain[-1])
    assert state.compression_rate > 3, state  # 24 x 16 at rank 2: (24 + 16) 2 + 16 vs 400 elements
    # ... and without it, it stalls far above (what makes the check above meaningful)
    no_ef = least_squares(comm, powerSGD_hook, PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10,
                                                             use_error_feedback=False))
    assert no_ef[-1] > 10 * plain[-1], (no_ef[-1], plain[-1])
    return {"plain": plain[-1], "powersgd": psgd[-1], "no_error_feedback": no_ef[-1],
            "compression": state.compression_rate}


def scenario_all(comm):
    """Everything above, in one group of processes (starting ranks is the slow part)."""
    done = [check_plain_hooks(comm), check_powersgd_matches_numpy(comm), check_rank1_exact_and_residual(comm)]
    conv = check_powersgd_converges(comm)
    return done, conv
