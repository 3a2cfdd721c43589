"""Reading the launch environment (singa_lite/comm/env.py): torchrun / Kubernetes and Slurm variables, Slurm's
compressed node lists, the order of precedence of dist.init()'s launcher detection, rank 0's backend decision,
the errors for missing or inconsistent values, and singa-run's hostfiles and remote rank commands. Nothing here
starts a process or connects anywhere."""
import sys

import pytest

from singa_lite import dist
from singa_lite.comm import env, launch_args

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SLURM = {  # task 5 of `srun -N 3 -n 7` on nodes gpu[07-08],cpu1 (3 + 3 + 1 tasks)
    "SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_STEP_NUM_TASKS": "7", "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "3(x2),1", "SLURM_STEP_NODELIST": "gpu[07-08],cpu1",
    "SLURM_JOB_NODELIST": "gpu[07-09],cpu1", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0"}


@pytest.mark.parametrize("text,names", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),  # the low bound's width is kept
    ("a[1-2]b[3,5]", ["a1b3", "a1b5", "a2b3", "a2b5"]),
    ("rack1-node[1-2].cluster, login", ["rack1-node1.cluster", "rack1-node2.cluster", "login"]),
])
def test_slurm_node_lists_expand(text, names):
    assert env.expand_nodelist(text) == names


@pytest.mark.parametrize("text,message", [
    ("", "expected names like"),
    ("node[01-03", "'\\[' is never closed"),
    ("node01]", "'\\]' without '\\['"),
    ("node[1-[2]]", "nested"),
    ("node[03-01]", "range '03-01' goes down"),
    ("node[a-b]", "expected numbers or ranges"),
    ("node1,,node2", "an empty name"),
])
def test_bad_slurm_node_lists_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        env.expand_nodelist(text)


def test_slurm_tasks_per_node():
    assert env.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert env.expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="expected a list like"):
        env.expand_tasks_per_node("2(3)")


