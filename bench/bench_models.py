"""The models the training benchmarks time, written the same way in singa_lite and in PyTorch: SINGA's
MNIST CNN (of its distributed-training page) and the MLP of the DDP exercises. PyTorch is imported by the
caller, and singa_lite only by the singa_lite models, so that a PyTorch-only process (bench/train_loop.py)
never loads it."""

MLP_SIZES = (1024, 256, 256, 256, 32)


class SingaCNN:
    def __init__(self):
        from singa_lite import autograd

        self.conv1 = autograd.Conv2d(1, 20, 5)
        self.conv2 = autograd.Conv2d(20, 50, 5)
        self.fc1 = autograd.Linear(800, 500)
        self.fc2 = autograd.Linear(500, 10)
        self.pool = autograd.MaxPool2d(2, 2)

    def forward(self, x):
        from singa_lite import autograd

        y = self.pool(autograd.relu(self.conv1(x)))
        y = self.pool(autograd.relu(self.conv2(y)))
        return self.fc2(autograd.relu(self.fc1(autograd.flatten(y))))


class SingaMLP:
    def __init__(self, sizes=MLP_SIZES):
        from singa_lite import autograd

        self.layers = [autograd.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    def forward(self, x):
        from singa_lite import autograd

        for layer in self.layers[:-1]:
            x = autograd.tanh(layer(x))
        return self.layers[-1](x)


def torch_cnn(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


def torch_mlp(torch, sizes=MLP_SIZES):
    nn = torch.nn
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def torch_sgd_step(torch, model, x, y, device="cpu"):
    """One PyTorch training step (SGD, momentum 0.9, cross-entropy) on numpy x and integer labels y."""
    import numpy as np

    t_opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t_x, t_y = torch.from_numpy(x).to(device), torch.from_numpy(np.asarray(y).astype(np.int64)).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        t_opt.zero_grad(set_to_none=True)
        loss_fn(model(t_x), t_y).backward()
        t_opt.step()
    return step
