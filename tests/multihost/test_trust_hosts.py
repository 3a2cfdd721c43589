"""Who gets in across (simulated) hosts: one rank on each of h0 and h1, started with torchrun's variables (tcp
backend). With a shared job secret the job is authenticated across hosts; with no secret and hosts whose key
files differ (no shared home) it still runs, after one warning per rank naming the risk and the variable, and
SINGA_LITE_REQUIRE_SECRET=1 makes that an error; a stranger with a wrong secret is refused and the job goes on.
A rank that runs fewer steps is named as having exited normally, also under the hierarchical all-reduce."""
import os
import shutil
import subprocess
import sys

import pytest

import sim_hosts

JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multiproc", "jobs",
                   "trust_job.py")
PORT = "29533"  # inside the namespaces the test made: no other service listens there
LIMIT_S = 120.0
WARNING = "singa_lite: warning: "


def rank_env(cluster, rank, world, keys, **extra):
    env = cluster.env()
    for k in ("SINGA_LITE_JOB_ID", "SINGA_LITE_JOB_SECRET", "SINGA_LITE_JOB_SECRET_FILE", "SINGA_LITE_REQUIRE_SECRET",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": cluster.address["h0"],
                "MASTER_PORT": PORT, "SINGA_LITE_COMM_TIMEOUT": "30", "SINGA_LITE_KEY_DIR": keys, **extra})
    return env


def start(cluster, host, env, *args):
    return cluster.popen(["ip", "netns", "exec", cluster.ns(host), sim_hosts.WRAPPER, "--here", host,
                          sys.executable, JOB, *args], env=env)


def finish(cluster, procs):
    """[(exit code, stdout, stderr)] of every process, killing the cluster's processes on a timeout."""
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=LIMIT_S)
            out.append((p.returncode, o, e))
    except subprocess.TimeoutExpired:
        for p in procs:
            cluster.kill_group(p)
        cluster.kill_all()
        raise
    return out


def one_rank_per_host(cluster, tmp_path, steps="3", local=None, **extra):
    """Rank r on host h<r>, each host with its own key folder (unless `local` names one for both)."""
    procs = []
    for r, host in enumerate(cluster.hosts):
        keys = local or str(tmp_path / f"keys-{host}")
        procs.append(start(cluster, host, rank_env(cluster, r, 2, keys, LOCAL_WORLD_SIZE="1", LOCAL_RANK="0",
                                                   **extra), steps))
    return finish(cluster, procs)


@pytest.mark.slow
def test_a_shared_secret_authenticates_the_job_across_hosts(cluster, tmp_path):
    results = one_rank_per_host(cluster, tmp_path, SINGA_LITE_JOB_SECRET="s3cret-for-this-job-only")
    for code, out, err in results:
        assert code == 0 and '"backend": "tcp"' in out and WARNING not in err, out + err


@pytest.mark.slow
def test_without_a_shared_key_the_job_runs_after_one_warning_or_fails_when_a_secret_is_required(cluster, tmp_path):
    results = one_rank_per_host(cluster, tmp_path)
    for code, out, err in results:
        assert code == 0 and '"sums": 3' in out, out + err
        assert err.count(WARNING) == 1 and "SINGA_LITE_JOB_SECRET" in err and "SINGA_LITE_REQUIRE_SECRET=1" in err, err
    results = one_rank_per_host(cluster, tmp_path, SINGA_LITE_REQUIRE_SECRET="1", SINGA_LITE_COMM_TIMEOUT="10")
    for code, out, err in results:
        assert code == 3 and "(SINGA_LITE_REQUIRE_SECRET is set)" in out and "SINGA_LITE_JOB_SECRET" in out, out + err
    # rank 0 waited for rank 1, and says why it never came
    assert "rank 1 never arrived within 10 s" in results[0][1] and "meanwhile the store refused " \
        f"{cluster.address['h1']}:" in results[0][1] and "(claiming rank 1)" in results[0][1], results[0]


@pytest.mark.slow
def test_a_stranger_with_a_wrong_secret_is_refused_and_the_job_goes_on(cluster, tmp_path):
    secret = {"SINGA_LITE_JOB_SECRET": "the-jobs-own-secret-0123"}
    rank0 = start(cluster, "h0", rank_env(cluster, 0, 2, str(tmp_path / "k0"), **secret), "3")
    stranger = start(cluster, "h1", rank_env(cluster, 1, 2, str(tmp_path / "k1"),
                                             SINGA_LITE_JOB_SECRET="a-guess-at-the-secret-0"), "3")
    (code, out, err), = finish(cluster, [stranger])
    assert code == 3 and "did not prove it holds this job's key" in out, out + err
    rank1 = start(cluster, "h1", rank_env(cluster, 1, 2, str(tmp_path / "k1"), **secret), "3")
    for code, out, err in finish(cluster, [rank0, rank1]):
        assert code == 0 and '"sums": 3' in out, out + err


@pytest.mark.slow
def test_a_host_that_ran_fewer_steps_is_named_as_having_exited_under_the_hierarchical_all_reduce(cluster, tmp_path):
    """2 ranks on each host, the hierarchical (leader) form over tcp; h1's ranks stop after 2 steps."""
    procs = []
    for r in range(4):
        host = cluster.hosts[r // 2]
        env = rank_env(cluster, r, 4, str(tmp_path / "keys"), LOCAL_RANK=str(r % 2), LOCAL_WORLD_SIZE="2",
                       SINGA_LITE_JOB_SECRET="hierarchical-job-secret-0")
        procs.append(start(cluster, host, env, "2" if host == "h1" else "3", "exit", "hierarchical"))
    results = finish(cluster, procs)
    for r in (2, 3):
        assert results[r][0] == 0, results[r]
    leader = results[0]
    assert leader[0] == 3 and "killed or crashed" not in leader[1], leader
    assert "exited normally (its script ended without an uncaught exception) after 2 collective calls" in leader[1] \
        and "did the ranks run different numbers of steps?" in leader[1], leader
    # h0's other rank waited for its leader's broadcast: it hears the leader's cause, not only that it left
    assert results[1][0] == 3 and "aborted by rank 0" in results[1][1] and "different numbers of steps" in \
        results[1][1], results[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_an_encrypted_job_across_hosts(cluster, tmp_path):
    key, cert = str(tmp_path / "tls.key"), str(tmp_path / "tls.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=job", "-keyout", key, "-out", cert], check=True, capture_output=True)
    os.chmod(key, 0o600)
    results = one_rank_per_host(cluster, tmp_path, SINGA_LITE_JOB_SECRET="an-encrypted-jobs-secret",
                                SINGA_LITE_TLS="1", SINGA_LITE_TLS_CERT=cert, SINGA_LITE_TLS_KEY=key)
    for code, out, err in results:
        assert code == 0 and '"sums": 3' in out and WARNING not in err, out + err