def test_torchrun_variables():
    e = env.read_torchrun(dict(TORCHRUN, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1"))
    assert (e.launcher, e.rank, e.world_size, e.master_addr, e.master_port) == ("torchrun", 3, 4, "10.0.0.1", 29500)
    assert (e.local_rank, e.local_size, e.node_rank) == (1, 2, 1)
    # Kubernetes' PyTorchJob sets only the four: the local values come from the rendezvous
    e = env.read_torchrun(TORCHRUN)
    assert (e.local_rank, e.local_size, e.node_rank) == (None, None, None)
    # under torchrun itself, its agent's store holds MASTER_PORT: ours takes the next port
    assert env.read_torchrun(dict(TORCHRUN, TORCHELASTIC_USE_AGENT_STORE="True")).master_port == 29501


@pytest.mark.parametrize("change,message", [
    ({"RANK": "4"}, "need 0 <= RANK < WORLD_SIZE, got RANK=4, WORLD_SIZE=4"),
    ({"RANK": "-1"}, "RANK must be an integer from 0 to 65536, got '-1'"),
    ({"WORLD_SIZE": "four"}, "WORLD_SIZE must be an integer from 1 to 65536, got 'four'"),
    ({"WORLD_SIZE": "70000"}, "WORLD_SIZE must be an integer from 1 to 65536, got '70000' \\(a job has at most "),
    ({"WORLD_SIZE": str(10 ** 12)}, "WORLD_SIZE must be an integer from 1 to 65536, got '1000000000000'"),
    ({"WORLD_SIZE": "9" * 5000}, "WORLD_SIZE must be an integer from 1 to 65536, got '999.*\\.\\.\\.'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port \\(1 to 65535\\), got '70000'"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE"),
    ({"LOCAL_RANK": "0"}, "LOCAL_WORLD_SIZE must be an integer from 1 to 65536, got None"),
    ({"GROUP_RANK": "4"}, "GROUP_RANK must be an integer from 0 to 3, got '4'"),
])
def test_inconsistent_torchrun_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        env.read_torchrun(dict(TORCHRUN, **change))


def test_missing_torchrun_variables_name_what_is_missing_and_what_was_seen():
    with pytest.raises(ValueError) as info:
        env.read({"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"})
    text = str(info.value)
    assert "MASTER_ADDR, MASTER_PORT not set" in text
    assert "torchrun: RANK, WORLD_SIZE" in text and "mpiexec: OMPI_COMM_WORLD_RANK" in text
    assert "start the job with torchrun, srun or singa-run --hostfile" in text
    with pytest.raises(ValueError, match="no launcher's variables are set"):
        env.read({})


def test_slurm_variables():
    e = env.read_slurm(SLURM)
    assert (e.launcher, e.rank, e.world_size, e.local_rank, e.local_size, e.node_rank) == ("slurm", 5, 7, 2, 3, 1)
    assert e.nodes == ["gpu07", "gpu08", "cpu1"]  # the step's list, before the job's
    assert e.master_addr == "gpu07"  # srun puts task 0 on the step's first node
    assert e.master_port == env.SLURM_PORT_BASE + 123456 % env.SLURM_PORT_SPAN == 23456
    e = env.read_slurm(dict(SLURM, MASTER_ADDR="10.1.1.1", MASTER_PORT="4000"))
    assert (e.master_addr, e.master_port) == ("10.1.1.1", 4000)
    # an allocation with --ntasks-per-node and only the job's list
    only_job = {k: v for k, v in SLURM.items() if not k.startswith("SLURM_STEP_")}
    only_job.update(SLURM_NTASKS_PER_NODE="3", SLURM_STEP_ID="0")
    e = env.read_slurm(only_job)
    assert (e.world_size, e.local_size, e.master_addr) == (7, 3, "gpu07")


@pytest.mark.parametrize("change,message", [
    ({"SLURM_NODEID": "3"}, "SLURM_NODEID=3, but SLURM_STEP_NODELIST names 3 node\\(s\\)"),
    ({"SLURM_LOCALID": "3"}, "SLURM_LOCALID=3, but this node runs 3 task\\(s\\)"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3,3"}, "adds up to 6 tasks, but SLURM_STEP_NUM_TASKS=7"),
    ({"SLURM_PROCID": "7"}, "need SLURM_PROCID < SLURM_STEP_NUM_TASKS, got 7 and 7"),
    ({"SLURM_STEP_NODELIST": "gpu[07-"}, "is never closed"),
    ({"SLURM_JOB_ID": "", "MASTER_PORT": ""}, "neither MASTER_PORT nor SLURM_JOB_ID"),
    ({"SLURM_STEP_NUM_TASKS": "70000"}, "SLURM_STEP_NUM_TASKS must be an integer from 1 to 65536, got '70000'"),
    # refused before a single name is made (this list names 10^12 hosts)
    ({"SLURM_STEP_NODELIST": "n[000000-999999]x[000000-999999]"},
     "SLURM_STEP_NODELIST: Slurm node list .* names 1000000000000 hosts, more than the 65536 a job may have"),
    ({"SLURM_STEP_NODELIST": "n" * (2 << 20)}, "SLURM_STEP_NODELIST: Slurm node list of 2097152 characters"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x100000000)"},
     "SLURM_STEP_TASKS_PER_NODE: Slurm tasks per node: '1\\(x100000000\\)' lists 100000000 nodes"),
])
def test_inconsistent_slurm_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        env.read_slurm(dict(SLURM, **change))


def test_order_of_precedence():
    holder = {env.HOLDER_VAR: "{}"}
    mpi = {"PMI_RANK": "0"}
    one_task = dict(SLURM, SLURM_NTASKS="1", SLURM_STEP_NUM_TASKS="1", SLURM_PROCID="0")
    assert env.detect({**holder, **mpi, **TORCHRUN, **SLURM}) == "singa-run"
    assert env.detect({**mpi, **TORCHRUN, **SLURM}) == "mpiexec"  # srun --mpi=pmi2 is MPI's
    assert env.detect({**TORCHRUN, **SLURM}) == "torchrun"  # torchrun started by srun
    assert env.detect(SLURM) == "slurm"
    assert env.detect(one_task) is None  # `srun python train.py`: one process, as before
    assert env.detect({k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}) is None  # a batch shell, no srun
    assert env.detect({}) is None
    for partial in ("RANK", "WORLD_SIZE", "MASTER_PORT"):  # an incomplete torchrun environment changes nothing
        assert env.detect({k: v for k, v in TORCHRUN.items() if k != partial}) is None
    assert env.detect({"RANK": "3", "WORLD_SIZE": "4"}) is None
    # init_method='env': torchrun's variables when complete, else Slurm's (with MASTER_ADDR taken from the env)
    assert env.read({**TORCHRUN, **SLURM}).launcher == "torchrun"
    e = env.read({**SLURM, "MASTER_ADDR": "head"})
    assert (e.launcher, e.master_addr) == ("slurm", "head")


def test_local_ranks_follow_the_hosts():
    assert env.local_ranks(["a", "a", "b", "b"]) == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert env.local_ranks(["a", "b", "a", "c"]) == [(0, 2), (0, 1), (1, 2), (0, 1)]


def rec(node, wanted=None, gpu=False):
    return {"host": node, "node": node + "|boot|1", "wanted": wanted, "gpu": gpu}


def test_backend_decision():
    one_host = env.decide([rec("a"), rec("a")])
    assert one_host["backend"] == "shm" and one_host["shm_name"].startswith("/singa_lite_")
    assert one_host["nodes"] == [0, 0] and one_host["error"] is None
    assert env.decide([rec("a"), rec("b")])["backend"] == "tcp"
    assert env.decide([rec("a", gpu=True), rec("b", gpu=True)])["backend"] == "nccl"
    assert env.decide([rec("a", "tcp"), rec("a", "tcp")])["backend"] == "tcp"  # asked for: on one host too
    table = env.decide([rec("a", "shm"), rec("b", "shm"), rec("b", "shm")])
    assert "backend 'shm' needs every rank on one host, but the ranks run on 2 hosts (a: rank(s) 0; b: rank(s) " \
           "1, 2)" in table["error"]
    assert "rank(s) 0: tcp; rank(s) 1: automatic" in env.decide([rec("a", "tcp"), rec("a")])["error"]
    assert "rank(s) 1 made a GPU their default device" in env.decide([rec("a"), rec("a", gpu=True)])["error"]


def test_backend_requests_under_env_init(monkeypatch):
    monkeypatch.delenv(env.BACKEND_VAR, raising=False)
    assert env.wanted_backend(None) is None and env.wanted_backend("tcp") == "tcp"
    with pytest.raises(ValueError, match="backend 'mpi' takes its ranks from mpiexec"):
        env.wanted_backend("mpi")
    monkeypatch.setenv(env.BACKEND_VAR, "gloo")
    with pytest.raises(ValueError, match="got 'gloo' \\(from SINGA_LITE_COMM_BACKEND\\)"):
        env.wanted_backend(None)


def test_init_method_arguments(monkeypatch):
    for var in list(TORCHRUN) + list(SLURM) + ["LOCAL_RANK", "LOCAL_WORLD_SIZE"]:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="init_method must be 'env'"):
        dist.init(init_method="tcp://x")
    with pytest.raises(ValueError, match="leave out holder=, rank=, world_size= and store="):
        dist.init(init_method="env", rank=0, world_size=2)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"):
        dist.init(init_method="env")


# ---------------------------------------------------------------- singa-run --hostfile: reading and planning
def hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_hostfiles_of_both_forms(tmp_path):
    mpich = hostfile(tmp_path, "# MPICH\nnode1:2\n\n  node2:3   # the big one\nnode3\nnode1:1\n")
    assert launch_args.read_hostfile(mpich) == [("node1", 3), ("node2", 3), ("node3", 1)]  # node1 named twice: 3
    ompi = hostfile(tmp_path, "node1 slots=2 max_slots=4\n10.0.0.2 slots=2\n#node3 slots=8\nnode4\n")
    assert launch_args.read_hostfile(ompi) == [("node1", 2), ("10.0.0.2", 2), ("node4", 1)]


@pytest.mark.parametrize("text,message", [
    ("a:2\nb:x\n", "hosts:2: 'b:x': the number of slots must be a positive integer, got 'x'"),
    ("a slots=0\n", "hosts:1: 'a slots=0': the number of slots must be a positive integer, got '0'"),
    ("a:2\n\nb slots=2 cpus=4\n", "hosts:3: 'b slots=2 cpus=4': unexpected 'cpus=4'; expected 'host', 'host:N'"),
    ("a:2 slots=2\n", "hosts:1: 'a:2 slots=2': unexpected 'slots=2'"),
    (":4\n", "hosts:1: ':4': no host name"),
    ("# nobody\n\n", "names no host"),
])
def test_bad_hostfile_lines_are_named(tmp_path, text, message):
    path = hostfile(tmp_path, text)
    with pytest.raises(launch_args.UsageError) as info:
        launch_args.read_hostfile(path)
    assert message in str(info.value).replace(path, "hosts")


def singa_run_args(argv):
    args = launch_args.parse_command_line(launch_args.build_parser(), argv)
    launch_args.check_args(args)
    return args


def test_hostfile_placement_and_rank_commands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    path = hostfile(tmp_path, "h1:2\nh2 slots=2\n")
    args = singa_run_args(["--hostfile", path, "train.py", "--lr", "0.1"])
    assert args.np == 4 and args.master_addr == "h1" and 1 <= args.master_port <= 65535  # every slot, a free port
    assert [(p["host"], p["node"], p["local_rank"], p["local_size"]) for p in args.placement] == [
        ("h1", 0, 0, 2), ("h1", 0, 1, 2), ("h2", 1, 0, 2), ("h2", 1, 1, 2)]
    args = singa_run_args(["--hostfile", path, "-np", "3", "--launcher-exec", "ssh -o BatchMode=yes",
                           "--master-addr", "10.0.0.1", "--master-port", "4000", "--backend", "tcp", "train.py"])
    cmd = launch_args.remote_command(args, 2)
    assert cmd[:4] == ["ssh", "-o", "BatchMode=yes", "h2"]
    assert cmd[4:8] == [sys.executable, "-m", "singa_lite.comm.launcher", "--singa-run-rank"]
    assert cmd[8] == str(tmp_path)
    assert cmd[9:cmd.index("--")] == ["RANK=2", "WORLD_SIZE=3", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=1",
                                      "MASTER_ADDR=10.0.0.1", "MASTER_PORT=4000", f"SINGA_LITE_JOB_ID={args.job_id}",
                                      "SINGA_LITE_COMM_BACKEND=tcp", "PYTHONUNBUFFERED=1"]
    assert args.job_id.startswith("singa-run-") and len(args.secret) == 64
    assert not any(args.secret in word for word in cmd)  # the secret goes through the helper's stdin
    assert cmd[cmd.index("--") + 1:] == [sys.executable, "train.py"]
    # words with spaces are quoted for the remote shell, as ssh expects
    args = singa_run_args(["--hostfile", path, "train.py", "a b"])
    assert launch_args.remote_command(args, 0)[-1] == "'a b'"


@pytest.mark.parametrize("argv,message", [
    (["--hostfile", "HOSTS", "-np", "5", "train.py"], "-np 5, but HOSTS has 4 slot(s) (h1: 2, h2: 2)"),
    (["--hostfile", "HOSTS", "--master-port", "70000", "train.py"], "--master-port must be a TCP port"),
    (["--hostfile", "MISSING", "train.py"], "cannot read the hostfile 'MISSING'"),
    (["-np", "2", "--master-addr", "x", "train.py"], "--master-addr is for jobs on several hosts"),
    (["-np", "2", "--backend", "tcp", "train.py"], "--backend tcp is for the ranks of a --hostfile"),
    (["train.py"], "the following arguments are required: -np"),
])
def test_singa_run_hostfile_errors(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    path = hostfile(tmp_path, "h1:2\nh2 slots=2\n")
    argv = [path if a == "HOSTS" else a for a in argv]
    with pytest.raises(launch_args.UsageError) as info:
        singa_run_args(argv)
    assert message in str(info.value).replace(path, "HOSTS")


def test_a_store_of_the_callers_is_an_explicit_bootstrap(monkeypatch):
    # A complete torchrun environment, but the caller brings its own store: no env rendezvous (which would try
    # to reach MASTER_ADDR), the tcp backend's own checks apply.
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="backend 'tcp' needs rank= and world_size= with its store"):
        dist.init(backend="tcp", store=object())
    with pytest.raises(ValueError, match="leave out holder=, rank=, world_size= and store="):
        dist.init(init_method="env", store=object())


def test_singa_run_checks_a_given_secret_before_starting_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("SINGA_LITE_JOB_SECRET", "short")
    with pytest.raises(launch_args.UsageError, match="a job secret must be 16 to 4096 characters, got 5"):
        singa_run_args(["-np", "2", "train.py"])
    monkeypatch.setenv("SINGA_LITE_JOB_SECRET", "a-long-enough-secret")
    monkeypatch.setenv("SINGA_LITE_JOB_ID", "my-run")
    args = singa_run_args(["-np", "2", "train.py"])
    assert (args.job_id, args.secret) == ("my-run", "a-long-enough-secret")  # the user's choice stands
    env = launch_args.rank_environment(args, 1, "{}")
    assert env["SINGA_LITE_JOB_ID"] == "my-run" and env["SINGA_LITE_JOB_SECRET"] == "a-long-enough-secret"
