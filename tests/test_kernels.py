"""FusedConvReLU's autograd wiring, on the CPU implementation of the same Function (CI has no
GPU; the CUDA kernels are checked by test_kernel_cuda.py on a GPU host)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmls.special.fused_conv.kernels.fused_conv_relu import (
    FusedConvReLU,
    UnsupportedConv,
    fuse_conv_relu,
    fused_conv_relu,
)
from dmls.training.models import CourseCNN

# (N, C_in, H, W, C_out, kernel (R, S), stride, padding): square and not, strided, padded,
# a kernel as large as the padded input, a 1×1 kernel.
SHAPES = [
    (2, 3, 9, 7, 4, (3, 3), (1, 1), (1, 1)),
    (2, 2, 10, 11, 3, (3, 5), (2, 3), (2, 1)),
    (1, 1, 5, 5, 2, (5, 5), (1, 1), (0, 0)),
    (3, 4, 6, 6, 5, (1, 1), (2, 2), (0, 0)),
    (2, 2, 4, 4, 3, (5, 5), (1, 1), (1, 1)),
]


def operands(shape, dtype, seed=0):
    n, c, h, w, k, (r, s), _, _ = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(k, c, r, s, generator=g, dtype=dtype, requires_grad=True)
    bias = torch.randn(k, generator=g, dtype=dtype, requires_grad=True)
    return x, weight, bias


@pytest.mark.parametrize("shape", SHAPES)
def test_gradcheck_in_float64(shape):
    x, weight, bias = operands(shape, torch.float64)
    stride, padding = shape[6], shape[7]
    assert torch.autograd.gradcheck(
        lambda *t: fused_conv_relu(*t, stride, padding), (x, weight, bias)
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_gradients_match_conv2d_relu(shape):
    x, weight, bias = operands(shape, torch.float32, seed=1)
    stride, padding = shape[6], shape[7]
    ours = fused_conv_relu(x, weight, bias, stride, padding)
    reference = F.relu(F.conv2d(x, weight, bias, stride, padding))
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(reference)
    got = torch.autograd.grad(ours, (x, weight, bias), grad)
    want = torch.autograd.grad(reference, (x, weight, bias), grad)
    for name, a, b in zip(("input", "weight", "bias"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


def test_bias_gradient_is_the_masked_output_gradient_summed_over_n_h_w():
    x, weight, bias = operands(SHAPES[0], torch.float64)
    y = fused_conv_relu(x, weight, bias, 1, 1)
    grad = torch.rand_like(y)
    (grad_bias,) = torch.autograd.grad(y, bias, grad)
    torch.testing.assert_close(grad_bias, (grad * (y > 0)).sum((0, 2, 3)))


def test_no_input_gradient_is_computed_when_the_input_needs_none():
    x, weight, bias = operands(SHAPES[0], torch.float64)
    x = x.detach()
    fused_conv_relu(x, weight, bias, 1, 1).sum().backward()
    assert x.grad is None and weight.grad is not None and bias.grad is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x, w, b: (x.half(), w.half(), b.half()), "float32 or float64"),
        (lambda x, w, b: (x[0], w, b), "input must be 4-D"),
        (lambda x, w, b: (x[:, :2], w, b), "expects 3 input channels"),
        (lambda x, w, b: (x, w, b[:2]), "bias has 2 elements for 4"),
        (lambda x, w, b: (x, w, None), "needs a bias"),
        (lambda x, w, b: (x[:, :, :1, :1], w, b), "larger than the padded input"),
        (lambda x, w, b: (x, w.double(), b), "weight is torch.float64"),
    ],
)
def test_unsupported_convolutions_raise_a_clear_error(change, message):
    x, weight, bias = (t.detach() for t in operands(SHAPES[0], torch.float32))
    with pytest.raises(UnsupportedConv, match=message):
        fused_conv_relu(*change(x, weight, bias), 1, 0)


@pytest.mark.parametrize(
    ("conv", "message"),
    [
        (nn.Conv2d(4, 4, 3, groups=2), "groups 2"),
        (nn.Conv2d(4, 4, 3, dilation=2), r"dilation \(2, 2\)"),
        (nn.Conv2d(4, 4, 3, padding="same"), "padding 'same'"),
        (nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), "padding_mode 'reflect'"),
        (nn.Conv2d(4, 4, 3, bias=False), "bias"),
    ],
)
def test_layers_the_kernel_cannot_compute_are_refused(conv, message):
    with pytest.raises(UnsupportedConv, match=message):
        FusedConvReLU.from_conv(conv)


def test_fusing_a_cnn_keeps_its_function_and_its_parameters():
    torch.manual_seed(0)
    baseline = CourseCNN((1, 28, 28), 10, [6] * 3, 16, 0.0, batch_norm=False, activation="relu")
    baseline = baseline.double()
    fused = CourseCNN((1, 28, 28), 10, [6] * 3, 16, 0.0, batch_norm=False, activation="relu")
    fused = fused.double()
    fused.load_state_dict(baseline.state_dict())
    assert fuse_conv_relu(fused) == 3
    assert sum(isinstance(m, FusedConvReLU) for m in fused.modules()) == 3
    assert fused.state_dict().keys() == baseline.state_dict().keys()
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(fused(x), baseline(x))
    fused(x).square().sum().backward()
    baseline(x).square().sum().backward()
    for (name, a), b in zip(fused.named_parameters(), baseline.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_nothing_to_fuse_when_convs_have_batch_norm_in_between():
    model = CourseCNN((1, 28, 28), 10, [4, 4], 8, 0.0, batch_norm=True, activation="relu")
    assert fuse_conv_relu(model) == 0
