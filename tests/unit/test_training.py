"""autograd + opt together, the way SINGA scripts use them: `opt(loss)` and `backward` loops."""
import numpy as np
import pytest

from singa_lite import autograd, opt, tensor


class MLP(autograd.Layer):
    def __init__(self, sizes):
        super().__init__()
        self.fc = [autograd.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        for i, layer in enumerate(self.fc):
            setattr(self, f"fc{i}", layer)

    def forward(self, x):
        for layer in self.fc[:-1]:
            x = autograd.relu(layer(x))
        return self.fc[-1](x)


def blobs(n, classes, dim, seed):
    """Separable Gaussian blobs: a real (if easy) classification problem, generated here."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dim)) * 4
    labels = rng.integers(0, classes, n)
    x = centers[labels] + rng.standard_normal((n, dim))
    return x.astype(np.float32), labels.astype(np.int32)


pytestmark = pytest.mark.usefixtures("training")


def test_sgd_call_applies_exactly_the_autograd_gradients():
    x, y = blobs(32, 3, 8, seed=1)
    model = MLP([8, 16, 3])
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    grads = {id(p): tensor.to_numpy(g)
             for p, g in autograd.gradients(autograd.softmax_cross_entropy(model(tx), ty)).items()}
    params = model.get_params()
    before = {id(p): tensor.to_numpy(p) for p in params.values()}
    assert set(grads) == set(before) and len(before) == 4
    sgd = opt.SGD(lr=0.05)
    sgd(autograd.softmax_cross_entropy(model(tx), ty))  # SINGA: backward and update in one call
    for name, p in params.items():
        np.testing.assert_allclose(tensor.to_numpy(p), before[id(p)] - 0.05 * grads[id(p)], rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    assert sgd.step_counter == 1


def test_backward_loop_with_apply_matches_call():
    x, y = blobs(16, 2, 4, seed=2)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    models = [MLP([4, 8, 2]) for _ in range(2)]
    models[1].set_params({k: tensor.to_numpy(v) for k, v in models[0].get_params().items()})
    a, b = opt.SGD(lr=0.1, momentum=0.9), opt.SGD(lr=0.1, momentum=0.9)
    for _ in range(3):
        a(autograd.softmax_cross_entropy(models[0](tx), ty))
        for p, g in autograd.backward(autograd.softmax_cross_entropy(models[1](tx), ty)):
            b.apply(p.name, p, g)
        b.step()
    for (n0, p0), (_n1, p1) in zip(sorted(models[0].get_params().items()), sorted(models[1].get_params().items())):
        np.testing.assert_allclose(tensor.to_numpy(p0), tensor.to_numpy(p1), rtol=1e-6, err_msg=n0)


@pytest.mark.parametrize("make_opt", [lambda: opt.SGD(lr=0.05, momentum=0.9),
                                      lambda: opt.Adam(lr=0.01),
                                      lambda: opt.RMSProp(lr=0.01),
                                      lambda: opt.AdaGrad(lr=0.1)],
                         ids=["sgd-momentum", "adam", "rmsprop", "adagrad"])
def test_mlp_learns_blobs(make_opt):
    x, y = blobs(512, 4, 10, seed=3)
    model, optimizer = MLP([10, 32, 4]), make_opt()
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    first = None
    for _ in range(60):
        loss = autograd.softmax_cross_entropy(model(tx), ty)
        first = first if first is not None else loss.item()
        optimizer(loss)
    autograd.training = False
    pred = tensor.to_numpy(tensor.argmax(model(tx), 1))
    assert (pred == y).mean() > 0.95
    assert loss.item() < 0.5 * first
