"""The spec's optimizer and learning-rate schedule."""

from __future__ import annotations

import torch

from dmls.config.spec import RunSpec


def make_optimizer(spec: RunSpec, params, fused: bool) -> torch.optim.Optimizer:
    """The spec's optimizer. `fused`: one multi-tensor CUDA kernel updates every parameter
    (Adam, AdamW, SGD) instead of a few kernels per parameter; the arithmetic is the same."""
    o = spec.optimizer
    # RMSprop has no fused kernel; foreach still batches its per-parameter updates.
    kernel = {"fused": True} if fused else {}
    if o.name == "sgd":
        return torch.optim.SGD(
            params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, **kernel
        )
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay, **kernel)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, **kernel)
    if o.name == "rmsprop":
        foreach = {"foreach": True} if fused else {}
        return torch.optim.RMSprop(params, lr=o.lr, weight_decay=o.weight_decay, **foreach)
    raise ValueError(f"unknown optimizer {o.name!r}")


def make_scheduler(spec: RunSpec, optimizer, steps_per_epoch: int):
    """OneCycle over the whole run (stepped once per optimizer step), or None."""
    if spec.scheduler.name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=spec.scheduler.max_lr, total_steps=spec.epochs * steps_per_epoch
        )
    return None
