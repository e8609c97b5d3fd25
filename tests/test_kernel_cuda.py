"""The FusedConvReLU CUDA kernels against nn.Conv2d + ReLU, on a GPU.

CI has no GPU: there every test here is skipped with the reason, and the autograd wiring is
checked on the CPU by test_kernels.py. bench/gpu_studies.sh runs this file on a GPU host.
The reference is cuDNN in float32 with TF32 off, so both sides compute in float32.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmls.special.fused_conv.kernels.fused_conv_relu import (
    UnsupportedConv,
    fuse_conv_relu,
    fused_conv_relu,
    load_extension,
)
from dmls.training.models import CourseCNN

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the kernels need a GPU (bench/gpu_studies.sh runs these on one)",
)
MAX_RELATIVE_ERROR = 1e-4


@pytest.fixture(autouse=True)
def float32_reference():
    """PyTorch lets cuDNN use TF32 for float32 convolutions by default; not in the reference,
    forward or backward."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


def random_case(seed: int) -> dict:
    """A random convolution the kernel supports: shape, kernel, stride and padding per axis."""
    g = torch.Generator().manual_seed(seed)

    def pick(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    r, s = pick(1, 3) * 2 - 1, pick(1, 3) * 2 - 1  # 1, 3 or 5
    case = {
        "x": (pick(1, 4), pick(1, 8), pick(5, 24), pick(5, 24)),
        "k": pick(1, 16),
        "kernel": (r, s),
        "stride": (pick(1, 3), pick(1, 3)),
        "padding": (pick(0, r // 2 + 1), pick(0, s // 2 + 1)),
    }
    return case


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def reference(x, weight, bias, stride, padding):
    """nn.Conv2d + ReLU with the same weights, in float32 on cuDNN."""
    conv = nn.Conv2d(x.shape[1], weight.shape[0], weight.shape[2:], stride, padding).cuda()
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    return conv, F.relu(conv(x))


@needs_cuda
@pytest.mark.parametrize("seed", range(24))
def test_forward_and_every_gradient_match_conv2d_relu(seed):
    case = random_case(seed)
    n, c, h, w = case["x"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, c, h, w, device="cuda", generator=g, requires_grad=True)
    weight = torch.randn(case["k"], c, *case["kernel"], device="cuda", generator=g)
    bias = torch.randn(case["k"], device="cuda", generator=g)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    ours = fused_conv_relu(x, weight, bias, case["stride"], case["padding"])
    x_ref = x.detach().clone().requires_grad_(True)
    conv, theirs = reference(x_ref, weight.detach(), bias.detach(), case["stride"], case["padding"])
    assert relative_error(ours, theirs) <= MAX_RELATIVE_ERROR, case
    # Where the pre-activation is within rounding of 0 the two ReLU masks may differ; a zero
    # output gradient there keeps the comparison about the kernels, not about ties.
    z = F.conv2d(x.double(), weight.double(), bias.double(), case["stride"], case["padding"])
    grad = torch.randn(ours.shape, device="cuda", generator=g)
    grad = grad * (z.abs() > 1e-4 * z.abs().max()).float()
    ours.backward(grad)
    theirs.backward(grad)
    for name, got, want in (
        ("input", x.grad, x_ref.grad),
        ("weight", weight.grad, conv.weight.grad),
        ("bias", bias.grad, conv.bias.grad),
    ):
        assert relative_error(got, want) <= MAX_RELATIVE_ERROR, (name, case)


@needs_cuda
def test_integer_data_gives_exact_results():
    """Small integers make every float32 product and sum exact, so any indexing slip shows."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(-3, 4, (3, 5, 13, 11), device="cuda", generator=g).float()
    weight = torch.randint(-2, 3, (7, 5, 3, 5), device="cuda", generator=g).float()
    bias = torch.randint(-4, 5, (7,), device="cuda", generator=g).float() + 0.5  # never 0
    x.requires_grad_(True)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    y = fused_conv_relu(x, weight, bias, (2, 1), (1, 2))
    grad = torch.randint(-3, 4, y.shape, device="cuda", generator=g).float()
    got = (y, *torch.autograd.grad(y, (x, weight, bias), grad))
    x64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (x, weight, bias))
    y64 = F.relu(F.conv2d(x64, w64, b64, (2, 1), (1, 2)))
    want = (y64, *torch.autograd.grad(y64, (x64, w64, b64), grad.double()))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.double(), b)


@needs_cuda
def test_a_large_batch_runs_through_the_grid_stride_loops():
    """More outputs than the capped grid has threads (65536 blocks × 256)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(128, 16, 48, 48, device="cuda", generator=g, requires_grad=True)
    weight = torch.randn(64, 16, 3, 3, device="cuda", generator=g, requires_grad=True)
    bias = torch.randn(64, device="cuda", generator=g, requires_grad=True)
    ours = fused_conv_relu(x, weight, bias, 1, 1)
    assert ours.numel() > 65536 * 256
    x_ref = x.detach().clone().requires_grad_(True)
    conv, theirs = reference(x_ref, weight.detach(), bias.detach(), 1, 1)
    assert relative_error(ours, theirs) <= MAX_RELATIVE_ERROR
    grad = torch.randn(ours.shape, device="cuda", generator=g)
    ours.backward(grad)
    theirs.backward(grad)
    assert relative_error(x.grad, x_ref.grad) <= MAX_RELATIVE_ERROR
    assert relative_error(weight.grad, conv.weight.grad) <= MAX_RELATIVE_ERROR


@needs_cuda
def test_gradcheck_in_float64_on_the_gpu():
    g = torch.Generator(device="cuda").manual_seed(2)
    args = [
        torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
        for shape in ((2, 3, 7, 6), (4, 3, 3, 2), (4,))
    ]
    assert torch.autograd.gradcheck(lambda *t: fused_conv_relu(*t, (2, 1), (1, 0)), args)


@needs_cuda
def test_weight_and_bias_gradients_are_deterministic():
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(8, 4, 16, 16, device="cuda", generator=g)
    weight = torch.randn(8, 4, 3, 3, device="cuda", generator=g, requires_grad=True)
    bias = torch.randn(8, device="cuda", generator=g, requires_grad=True)
    first, second = (
        torch.autograd.grad(fused_conv_relu(x, weight, bias, 1, 1).sum(), (weight, bias))
        for _ in range(2)
    )
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@needs_cuda
def test_unsupported_inputs_raise_before_any_kernel_runs():
    x = torch.randn(2, 3, 8, 8, device="cuda")
    weight, bias = torch.randn(4, 3, 3, 3, device="cuda"), torch.randn(4, device="cuda")
    with pytest.raises(UnsupportedConv, match="float32 or float64"):
        fused_conv_relu(x.half(), weight.half(), bias.half())
    with pytest.raises(UnsupportedConv, match="on cpu"):
        fused_conv_relu(x, weight.cpu(), bias)
    # The compiled extension checks too, for callers that bypass the Python wrapper.
    load_extension()
    forward = torch.ops.dmls.fused_conv_relu_forward
    with pytest.raises(RuntimeError, match="expects 3 input channels, the input has 2"):
        forward(x[:, :2].contiguous(), weight, bias, 1, 1, 0, 0)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        forward(x.transpose(2, 3), weight, bias, 1, 1, 0, 0)
    y = forward(x, weight, bias, 1, 1, 0, 0)
    with pytest.raises(RuntimeError, match="output gradient has shape"):
        torch.ops.dmls.fused_conv_relu_backward(y[:1], x, weight, bias, y, 1, 1, 0, 0, True)


@needs_cuda
def test_a_fused_cnn_trains_like_the_baseline():
    torch.manual_seed(0)
    baseline = CourseCNN((1, 28, 28), 10, [16, 16], 32, 0.0, False, "relu").cuda()
    fused = CourseCNN((1, 28, 28), 10, [16, 16], 32, 0.0, False, "relu").cuda()
    fused.load_state_dict(baseline.state_dict())
    assert fuse_conv_relu(fused) == 2
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32, 1, 28, 28, device="cuda", generator=g)
    y = torch.randint(0, 10, (32,), device="cuda", generator=g)
    losses = {}
    for name, model in (("baseline", baseline), ("fused", fused)):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(5):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[name] = loss.item()
    assert losses["fused"] == pytest.approx(losses["baseline"], rel=1e-4)


@pytest.mark.skipif(
    not os.environ.get("DMLS_BUILD_KERNELS"),
    reason="set DMLS_BUILD_KERNELS=1 to compile the CUDA extension on a host without a GPU "
    "(needs nvcc; takes minutes); on a GPU host the tests above compile it",
)
def test_the_extension_compiles_and_registers_its_operators():
    load_extension()
    schemas = {
        name: str(getattr(torch.ops.dmls, name).default._schema)
        for name in ("fused_conv_relu_forward", "fused_conv_relu_backward")
    }
    assert schemas["fused_conv_relu_forward"].endswith("int pad_w) -> Tensor")
    assert schemas["fused_conv_relu_backward"].endswith(
        "bool input_grad) -> (Tensor?, Tensor, Tensor)"
    )
