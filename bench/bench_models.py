"""The models the training benchmarks time, written the same way in singa_lite and in PyTorch: SINGA's
MNIST CNN (of its distributed-training page), the MLP of the DDP exercises, and ResNet-18 in its CIFAR form
(3x3 stem, stages 64-128-256-512, batch norm, residual adds). PyTorch is imported by the caller, and
singa_lite only by the singa_lite models, so that a PyTorch-only process (bench/train_loop.py,
bench/bench_resnet_cpu.py's workers) never loads it."""

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


def _singa_resnet_classes():
    """SingaBlock and SingaResNet18, defined on first use so that importing this module loads no singa_lite."""
    from singa_lite import autograd, layer, model

    class SingaBlock(layer.Layer):
        def __init__(self, out_ch: int, stride: int):
            super().__init__()
            self.conv1 = layer.Conv2d(out_ch, 3, stride=stride, padding=1, bias=False)
            self.bn1 = layer.BatchNorm2d()
            self.conv2 = layer.Conv2d(out_ch, 3, stride=1, padding=1, bias=False)
            self.bn2 = layer.BatchNorm2d()
            self.stride, self.out_ch = stride, out_ch
            self.short = None

        def forward(self, x):
            if self.short is None and (self.stride != 1 or x.shape[1] != self.out_ch):
                self.short = layer.Conv2d(self.out_ch, 1, stride=self.stride, bias=False)
                self.short_bn = layer.BatchNorm2d()
            y = autograd.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            s = x if self.short is None else self.short_bn(self.short(x))
            return autograd.relu(autograd.add(y, s))

    class SingaResNet18(model.Model):
        """ResNet-18 for 32x32 inputs: 3x3 stem, four stages of two basic blocks (64-512 channels), global
        average pooling, a linear classifier."""

        def __init__(self, classes: int = 10):
            super().__init__()
            self.stem, self.bn = layer.Conv2d(64, 3, padding=1, bias=False), layer.BatchNorm2d()
            self.blocks = []
            for i, (ch, stride) in enumerate([(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                                              (512, 1)]):
                setattr(self, f"block{i}", SingaBlock(ch, stride))
                self.blocks.append(getattr(self, f"block{i}"))
            self.pool, self.fc = layer.GlobalAvgPool2d(), layer.Linear(classes)

        def forward(self, x):
            y = autograd.relu(self.bn(self.stem(x)))
            for b in self.blocks:
                y = b(y)
            return self.fc(autograd.flatten(self.pool(y)))

    return SingaBlock, SingaResNet18


def SingaResNet18(classes: int = 10):
    """ResNet-18 for 32x32 inputs in singa_lite (its layers shaped on the first forward)."""
    return _singa_resnet_classes()[1](classes)


def torch_resnet18(torch, classes: int = 10):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.short(x))

    layers, cin = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def resnet18_conv_flops(batch: int) -> tuple:
    """(forward, training step) multiply-add FLOPs of ResNet-18 CIFAR's convolutions at this batch: a training
    step computes each convolution's forward, weight gradient and input gradient (not the stem's: its input is
    the data)."""
    fwd = [2 * batch * 64 * 32 * 32 * 3 * 9]  # stem
    cin, size = 64, 32
    for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        out = size // stride
        fwd.append(2 * batch * cout * out * out * cin * 9)
        fwd.append(2 * batch * cout * out * out * cout * 9)
        if stride != 1 or cin != cout:
            fwd.append(2 * batch * cout * out * out * cin)
        cin, size = cout, out
    return sum(fwd), 3 * sum(fwd) - fwd[0]


TRANSFORMER = dict(batch=16, seq=128, d_model=256, nhead=4, dim_feedforward=1024, classes=10, dropout=0.1)


def _singa_transformer_class():
    from singa_lite import autograd, layer, model

    class SingaTransformer(model.Model):
        """One post-norm encoder layer (ReLU, dropout 0.1) and a per-token linear classifier: the logits of
        every token, (batch * seq, classes)."""

        def __init__(self, d_model, nhead, dim_feedforward, classes, dropout):
            super().__init__()
            self.encoder = layer.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout)
            self.head = layer.Linear(d_model, classes)

        def forward(self, x):
            y = self.head(self.encoder(x))
            return autograd.reshape(y, [-1, y.shape[-1]])

    return SingaTransformer


def SingaTransformer(cfg=TRANSFORMER):
    return _singa_transformer_class()(cfg["d_model"], cfg["nhead"], cfg["dim_feedforward"], cfg["classes"],
                                      cfg["dropout"])


def torch_transformer(torch, cfg=TRANSFORMER):
    nn = torch.nn

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.TransformerEncoderLayer(cfg["d_model"], cfg["nhead"], cfg["dim_feedforward"],
                                                      cfg["dropout"], batch_first=True)
            self.head = nn.Linear(cfg["d_model"], cfg["classes"])

        def forward(self, x):
            y = self.head(self.encoder(x))
            return y.reshape(-1, y.shape[-1])

    return TorchTransformer()


def transformer_flops(cfg=TRANSFORMER) -> tuple:
    """(forward, training step) multiply-add FLOPs of the transformer's matrix products: the Q/K/V and output
    projections, the two feed-forward layers, the head, Q K^T and the weights times V. A training step
    computes each product's forward and both gradients, except the input gradient of the first projection
    (its input is the data)."""
    n, d, ff, seq = cfg["batch"] * cfg["seq"], cfg["d_model"], cfg["dim_feedforward"], cfg["seq"]
    qkv = 2 * n * d * 3 * d
    linear = 2 * n * d * d + 2 * 2 * n * d * ff + 2 * n * d * cfg["classes"]
    attention = 2 * 2 * cfg["batch"] * seq * seq * d  # summed over heads: head_dim * heads = d
    fwd = qkv + linear + attention
    return fwd, 3 * fwd - qkv
