"""kiln's model zoo written in PyTorch (the shapes of models/*.cpp) and the training steps of
the tasks' bench steps (the same losses and optimizers), on any device and in fp32 or bf16
autocast: the anchors of bench/cpu_vs_pytorch.py (the CPU) and bench/gpu_vs_pytorch.py (the
GPU, the whole step captured as one CUDA graph).

A step is `make(batch, device, precision)` -> (body, modules): body() runs one training step
(gradients set to None first, so that a captured body writes them rather than adds to them)
and returns nothing; modules are the networks, for their memory format.
"""
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, kernel=3, stride=1, relu=True):  # models/conv_bn.cpp
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]
    if relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, 1, relu=False)
        self.projection = None
        if stride != 1 or cin != cout:
            self.projection = conv_bn(cin, cout, 1, stride, relu=False)

    def forward(self, x):
        shortcut = self.projection(x) if self.projection is not None else x
        return F.relu(self.conv2(self.conv1(x)) + shortcut)


def resnet_stages(stem_in, widths, first_stride_one):
    blocks, channels = [], widths[0]
    for i, width in enumerate(widths):
        stride = 1 if (i == 0 and first_stride_one) else 2
        blocks += [BasicBlock(channels, width, stride), BasicBlock(width, width, 1)]
        channels = width
    return nn.Sequential(conv_bn(stem_in, widths[0]), *blocks)


class ResNet14(nn.Module):  # models/resnet.cpp: ResNet
    def __init__(self):
        super().__init__()
        self.features = resnet_stages(1, [16, 32, 64], True)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.dropout(self.features(x).mean((2, 3))))


class ResNet18(nn.Module):  # models/resnet.cpp: ResNet18 (CIFAR form)
    def __init__(self):
        super().__init__()
        self.features = resnet_stages(3, [64, 128, 256, 512], True)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def lenet():  # models/lenet.cpp
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def vgg():  # models/vgg.cpp
    return nn.Sequential(
        conv_bn(1, 16), conv_bn(16, 16), nn.MaxPool2d(2), conv_bn(16, 32), conv_bn(32, 32),
        nn.MaxPool2d(2), conv_bn(32, 64), conv_bn(64, 64), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(576, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))


def alexnet():  # models/alexnet.cpp
    def conv(cin, cout, kernel, stride=1):
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2), nn.ReLU()]
    return nn.Sequential(
        *conv(1, 32, 5, 2), *conv(32, 48, 3), nn.MaxPool2d(3, 2, 1), *conv(48, 96, 3),
        *conv(96, 96, 3), *conv(96, 64, 3), nn.MaxPool2d(3, 2, 1), nn.Flatten(),
        nn.Dropout(0.5), nn.Linear(64 * 4 * 4, 512), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


class InceptionModule(nn.Module):  # models/inception.cpp
    def __init__(self, cin, b1, b3_reduce, b3, b5_reduce, b5, pool_proj):
        super().__init__()
        self.branch1 = conv_bn(cin, b1, 1)
        self.branch3 = nn.Sequential(conv_bn(cin, b3_reduce, 1), conv_bn(b3_reduce, b3, 3))
        self.branch5 = nn.Sequential(conv_bn(cin, b5_reduce, 1), conv_bn(b5_reduce, b5, 5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv_bn(cin, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x),
                          self.branch_pool(x)], 1)


class Inception(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(1, 32, 3)
        self.a3 = InceptionModule(32, 16, 16, 32, 8, 16, 16)     # 80 channels
        self.b3 = InceptionModule(80, 32, 32, 48, 8, 24, 24)     # 128
        self.a4 = InceptionModule(128, 48, 32, 64, 8, 24, 24)    # 160
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(160, 10)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        x = F.max_pool2d(self.b3(self.a3(x)), 3, 2, 1)
        return self.fc(self.dropout(self.a4(x).mean((2, 3))))


class RowLstm(nn.Module):  # models/row_lstm.cpp: 128 a direction over the 28 rows
    def __init__(self, hidden=128):
        super().__init__()
        self.rnn = nn.LSTM(28, hidden, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 10)

    def forward(self, x):  # [B, 1, 28, 28]
        rows = x.reshape(x.shape[0], 28, 28).transpose(0, 1)  # [28, B, 28]: time-major
        _, (h, _) = self.rnn(rows)
        return self.head(torch.cat([h[0], h[1]], 1))


class CharLstm(nn.Module):  # models/char_lstm.cpp: E 64, H 256, vocabulary 96, one layer
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(96, 64)
        self.rnn = nn.LSTM(64, 256)
        self.head = nn.Linear(256, 96)

    def forward(self, tokens):  # [T, B]
        out, _ = self.rnn(self.embedding(tokens))
        return self.head(out.reshape(-1, 256))


def mlp_gan():  # models/gan.cpp
    g = nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh(),
                      nn.Unflatten(1, (1, 28, 28)))
    d = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))
    return g, d


