import torch

from conftest import make_spec
from dmls.training.models import LeNet5, build_model


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_lenet5_matches_the_closed_form():
    net = LeNet5((1, 32, 32), 10, "tanh")
    conv1, conv2, conv3 = (m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert (n_params(conv1), n_params(conv2), n_params(conv3)) == (156, 2416, 48120)
    assert n_params(net) == 156 + 2416 + 48120 + 10164 + 850
    assert net(torch.zeros(2, 1, 32, 32)).shape == (2, 10)
    assert LeNet5((1, 28, 28), 10, "tanh")(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_cnn_depth_and_distinct_layers():
    spec = make_spec(model={"name": "cnn", "conv_channels": [8] * 10})
    net = build_model(spec.model, (1, 28, 28), 10)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 10
    assert len({id(c.weight) for c in convs}) == 10  # ten layers, ten sets of weights
    assert net(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert build_model(make_spec().model, (3, 32, 32), 10)(torch.zeros(2, 3, 32, 32)).shape == (
        2,
        10,
    )


def test_cluster_mlp_is_the_course_model():
    spec = make_spec(model={"name": "mlp", "hidden": 32, "activation": "gelu"})
    net = build_model(spec.model, (512,), 20)
    kinds = [type(m).__name__ for m in net.net]
    assert kinds == ["Linear", "BatchNorm1d", "GELU", "Linear"]
    assert n_params(net) == 512 * 32 + 32 + 2 * 32 + 32 * 20 + 20


def test_the_model_is_described_layer_by_layer_as_it_runs_without_drawing_a_random_number():
    """What the course asks a student to give (A1): layers, output shapes, parameters; on
    Fashion-MNIST the default CNN has 390,634 parameters and flattens 128 × 3 × 3 = 1152
    features into its first Linear layer (not CIFAR's 2048)."""
    import torch

    from dmls.config.spec import ModelSpec
    from dmls.training import models

    spec = ModelSpec(name="cnn", conv_channels=(32, 64, 128), fc_hidden=256, hidden=0,
                     layers=1, dropout=0.0, batch_norm=True, activation="relu")  # fmt: skip
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    layers = models.describe(spec, [1, 28, 28], 10)
    assert torch.equal(torch.rand(3), expected)  # the seeds' weights are not disturbed
    built = models.build_model(spec, [1, 28, 28], 10)
    assert sum(layer["parameters"] for layer in layers) == sum(
        p.numel() for p in built.parameters()
    ) == 390634  # fmt: skip
    linear = [layer for layer in layers if layer["kind"] == "Linear"]
    assert [layer["output_shape"] for layer in linear] == [[256], [10]]
    assert linear[0]["parameters"] == 1152 * 256 + 256
    assert layers[0] == {"layer": "features.0", "kind": "Conv2d", "output_shape": [32, 28, 28],
                         "parameters": 288}  # fmt: skip
