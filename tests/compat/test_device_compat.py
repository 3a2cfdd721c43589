"""SINGA's Device API that singa_lite follows (singa_lite/device.py): graph mode flags and iterations, time
profiling measured through the autograd engine's hook, and the module's device functions.

Each test fails without the piece it names: the profiler tests run an operator that sleeps a known time,
so the times must be measured, not made up.
"""
import time

import numpy as np
import pytest

from singa_lite import CudaError, autograd, device, layer, model, opt, tensor
from singa_lite.autograd import Operator

FWD_SLEEP, BWD_SLEEP = 0.02, 0.01


class Sleepy(Operator):
    """Identity that sleeps FWD_SLEEP in forward and BWD_SLEEP in backward."""

    def forward(self, x):
        time.sleep(FWD_SLEEP)
        return x.clone()

    def backward(self, dy):
        time.sleep(BWD_SLEEP)
        return dy


class SleepyNet(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(2)

    def forward(self, x):
        return Sleepy()(self.fc(x))[0]  # after a parameter, so its backward runs

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.mse_loss(out, y)
        self.optimizer(loss)
        return out, loss


@pytest.fixture
def cpu():
    dev = device.create_cpu_device()
    dev.ResetGraph()
    yield dev
    dev.SetVerbosity(0)
    dev.SetSkipIteration(5)
    dev.EnableGraph(False)
    dev.ResetGraph()
    autograd.training = False


def data(dev):
    x = tensor.Tensor((4, 3), dev).gaussian(0.0, 1.0)
    y = tensor.Tensor((4, 2), dev).gaussian(0.0, 1.0)
    return x, y


def sleepy_model(dev, use_graph=False):
    m = SleepyNet()
    m.set_optimizer(opt.SGD(lr=0.01))
    x, y = data(dev)
    m.compile([x], is_train=True, use_graph=use_graph)
    return m, x, y


# ---------------------------------------------------------------- graph flags and iterations
def test_enable_graph_sets_the_flag_and_checks_its_argument(cpu):
    assert cpu.graph_enabled() is False
    cpu.EnableGraph(True)
    assert cpu.graph_enabled() is True
    cpu.EnableGraph(False)
    assert cpu.graph_enabled() is False
    with pytest.raises(TypeError, match="EnableGraph: expected True or False"):
        cpu.EnableGraph("yes")


def test_run_graph_ends_an_iteration_and_reset_graph_forgets_them(cpu):
    assert cpu.time_profile()["iterations"] == 0
    cpu.RunGraph()
    cpu.RunGraph(sequential=True)
    assert cpu.time_profile()["iterations"] == 2
    cpu.ResetGraph()
    assert cpu.time_profile()["iterations"] == 0
    with pytest.raises(TypeError, match="sequential"):
        cpu.RunGraph(sequential="no")


def test_graph_mode_runs_operators_at_once_with_the_same_results(cpu):
    # Eager by design: a value computed while the graph is enabled is there before RunGraph.
    x = tensor.from_numpy(np.array([[-1.0, 2.0]], np.float32))
    plain = tensor.to_numpy(autograd.relu(x))
    cpu.EnableGraph(True)
    in_graph = tensor.to_numpy(autograd.relu(x))
    cpu.RunGraph()
    cpu.EnableGraph(False)
    np.testing.assert_array_equal(in_graph, plain)
    np.testing.assert_array_equal(in_graph, [[0.0, 2.0]])


# ---------------------------------------------------------------- profiling
def test_verbosity_installs_the_engine_hook_only_while_some_device_profiles(cpu):
    assert autograd._timer is None
    cpu.SetVerbosity(2)
    assert autograd._timer is not None and cpu.verbosity() == 2
    cpu.SetVerbosity(0)
    assert autograd._timer is None
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="SetVerbosity"):
            cpu.SetVerbosity(bad)
    with pytest.raises(ValueError, match="SetSkipIteration"):
        cpu.SetSkipIteration(-3)


def test_profile_measures_forward_and_backward_of_each_operator_after_the_skipped_iterations(cpu):
    m, x, y = sleepy_model(cpu)
    cpu.SetVerbosity(2)
    cpu.SetSkipIteration(2)
    for _ in range(4):
        m(x, y)
    p = cpu.time_profile()
    assert p["iterations"] == 4 and p["measured"] == 2 and p["skipped"] == 2
    row = p["ops"]["Sleepy"]
    assert row["forward_calls"] == 1 and row["backward_calls"] == 1  # per iteration
    # measured: at least the sleep, and not absurdly more (2 cores shared: allow a wide margin)
    assert FWD_SLEEP <= row["forward"] < FWD_SLEEP + 0.2
    assert BWD_SLEEP <= row["backward"] < BWD_SLEEP + 0.2
    assert {"Matmul", "AddBias", "MeanSquareError"} <= set(p["ops"])
    assert p["forward"] >= row["forward"] and p["backward"] >= row["backward"]
    assert p["other"] >= 0.0