def dcgan():  # models/dcgan.cpp
    g = nn.Sequential(
        nn.Linear(100, 128 * 7 * 7, bias=False), nn.Unflatten(1, (128, 7, 7)), nn.BatchNorm2d(128),
        nn.ReLU(), nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh())
    d = nn.Sequential(
        nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1, bias=False),
        nn.BatchNorm2d(128), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 7 * 7, 1))
    return g, d


def _autocast(device, precision):
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16")


def _adam(params, device, **kwargs):  # a captured step needs the step counts on the device
    return torch.optim.Adam(params, capturable=device != "cpu", **kwargs)


def _channels_last(module, x, device, precision):
    """CNNs in bf16 on the GPU run channels-last (the layout of the tensor-core kernels)."""
    if device != "cpu" and precision == "bf16" and x is not None and x.dim() == 4:
        module.to(memory_format=torch.channels_last)
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _supervised(model, inputs, targets, optimizer, device, precision):
    """One step of cross-entropy on fixed inputs and targets."""
    def body():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, precision):
            loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return body


def classifier(make, shape, batch, device, precision):
    """train/classifier_task.cpp's bench step: cross-entropy, SGD lr 0.01 momentum 0.9."""
    model = make().to(device)
    x = torch.rand((batch,) + shape, device=device) * 2 - 1
    x = _channels_last(model, x, device, precision)
    y = torch.randint(0, 10, (batch,), device=device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return _supervised(model, x, y, sgd, device, precision)


def char_lstm(batch, device, precision):  # train/lm_task.cpp: Adam at its defaults
    model = CharLstm().to(device)
    tokens = torch.randint(0, 96, (64, batch), device=device)
    targets = torch.randint(0, 96, (64 * batch,), device=device)
    return _supervised(model, tokens, targets, _adam(model.parameters(), device), device,
                       precision)


def gan(make, batch, device, precision):
    """train/gan_steps.h: a D step, then a G step; Adam lr 2e-4, beta1 0.5; the noise drawn on
    the device inside the step."""
    g, d = make()
    g, d = g.to(device), d.to(device)
    opt_g = _adam(g.parameters(), device, lr=2e-4, betas=(0.5, 0.999))
    opt_d = _adam(d.parameters(), device, lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(batch, 1, 28, 28, device=device) * 2 - 1
    real = _channels_last(d, real, device, precision)
    if device != "cpu" and precision == "bf16":
        g.to(memory_format=torch.channels_last)
    ones = torch.ones(batch, 1, device=device)
    zeros = torch.zeros(batch, 1, device=device)
    bce = F.binary_cross_entropy_with_logits

    def body():
        opt_d.zero_grad(set_to_none=True)
        with _autocast(device, precision):
            fake = g(torch.randn(batch, 100, device=device)).detach()
            d_loss = bce(d(real), ones) + bce(d(fake), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad(set_to_none=True)
        with _autocast(device, precision):
            g_loss = bce(d(g(torch.randn(batch, 100, device=device))), ones)
        g_loss.backward()
        opt_g.step()
    return body


IMAGE = (1, 28, 28)
# kiln's model name -> make(batch, device, precision) -> body
STEPS = {
    "lenet": lambda b, dev, p: classifier(lenet, IMAGE, b, dev, p),
    "resnet": lambda b, dev, p: classifier(ResNet14, IMAGE, b, dev, p),
    "vgg": lambda b, dev, p: classifier(vgg, IMAGE, b, dev, p),
    "alexnet": lambda b, dev, p: classifier(alexnet, IMAGE, b, dev, p),
    "inception": lambda b, dev, p: classifier(Inception, IMAGE, b, dev, p),
    "row-lstm": lambda b, dev, p: classifier(RowLstm, IMAGE, b, dev, p),
    "char-lstm": char_lstm,
    "gan": lambda b, dev, p: gan(mlp_gan, b, dev, p),
    "dcgan": lambda b, dev, p: gan(dcgan, b, dev, p),
    "resnet18": lambda b, dev, p: classifier(ResNet18, (3, 32, 32), b, dev, p),
}


def time_cuda(body, warmup, steps, capture=True):
    """The median device ms of `steps` runs of the step (CUDA events around each), after
    `warmup` eager steps on a side stream; with `capture`, the step captured as one CUDA graph
    and replayed. Returns (ms, "graph" or "eager"): a step that cannot be captured is timed
    eagerly, and the reason printed to stderr."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run, how = body, "eager"
    if capture:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
            graph.replay()
            torch.cuda.synchronize()
            run, how = graph.replay, "graph"
        except Exception as e:  # noqa: BLE001 - any capture failure: eager, reported
            print(f"  no CUDA graph ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                  "timed eager", file=sys.stderr, flush=True)
            torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times), how
