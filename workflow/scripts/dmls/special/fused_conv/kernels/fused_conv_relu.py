"""FusedConvReLU: conv2d + bias + ReLU in one CUDA kernel, with its own backward.

`fused_conv_relu(x, weight, bias, stride, padding)` is one autograd Function for both
devices. On CUDA tensors it runs the kernels of fused_conv_relu.cu, compiled on first use with
torch.utils.cpp_extension (ninja + nvcc; torch caches the build under TORCH_EXTENSIONS_DIR) and
called as the torch operators torch.ops.dmls.fused_conv_relu_{forward,backward}.
On CPU tensors it runs the same forward and backward through unfold and matrix products: that
is what CI checks with gradcheck, having no GPU.

Backward: g = dL/dy where y > 0 (the ReLU mask), else 0; dL/dx is the transposed
convolution of g with w, dL/dw the correlation of g with x, dL/db = g summed over N, H, W.
Supported: float32/float64 NCHW, any kernel size, stride >= 1, zero padding >= 0; not groups,
dilation or other padding modes (UnsupportedConv says which).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(f"fused_conv_relu.{ext}") for ext in ("cpp", "cu"))
EXTENSION_NAME = "dmls_fused_conv_relu"
SUPPORTED_DTYPES = (torch.float32, torch.float64)
# The kernels index each tensor with 32-bit dimensions and 64-bit offsets; keep sizes sane.
MAX_ELEMENTS = 2**31 - 1

Pair = tuple[int, int]


class UnsupportedConv(ValueError):
    """A convolution this kernel does not compute; the message says what and why."""


def _pair(value: int | Sequence[int], name: str) -> Pair:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise UnsupportedConv(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair[0], pair[1]


def check_supported(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int | Sequence[int],
    padding: int | Sequence[int],
) -> tuple[Pair, Pair]:
    """Raise UnsupportedConv unless the kernel computes this convolution; return (stride,
    padding) as pairs."""
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    if bias is None:
        raise UnsupportedConv("fused_conv_relu needs a bias (conv2d + bias + ReLU)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise UnsupportedConv(
            f"fused_conv_relu computes in float32 or float64, the input is {x.dtype} "
            "(autocast does not apply to it: cast the input)"
        )
    for name, t, dim in (("input", x, 4), ("weight", weight, 4), ("bias", bias, 1)):
        if t.dim() != dim:
            raise UnsupportedConv(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
        if t.dtype != x.dtype or t.device != x.device:
            raise UnsupportedConv(
                f"{name} is {t.dtype} on {t.device}, the input {x.dtype} on {x.device}"
            )
        if t.numel() == 0 or t.numel() > MAX_ELEMENTS:
            raise UnsupportedConv(
                f"{name} has {t.numel()} elements; supported: 1 to {MAX_ELEMENTS}"
            )
    if weight.shape[1] != x.shape[1]:
        raise UnsupportedConv(
            f"weight {tuple(weight.shape)} expects {weight.shape[1]} input channels, the input "
            f"has {x.shape[1]} (grouped convolutions are not supported)"
        )
    if bias.shape[0] != weight.shape[0]:
        raise UnsupportedConv(
            f"bias has {bias.shape[0]} elements for {weight.shape[0]} output channels"
        )
    if min(stride) < 1 or min(padding) < 0:
        raise UnsupportedConv(f"stride must be >= 1 and padding >= 0, got {stride}, {padding}")
    padded = (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
    if padded[0] < weight.shape[2] or padded[1] < weight.shape[3]:
        raise UnsupportedConv(
            f"the {weight.shape[2]}x{weight.shape[3]} kernel is larger than the padded input "
            f"{padded[0]}x{padded[1]}: the output would be empty"
        )
    return stride, padding


@functools.cache
def load_extension() -> None:
    """Compile (once per source change; torch caches the build) and load the CUDA kernels,
    registering the operators torch.ops.dmls.fused_conv_relu_{forward,backward}."""
    from torch.utils import cpp_extension

    log.info("building/loading the %s extension (a first build takes minutes)", EXTENSION_NAME)
    start = time.perf_counter()
    cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(p) for p in SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-lineinfo"],
        is_python_module=False,
    )
    log.info("%s ready in %.1f s", EXTENSION_NAME, time.perf_counter() - start)


def build_environment(build_root: Path, threads: int) -> dict[str, str]:
    """What a process that builds or loads the extension in `build_root` needs in its
    environment: torch's extensions folder, and ninja's parallel compile jobs."""
    return {"TORCH_EXTENSIONS_DIR": str(build_root), "MAX_JOBS": str(threads)}


def prebuild(build_root: Path) -> dict[str, Any]:
    """Compile the extension into `build_root` ahead of the code that loads it, in a process
    whose environment points there (`build_environment`). The DAG does this in a job of its
    own, because nvcc needs cores, not the GPU that study C holds while it runs. Returns what
    happened: status `ok` with the build's seconds, or `skipped` / `failed` with the reason."""
    record: dict[str, Any] = {"extension": EXTENSION_NAME, "build_root": str(build_root)}
    if not torch.cuda.is_available():
        reason = "no CUDA GPU on this host: the kernel can't run here, so it is not built"
        return record | {"status": "skipped", "reason": reason}
    if Path(os.environ.get("TORCH_EXTENSIONS_DIR", "")) != build_root:
        raise ValueError(f"prebuild({build_root}) needs TORCH_EXTENSIONS_DIR={build_root}")
    start = time.perf_counter()
    try:
        load_extension()
    except Exception as e:  # the study retries and reports it in its rows
        log.exception("building %s failed", EXTENSION_NAME)
        return record | {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    return record | {"status": "ok", "reason": None, "seconds": time.perf_counter() - start}


def _forward_cpu(x: torch.Tensor, weight, bias, stride: Pair, padding: Pair) -> torch.Tensor:
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    cols = F.unfold(x, (r, s), padding=padding, stride=stride)  # (N, C·R·S, P·Q)
    z = weight.reshape(k, -1) @ cols + bias.view(1, k, 1)
    return z.clamp_min_(0).view(n, k, p, q)


def _backward_cpu(
    grad_y: torch.Tensor, x, weight, y, stride: Pair, padding: Pair, input_grad: bool
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    g = (grad_y * (y > 0)).reshape(n, k, -1)  # dL/dz, (N, K, P·Q)
    cols = F.unfold(x, (r, s), padding=padding, stride=stride)
    grad_w = (g @ cols.transpose(1, 2)).sum(0).view_as(weight)
    grad_b = g.sum((0, 2))
    grad_x = None
    if input_grad:
        grad_cols = weight.reshape(k, -1).t() @ g  # (N, C·R·S, P·Q)
        grad_x = F.fold(grad_cols, (h, w), (r, s), padding=padding, stride=stride)
    return grad_x, grad_w, grad_b


class FusedConvReLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding):
        stride, padding = check_supported(x, weight, bias, stride, padding)
        x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
        if x.is_cuda:
            load_extension()
            y = torch.ops.dmls.fused_conv_relu_forward(x, weight, bias, *stride, *padding)
        else:
            y = _forward_cpu(x, weight, bias, stride, padding)
        # The output is the ReLU mask (y > 0): no pre-activation tensor is kept.
        ctx.save_for_backward(x, weight, bias, y)
        ctx.stride, ctx.padding = stride, padding
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        x, weight, bias, y = ctx.saved_tensors
        input_grad = ctx.needs_input_grad[0]
        if x.is_cuda:
            grad_x, grad_w, grad_b = torch.ops.dmls.fused_conv_relu_backward(
                grad_y.contiguous(), x, weight, bias, y, *ctx.stride, *ctx.padding, input_grad
            )
        else:
            grad_x, grad_w, grad_b = _backward_cpu(
                grad_y, x, weight, y, ctx.stride, ctx.padding, input_grad
            )
        return grad_x, grad_w, grad_b, None, None


def fused_conv_relu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias, stride, padding)) in one kernel (CUDA) with its own backward."""
    return FusedConvReLUFunction.apply(x, weight, bias, stride, padding)


class FusedConvReLU(nn.Conv2d):
    """nn.Conv2d followed by ReLU, computed by `fused_conv_relu`. Same parameters, names and
    initialisation as nn.Conv2d, so a baseline's state dict loads into it unchanged."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
    ) -> None:
        # Conv2d takes any int sequence (its _pair); its stub says tuple[int, int].
        size, step, pad = cast("tuple[Any, Any, Any]", (kernel_size, stride, padding))
        super().__init__(in_channels, out_channels, size, stride=step, padding=pad)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> FusedConvReLU:
        """A FusedConvReLU with `conv`'s weights; UnsupportedConv if the kernel can't do it."""
        problems = [
            f"{what} {value!r}"
            for what, value, ok in (
                ("groups", conv.groups, conv.groups == 1),
                ("dilation", conv.dilation, conv.dilation == (1, 1)),
                ("padding", conv.padding, not isinstance(conv.padding, str)),
                ("padding_mode", conv.padding_mode, conv.padding_mode == "zeros"),
                ("bias", None, conv.bias is not None),
            )
            if not ok
        ]
        if problems:
            raise UnsupportedConv(f"can't fuse {conv}: unsupported {', '.join(problems)}")
        padding = cast("tuple[int, ...]", conv.padding)  # a str padding raised above
        fused = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, padding)
        fused.to(conv.weight.device, conv.weight.dtype).load_state_dict(conv.state_dict())
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Built with a bias and int padding (__init__), never None or a str.
        bias, padding = cast(torch.Tensor, self.bias), cast("tuple[int, ...]", self.padding)
        return fused_conv_relu(x, self.weight, bias, self.stride, padding)


def fuse_conv_relu(model: nn.Module) -> int:
    """Swap, in place, each nn.Conv2d directly followed by nn.ReLU inside an nn.Sequential for a
    FusedConvReLU with the same weights (the ReLU becomes Identity, so parameter names stay);
    return how many were fused."""
    fused = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        for conv_name, relu_name in itertools.pairwise(names):
            conv, relu = getattr(seq, conv_name), getattr(seq, relu_name)
            if type(conv) is nn.Conv2d and isinstance(relu, nn.ReLU):
                setattr(seq, conv_name, FusedConvReLU.from_conv(conv))
                setattr(seq, relu_name, nn.Identity())
                fused += 1
    return fused