def test_profile_skips_warm_up_iterations_and_operators_outside_iterations(cpu):
    m, x, y = sleepy_model(cpu)
    cpu.SetVerbosity(1)
    cpu.SetSkipIteration(5)
    for _ in range(3):
        m(x, y)
    assert cpu.time_profile()["ops"] == {}  # all three were warm-up
    cpu.SetSkipIteration(0)
    m.eval()
    m(x)  # an evaluation forward between steps: not an iteration, not timed
    assert cpu.time_profile()["ops"] == {}
    m.train()
    m(x, y)
    p = cpu.time_profile()
    assert p["measured"] == 1 and p["ops"]["Sleepy"]["forward_calls"] == 1


def test_profile_by_hand_times_what_runs_between_enable_graph_and_run_graph(cpu):
    cpu.SetVerbosity(1)
    cpu.SetSkipIteration(0)
    x = tensor.Tensor((2, 2), cpu).set_value(1.0)
    Sleepy()(x)  # graph off and no model step: not timed
    assert cpu.time_profile()["ops"] == {}
    cpu.EnableGraph(True)
    Sleepy()(x)
    cpu.RunGraph()
    cpu.EnableGraph(False)
    p = cpu.time_profile()
    assert p["measured"] == 1 and p["ops"]["Sleepy"]["forward"] >= FWD_SLEEP


def test_print_time_profiling_prints_the_measured_times(cpu, capsys):
    m, x, y = sleepy_model(cpu)
    cpu.SetSkipIteration(1)
    cpu.PrintTimeProfiling()  # verbosity 0: nothing, as SINGA
    assert capsys.readouterr().out == ""
    cpu.SetVerbosity(1)
    for _ in range(3):
        m(x, y)
    cpu.PrintTimeProfiling()
    out = capsys.readouterr().out
    assert "2 iteration(s) measured of 3" in out
    fwd = float(out.split("Forward Propagation Time : ")[1].split()[0])
    assert fwd >= FWD_SLEEP and "Backward Propagation Time" in out and "OP " not in out
    cpu.SetVerbosity(2)
    cpu.PrintTimeProfiling()
    assert "OP Sleepy" in capsys.readouterr().out


def test_profiling_off_leaves_results_unchanged(cpu):
    x, y = data(cpu)
    outs = []
    for verbosity in (0, 2):
        cpu.ResetGraph()
        cpu.SetVerbosity(verbosity)
        cpu.SetSkipIteration(0)
        cpu.SetRandSeed(7)
        m, _, _ = sleepy_model(cpu)
        for _ in range(3):
            out, _ = m(x, y)
        outs.append(tensor.to_numpy(out))
    np.testing.assert_array_equal(outs[0], outs[1])


# ---------------------------------------------------------------- device functions
def test_cpu_device_identity_and_sync(cpu):
    assert cpu is device.create_cpu_device() and cpu is device.get_default_device()
    assert device.default_device is cpu  # SINGA's module attribute
    assert cpu.id() == -1 and cpu.lang() == "cpp"
    cpu.Sync()  # synchronous device: returns at once
    assert isinstance(device.get_num_gpus(), int)
    assert device.get_gpu_ids() == list(range(device.get_num_gpus()))


@pytest.mark.skipif(device.cuda_is_available(), reason="checks the refusal without a GPU")
def test_cuda_devices_are_refused_by_name_without_a_gpu():
    for make in (device.create_cuda_gpu, lambda: device.create_cuda_gpu_on(0), lambda: device.create_cuda_gpus(1),
                 lambda: device.create_cuda_gpus_on([0])):
        with pytest.raises(CudaError, match="cannot create cuda:0"):
            make()


def test_reset_returns_the_device_to_its_start_state(cpu):
    cpu.EnableGraph(True)
    cpu.SetVerbosity(2)
    cpu.SetSkipIteration(0)
    cpu.RunGraph()
    cpu.Reset()
    assert not cpu.graph_enabled() and cpu.verbosity() == 0 and cpu.skip_iteration() == 5
    assert cpu.time_profile()["iterations"] == 0 and autograd._timer is None
    assert cpu.host() is device.create_cpu_device()
    device.Device.EnableLazyAlloc(True)  # nothing to switch here (memory is allocated at creation)
    with pytest.raises(TypeError, match="enable_lazy_alloc"):
        device.enable_lazy_alloc("on")
