"""Mixed precision as the engine applies it (the strategy says whether it does: accelerate
applies its own, training/parallel.py): autocast, fp8 Linear layers, and a probe of the
precision a run really computed in."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dmls.config.spec import FP8_MULTIPLE

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Autocast:
    """The forward's autocast region: `dtype` None runs in fp32 (autocast off)."""

    device_type: str
    dtype: torch.dtype | None
    # Autocast's cache of low-precision weight copies is freed when the context exits, but a
    # captured graph would keep reading them: PyTorch's CUDA-graph notes say to turn it off
    # for captured regions.
    cache_enabled: bool

    def __call__(self) -> torch.autocast:
        return torch.autocast(
            self.device_type,
            dtype=self.dtype,
            enabled=self.dtype is not None,
            cache_enabled=self.cache_enabled,
        )


class PrecisionProbe:
    """Records the dtype the first conv/linear layer really outputs in the first training step:
    the *effective* precision, which differs from the requested one when autocast does nothing
    (accelerate's fp16 on a CPU, for instance). The hook then removes itself, so it costs the
    other steps nothing and never enters a compiled or captured step."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: set[str] = set()
        layer = next(m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear))
        self.handle = layer.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        if module.training:
            self.seen.add(DTYPE_NAMES.get(output.dtype, str(output.dtype)))
            self.handle.remove()

    @property
    def effective(self) -> str:
        return "+".join(sorted(self.seen)) or "unknown"


def convert_to_float8(model: nn.Module) -> int:
    """Swap the Linear layers that fp8 GEMMs can take for torchao's Float8Linear (dynamic
    scaling); return how many. Convolutions stay in the autocast/fp32 precision."""
    from torchao.float8 import convert_to_float8_training

    def eligible(module: nn.Module, fqn: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and module.in_features % FP8_MULTIPLE == 0
            and module.out_features % FP8_MULTIPLE == 0
        )

    converted = sum(eligible(m, "") for m in model.modules())
    if not converted:
        raise ValueError(f"fp8: no Linear layer has both dimensions divisible by {FP8_MULTIPLE}")
    convert_to_float8_training(model, module_filter_fn=eligible)
    return converted
