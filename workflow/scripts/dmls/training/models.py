"""The course's models: a configurable CNN, B's MLP, LeNet-5 and D4's wide MLP."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from dmls.config.spec import ModelSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
}


class CourseCNN(nn.Module):
    """Conv blocks (3×3 conv [+ BN] + activation, 2×2 max-pool while the map is larger than 4),
    then dropout - Linear(hidden) - activation - dropout - Linear(classes).

    Every block has its own weights: the course's reference 10-layer net reused one layer and
    stayed at chance.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        conv_channels: Sequence[int],
        fc_hidden: int,
        dropout: float,
        batch_norm: bool,
        activation: str,
    ) -> None:
        super().__init__()
        in_channels, size = input_shape[0], input_shape[1]
        layers: list[nn.Module] = []
        for out_channels in conv_channels:
            layers.append(nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out_channels))
            layers.append(ACTIVATIONS[activation]())
            if size > 4:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            in_channels = out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(in_channels * size * size, fc_hidden),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(fc_hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class ClusterMLP(nn.Module):
    """B's model: Linear(features, hidden) - BatchNorm1d - activation - Linear(hidden, classes)."""

    def __init__(
        self, features: int, num_classes: int, hidden: int, batch_norm: bool, activation: str
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.BatchNorm1d(hidden) if batch_norm else nn.Identity(),
            ACTIVATIONS[activation](),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class LeNet5(nn.Module):
    """LeNet-5 as in LeCun et al. (1998) on 32×32 input, without the sparse C3 connection table:
    conv1 6@5×5 (156 parameters on 1 channel), avg-pool, conv2 16@5×5 (2,416), avg-pool,
    conv3 120@5×5 (48,120), fc 120→84 (10,164), fc 84→classes (850 for 10). 28×28 input is
    zero-padded by 2 to 32×32 in conv1, as the paper's MNIST set was.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, activation: str) -> None:
        super().__init__()
        in_channels, size = input_shape[0], input_shape[1]
        act = ACTIVATIONS[activation]
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=(32 - size) // 2),
            act(),
            nn.AvgPool2d(2),
            nn.Conv2d(6, 16, 5),
            act(),
            nn.AvgPool2d(2),
            nn.Conv2d(16, 120, 5),
            act(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(120, 84), act(), nn.Linear(84, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class WideMLP(nn.Module):
    """D4's model: images flattened, `layers` blocks of Linear(·, hidden) + activation, then
    Linear(hidden, classes). Nearly all of its parameters are in hidden×hidden matrices, so
    weights, gradients and optimizer state dwarf the activations of a small batch: the memory
    that sharding divides. Each Linear is one unit that FSDP2 shards (`shard_units`)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: int,
        layers: int,
        activation: str,
    ) -> None:
        super().__init__()
        features = math.prod(input_shape)
        blocks: list[nn.Module] = [nn.Flatten()]
        for i in range(layers):
            blocks += [nn.Linear(features if i == 0 else hidden, hidden), ACTIVATIONS[activation]()]
        blocks.append(nn.Linear(hidden, num_classes))
        self.net = nn.Sequential(*blocks)

    def forward(self, x):
        return self.net(x)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one (`fully_shard` on each, then on the whole model):
    the leaf modules that hold parameters, so that one layer's parameters are gathered at a
    time."""
    return [
        m
        for m in model.modules()
        if not list(m.children()) and any(True for _ in m.parameters(recurse=False))
    ]


def course_cnn(
    input_shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    conv_channels: Sequence[int] = (32, 64, 128),
    fc_hidden: int = 256,
) -> nn.Module:
    """The course CNN as the special studies take it (batch norm, ReLU, no dropout)."""
    spec = ModelSpec(
        name="cnn",
        conv_channels=tuple(conv_channels),
        fc_hidden=fc_hidden,
        hidden=0,
        layers=1,
        dropout=0.0,
        batch_norm=True,
        activation="relu",
    )
    return build_model(spec, input_shape, num_classes)


def build_model(spec: ModelSpec, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The network a spec names, for data of `input_shape` (C, H, W or F,)."""
    if spec.name == "cnn":
        if len(input_shape) != 3:
            raise ValueError(f"model 'cnn' needs image input (C, H, W), got shape {input_shape}")
        return CourseCNN(
            input_shape,
            num_classes,
            spec.conv_channels,
            spec.fc_hidden,
            spec.dropout,
            spec.batch_norm,
            spec.activation,
        )
    if spec.name == "mlp":
        if len(input_shape) != 1:
            raise ValueError(f"model 'mlp' needs feature vectors (F,), got shape {input_shape}")
        return ClusterMLP(
            input_shape[0], num_classes, spec.hidden, spec.batch_norm, spec.activation
        )
    if spec.name == "lenet5":
        if len(input_shape) != 3 or input_shape[1] not in (28, 32):
            raise ValueError(f"model 'lenet5' needs 28×28 or 32×32 images, got {input_shape}")
        return LeNet5(input_shape, num_classes, spec.activation)
    if spec.name == "wide_mlp":
        return WideMLP(input_shape, num_classes, spec.hidden, spec.layers, spec.activation)
    raise ValueError(f"unknown model {spec.name!r}")


def describe(spec: ModelSpec, input_shape: Sequence[int], num_classes: int) -> list[dict]:
    """The network a spec names, layer by layer as it runs: each leaf module's name, kind, the
    shape it outputs for one sample and its own parameters. Built on the meta device and fed a
    meta tensor, so it allocates nothing and draws no random number (the seeds' weights stay
    what they were)."""
    with torch.device("meta"):
        model = build_model(spec, input_shape, num_classes)
    layers: list[dict] = []

    def hook(name: str):
        def record(module: nn.Module, _inputs, output) -> None:
            layers.append(
                {
                    "layer": name,
                    "kind": type(module).__name__,
                    "output_shape": [int(d) for d in output.shape[1:]],
                    "parameters": sum(p.numel() for p in module.parameters(recurse=False)),
                }
            )

        return record

    for name, module in model.named_modules():
        if name and not list(module.children()):
            module.register_forward_hook(hook(name))
    model.eval()
    with torch.no_grad():
        model(torch.empty(1, *input_shape, device="meta"))
    return layers
