"""Gradient hooks (Tensor.register_hook): called by the engine once per backward with the final gradient, in the
generator's order, whoever consumes it; replacement, pending (deferred) gradients, removal, errors; and the
engine unchanged when no hook is registered."""
import numpy as np
import pytest

from singa_lite import autograd, engine, opt, tensor

pytestmark = pytest.mark.usefixtures("training")


def param(a, name):
    return tensor.Tensor(data=np.asarray(a, np.float64), requires_grad=True, stores_grad=True, name=name)


def mlp(seed=0):
    rng = np.random.default_rng(seed)
    return {"W1": param(rng.standard_normal((4, 6)), "W1"), "b1": param(rng.standard_normal(6), "b1"),
            "W2": param(rng.standard_normal((6, 3)), "W2"), "b2": param(rng.standard_normal(3), "b2")}


def loss_of(ps, seed=1):
    rng = np.random.default_rng(seed)
    x = tensor.Tensor(data=rng.standard_normal((5, 4)), requires_grad=False)
    y = tensor.Tensor(data=rng.integers(0, 3, 5).astype(np.int32), requires_grad=False)
    h = autograd.tanh(autograd.add_bias(autograd.matmul(x, ps["W1"]), ps["b1"]))
    return autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(h, ps["W2"]), ps["b2"]), y)


def reference_grads(seed=0):
    ps = mlp(seed)
    return {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss_of(ps))}


def test_hook_called_once_per_backward_with_the_final_gradient_in_the_generators_order():
    ps, events, seen = mlp(), [], {}

    def recorder(name):
        def hook(g):
            events.append(("hook", name))
            seen.setdefault(name, []).append(tensor.to_numpy(g))
        return hook

    for name, p in ps.items():
        p.register_hook(recorder(name))
    for p, _g in autograd.backward(loss_of(ps)):
        events.append(("yield", p.name))
    order = [n for kind, n in events if kind == "yield"]
    assert order == ["b2", "W2", "b1", "W1"]  # last layer first
    assert events == [e for n in order for e in (("hook", n), ("yield", n))]  # each hook right before its yield
    ref = reference_grads()
    for name in ps:
        assert len(seen[name]) == 1
        np.testing.assert_array_equal(seen[name][0], ref[name])
    autograd.gradients(loss_of(ps))  # a second pass: once more each
    assert all(len(v) == 2 for v in seen.values())


def test_replacement_is_yielded_and_seen_by_later_hooks():
    ps, seen = mlp(), []
    ps["W2"].register_hook(lambda g: g * 2.0)
    ps["W2"].register_hook(lambda g: seen.append(tensor.to_numpy(g)))  # None: keeps what it got
    ps["b1"].register_hook(lambda g: (g * 0.0).data)  # a raw C++ tensor is accepted too
    got = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss_of(ps))}
    ref = reference_grads()
    np.testing.assert_allclose(got["W2"], 2 * ref["W2"])
    np.testing.assert_allclose(seen[0], 2 * ref["W2"])
    np.testing.assert_array_equal(got["b1"], np.zeros_like(ref["b1"]))
    np.testing.assert_array_equal(got["W1"], ref["W1"])


def test_hooks_run_under_gradients_and_under_an_optimizer():
    ps = mlp()
    calls = []
    ps["b2"].register_hook(lambda g: calls.append("b2") or g * 0.0)  # freezes b2 through any consumer
    before = tensor.to_numpy(ps["b2"])
    assert not np.any(tensor.to_numpy(autograd.gradients(loss_of(ps))[ps["b2"]]))
    opt.SGD(lr=0.5)(loss_of(ps))
    np.testing.assert_array_equal(tensor.to_numpy(ps["b2"]), before)
    assert calls == ["b2", "b2"]
    assert not np.allclose(tensor.to_numpy(ps["W2"]), tensor.to_numpy(mlp()["W2"]))  # the others did train


def test_removal_handle():
    ps, calls = mlp(), []
    h = ps["W1"].register_hook(lambda g: calls.append(1))
    with ps["b1"].register_hook(lambda g: calls.append(2)):
        autograd.gradients(loss_of(ps))
    assert sorted(calls) == [1, 2]
    h.remove()
    h.remove()  # twice: nothing
    autograd.gradients(loss_of(ps))
    assert sorted(calls) == [1, 2]


def test_no_hooks_leaves_the_engine_on_its_fast_path(monkeypatch):
    ps = mlp()
    ps["W1"].register_hook(lambda g: None).remove()  # registered and removed: back to no hooks
    monkeypatch.setattr(engine, "_run_hooks", lambda *a: pytest.fail("hooks machinery used without hooks"))
    got = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss_of(ps))}
    ref = reference_grads()
    assert list(got) == list(ref)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])


class Later:
    """A pending gradient: wait() returns it scaled, and records when it was called."""

    def __init__(self, grad, events, name, scale=3.0):
        self.grad, self.events, self.name, self.scale = grad, events, name, scale

    def wait(self):
        self.events.append(("wait", self.name))
        return self.grad * self.scale


def test_pending_gradient_holds_its_pair_and_those_behind_it_until_the_pass_ends():
    ps, events = mlp(), []
    ps["W2"].register_hook(lambda g: Later(g, events, "W2"))
    ps["W2"].register_hook(lambda g: events.append(("after", "W2")) or g + 1.0)  # runs on the waited value
    for p, g in autograd.backward(loss_of(ps)):
        events.append(("yield", p.name, tensor.to_numpy(g)))
    names = [e[:2] for e in events]
    # b2 leaves at once; W2 defers, so b1 and W1 wait behind it, in order, until the pass is over
    assert names == [("yield", "b2"), ("wait", "W2"), ("after", "W2"), ("yield", "W2"), ("yield", "b1"),
                     ("yield", "W1")]
    ref = reference_grads()
    got = {e[1]: e[2] for e in events if e[0] == "yield"}
    np.testing.assert_allclose(got["W2"], 3 * ref["W2"] + 1)
    np.testing.assert_array_equal(got["W1"], ref["W1"])


def test_pending_gradient_of_a_leaf_y_and_the_leaf_case():
    w = param([1.0, 2.0], "w")
    w.register_hook(lambda g: Later(g, [], "w", scale=5.0))
    (p, g), = autograd.backward(w)
    assert p is w
    np.testing.assert_array_equal(tensor.to_numpy(g), [5.0, 5.0])


def test_hook_errors_are_clear():
    ps = mlp()
    with pytest.raises(TypeError, match="callable"):
        ps["W1"].register_hook("not a function")
    x = tensor.Tensor(data=np.ones(3), requires_grad=False)
    with pytest.raises(ValueError, match="not a parameter"):
        x.register_hook(lambda g: None)
    h = ps["W2"].register_hook(lambda g: tensor.Tensor(data=np.ones((2, 2))))
    with pytest.raises(ValueError, match=r"hook .* of W2 returned a gradient of shape \(2, 2\).*\(6, 3\)"):
        autograd.gradients(loss_of(ps))
    h.remove()
    h = ps["W2"].register_hook(lambda g: "twice")
    with pytest.raises(TypeError, match="returned str"):
        autograd.gradients(loss_of(ps))
    h.remove()
    h = ps["W2"].register_hook(lambda g: Later(np.ones((6, 3)), [], "W2"))
    with pytest.raises(TypeError, match="pending gradient"):
        autograd.gradients(loss_of(ps))
    h.remove()

    def boom(g):
        raise RuntimeError("from the hook")
    ps["b2"].register_hook(boom)
    with pytest.raises(RuntimeError, match="from the hook"):
        autograd.gradients(loss_of(ps))
