"""The spec's optimizer and learning-rate schedule."""

from __future__ import annotations

from typing import Any

import torch

from dmls.config.spec import RunSpec


def optimizer_recipe(
    spec: RunSpec, fused: bool
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The spec's optimizer class and its arguments but the parameters (what
    ZeroRedundancyOptimizer builds each rank's shard of the optimizer from). `fused`: one
    multi-tensor CUDA kernel updates every parameter (Adam, AdamW, SGD) instead of a few kernels
    per parameter; the arithmetic is the same."""
    o = spec.optimizer
    # RMSprop has no fused kernel; foreach still batches its per-parameter updates.
    kernel = {"fused": True} if fused else {}
    # The momentum settings spelled out (their defaults), so that they are in the optimizer's
    # `defaults` when it is built by ZeroRedundancyOptimizer too: OneCycleLR cycles them.
    common = {"lr": o.lr, "weight_decay": o.weight_decay}
    if o.name == "sgd":
        return torch.optim.SGD, common | {"momentum": o.momentum} | kernel
    if o.name == "adam":
        return torch.optim.Adam, common | {"betas": (0.9, 0.999)} | kernel
    if o.name == "adamw":
        return torch.optim.AdamW, common | {"betas": (0.9, 0.999)} | kernel
    if o.name == "rmsprop":
        foreach = {"foreach": True} if fused else {}
        return torch.optim.RMSprop, common | {"momentum": 0.0} | foreach
    raise ValueError(f"unknown optimizer {o.name!r}")


def make_optimizer(spec: RunSpec, params, fused: bool) -> torch.optim.Optimizer:
    """The spec's optimizer over `params` (`optimizer_recipe`)."""
    cls, kwargs = optimizer_recipe(spec, fused)
    return cls(params, **kwargs)


def make_scheduler(spec: RunSpec, optimizer, steps_per_epoch: int):
    """OneCycle over the whole run (stepped once per optimizer step), or None."""
    if spec.scheduler.name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=spec.scheduler.max_lr, total_steps=spec.epochs * steps_per_epoch
        )
    return None
