"""One training loop for every run: single process, DataParallel, DDP under torchrun, accelerate.

Reads top-down: `train(spec)` sets up the process group (or reads what the launcher set up),
builds data, model and optimizer, runs the epochs and returns the run's result. Launcher
differences are confined to `Distributed` and `Trainer`'s three small hooks (wrap, backward,
no-sync); everything else is the same code for every run, so studies compare like with like.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from tqdm import tqdm

from dmls.config.spec import FP8_MULTIPLE, RunSpec
from dmls.data import datasets
from dmls.data.device_resident import CROP_PADDING, BatchAugment, DeviceBatches, DeviceLoader
from dmls.training import checkpoint
from dmls.training.faults import Fault
from dmls.training.models import build_model
from dmls.training.steps import CapturedStep, eager_reason

COLLECTIVE_TIMEOUT = timedelta(minutes=5)
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class WorldSizeMismatch(RuntimeError):
    """The launcher started a different number of processes than the spec asks for."""


# --------------------------------------------------------------------------- processes
@dataclass
class Distributed:
    """Who this process is. Filled from what torchrun / accelerate put in the environment."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device
    accelerator: Any = None  # accelerate.Accelerator for accelerate runs

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def gather(self, obj: Any) -> list[Any]:
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.is_distributed and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def start_processes(spec: RunSpec) -> Distributed:
    """Join the process group the launcher prepared, and check it is the one the spec asked for."""
    node_rank = int(os.environ.get("GROUP_RANK", 0))
    if spec.launcher == "accelerate":
        from accelerate import Accelerator

        # Mixed precision and CPU mode come from `accelerate launch` flags (environment).
        acc = Accelerator(kwargs_handlers=[_accelerate_timeout()])
        env = Distributed(
            acc.process_index,
            acc.local_process_index,
            acc.num_processes,
            node_rank,
            acc.device,
            acc,
        )
    elif spec.launcher == "torchrun":
        if "RANK" not in os.environ:
            raise RuntimeError("launcher 'torchrun' but RANK is unset: start train.py via torchrun")
        local_rank = int(os.environ["LOCAL_RANK"])
        device = _device(spec, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=spec.backend,
            timeout=COLLECTIVE_TIMEOUT,
            # NCCL binds its communicator to this GPU (and barrier() knows which one to use).
            device_id=device if spec.backend == "nccl" else None,
        )
        env = Distributed(dist.get_rank(), local_rank, dist.get_world_size(), node_rank, device)
    else:
        device = _device(spec, 0)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        env = Distributed(0, 0, 1, 0, device)
    if env.world_size != spec.processes:
        # Cheap to check, expensive to miss: `accelerate launch --multi_gpu` on a CPU host
        # silently starts independent single-process trainings.
        raise WorldSizeMismatch(
            f"run {spec.run_id} asks for {spec.processes} process(es) "
            f"({spec.nodes} node(s) × {spec.nproc_per_node}) but the launcher started a world "
            f"of {env.world_size} (rank {env.rank})"
        )
    return env


def _accelerate_timeout():
    from accelerate.utils import InitProcessGroupKwargs

    return InitProcessGroupKwargs(timeout=COLLECTIVE_TIMEOUT)


def _device(spec: RunSpec, local_rank: int) -> torch.device:
    use_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"run {spec.run_id} asks for device 'cuda' but CUDA is not available")
    return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")


# --------------------------------------------------------------------------- data
@dataclass
class Loaders:
    """One rank's training batches (and the sampler that orders them) and test batches."""

    train: Any  # DataLoader or DeviceLoader: `len()`, iteration, and a `sampler` with set_epoch
    test: Any
    sampler: DistributedSampler
    n_train: int
    n_test: int
    manifest: dict


def _channel_stats(manifest: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set's per-channel mean and std, shaped to broadcast over (C, H, W)."""
    return (
        torch.tensor(manifest["mean"]).view(-1, 1, 1),
        torch.tensor(manifest["std"]).view(-1, 1, 1),
    )


def _normalize(images: torch.Tensor, manifest: dict) -> torch.Tensor:
    """uint8 (…, C, H, W) → float, scaled to [0, 1] and standardised per channel."""
    mean, std = _channel_stats(manifest)
    return (images.float() / 255 - mean) / std


class AugmentedImages(Dataset):
    """uint8 NCHW images augmented one sample at a time (torchvision), as the course does,
    then standardised like the test set."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, spec: RunSpec, manifest: dict):
        from torchvision.transforms import v2  # imported only here: it costs seconds per process

        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)
        self.mean, self.std = _channel_stats(manifest)
        channels, size = manifest["input_shape"][0], manifest["input_shape"][1]
        aug = spec.augment
        steps: list[Any] = [v2.ToDtype(torch.float32, scale=True)]
        if aug.random_crop:
            steps.append(v2.RandomCrop(size, padding=CROP_PADDING))
        if aug.horizontal_flip:
            steps.append(v2.RandomHorizontalFlip())
        if aug.color_jitter:
            saturation = aug.color_jitter if channels == 3 else 0.0  # grey images have none
            steps.append(v2.ColorJitter(aug.color_jitter, aug.color_jitter, saturation))
        if aug.rotation_degrees:
            steps.append(v2.RandomRotation(aug.rotation_degrees))
        self.augment = v2.Compose(steps)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return (self.augment(self.images[i]) - self.mean) / self.std, self.labels[i]


def _has_augmentation(spec: RunSpec) -> bool:
    a = spec.augment
    return a.random_crop or a.horizontal_flip or bool(a.color_jitter) or bool(a.rotation_degrees)


def make_loaders(
    spec: RunSpec, env: Distributed, data_dir: Path, memory_format: torch.memory_format
) -> Loaders:
    """This rank's shard of the dataset, through the course's DataLoader (`loader: torch`) or
    resident on the training device (`loader: device`, dmls/data/device_resident.py)."""
    ds = datasets.load(data_dir, spec.dataset)
    x_train, y_train, x_test, y_test = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    if spec.train_samples:
        x_train, y_train = x_train[: spec.train_samples], y_train[: spec.train_samples]
    if spec.test_samples:
        x_test, y_test = x_test[: spec.test_samples], y_test[: spec.test_samples]
    # Every launcher shards through DistributedSampler, a single process with 1 replica: the
    # shuffled order is then the same, and 2 ranks × batch B/2 see exactly 1 rank × batch B.
    sampler = DistributedSampler(
        range(len(y_train)), num_replicas=env.world_size, rank=env.rank, shuffle=True,
        seed=spec.seed,
    )  # fmt: skip
    # DataParallel splits one batch over its GPUs: batch_size is per GPU, as for DDP.
    per_step = spec.batch_size * (spec.nproc_per_node if spec.launcher == "dp" else 1)
    # fp8 GEMMs need the batch divisible by 16 in the weight-gradient matmul too, so fp8 runs drop
    # a ragged last batch (fewer than batch_size samples per epoch go unseen).
    drop_last = spec.precision == "fp8"
    # Test shards without DistributedSampler's padding, so the reduced metrics cover every
    # test sample exactly once.
    shard = slice(env.rank, None, env.world_size)
    test_batch = max(per_step, 256)
    images = x_train.ndim == 4
    test_x = _normalize(torch.from_numpy(x_test), ds.manifest) if images else x_test
    test_x, test_y = torch.as_tensor(test_x)[shard], torch.from_numpy(y_test)[shard]

    if spec.loader == "device":
        device = env.device
        transform = None
        if images:
            transform = BatchAugment(
                spec.augment, ds.manifest["mean"], ds.manifest["std"], device, memory_format
            )
            test_x = test_x.contiguous(memory_format=memory_format)
        train = DeviceLoader(
            torch.from_numpy(x_train).to(device), torch.from_numpy(y_train).to(device),
            sampler, per_step, drop_last, transform,
        )  # fmt: skip
        test = DeviceBatches(test_x.to(device), test_y.to(device), test_batch)
    else:
        if not images:  # feature vectors: already float32, nothing to transform
            train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
        elif _has_augmentation(spec):
            train_set = AugmentedImages(x_train, y_train, spec, ds.manifest)
        else:  # every epoch sees the same tensors: convert once, not per sample
            train_set = TensorDataset(
                _normalize(torch.from_numpy(x_train), ds.manifest), torch.from_numpy(y_train)
            )
        common = dict(
            num_workers=spec.num_workers,
            pin_memory=env.device.type == "cuda",
            persistent_workers=spec.num_workers > 0,
        )
        train = DataLoader(
            train_set, batch_size=per_step, sampler=sampler, drop_last=drop_last, **common
        )
        test = DataLoader(
            TensorDataset(test_x, test_y), batch_size=test_batch, shuffle=False, **common
        )
    return Loaders(train, test, sampler, len(y_train), len(y_test), ds.manifest)


# --------------------------------------------------------------------------- model & optimizer
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
    if spec.scheduler.name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=spec.scheduler.max_lr, total_steps=spec.epochs * steps_per_epoch
        )
    return None


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


def _convert_to_float8(model: nn.Module) -> int:
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


# --------------------------------------------------------------------------- training
@dataclass
class Progress:
    """Where a run stands after its last finished epoch (what a checkpoint resumes)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_test_loss: float = math.inf
    epochs_since_best: int = 0
    stopped_early_epoch: int | None = None

    @property
    def epoch(self) -> int:
        """Epochs finished."""
        return len(self.history)


class Trainer:
    """The epoch loop. The three launcher-specific hooks are `_wrap`, `_backward`, `_no_sync`."""

    def __init__(self, spec: RunSpec, env: Distributed, data_dir: Path) -> None:
        self.spec, self.env = spec, env
        self.fault = Fault.from_env()
        cuda = env.device.type == "cuda"
        # The fast step on a GPU (`step: graph|compile`); `step: eager` is the course's code.
        fast = cuda and spec.step != "eager"
        # channels_last: cuDNN's convolutions run NHWC natively; NCHW costs a transpose each.
        images = spec.model.name != "mlp"
        self.memory_format = torch.channels_last if fast and images else torch.contiguous_format
        # Fixed shapes: time the conv algorithms once. Not under DataParallel, which runs its
        # replicas in new threads every step: with autotuning on, its step took 111 ms instead
        # of 7 (2× H100, torch 2.11), as if it were tuned again each time.
        torch.backends.cudnn.benchmark = fast and spec.launcher != "dp"
        loaders = make_loaders(spec, env, data_dir, self.memory_format)
        self.train_loader, self.test_loader, self.sampler = (
            loaders.train,
            loaders.test,
            loaders.sampler,
        )
        self.n_train, self.n_test, self.manifest = loaders.n_train, loaders.n_test, loaders.manifest

        torch.manual_seed(spec.seed)  # identical initial weights on every rank
        self.model = build_model(
            spec.model, self.manifest["input_shape"], self.manifest["num_classes"]
        ).to(env.device, memory_format=self.memory_format)
        native_fp8 = spec.precision == "fp8" and spec.launcher != "accelerate"
        self.fp8_linear_layers = _convert_to_float8(self.model) if native_fp8 else 0
        self.probe = PrecisionProbe(self.model)
        if self.fp8_linear_layers:
            # An fp8 GEMM returns the dtype of its input, so the hook can't see it: say so here.
            self.probe.seen.add("fp8")
        self.criterion = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
        self.optimizer = make_optimizer(spec, self.model.parameters(), fused=fast)
        steps_per_epoch = math.ceil(len(self.train_loader) / spec.grad_accum_steps)
        self.scheduler = make_scheduler(spec, self.optimizer, steps_per_epoch)
        self.autocast_dtype = (
            None if spec.launcher == "accelerate" else AUTOCAST_DTYPES.get(spec.precision)
        )
        self.scaler = torch.amp.GradScaler(
            env.device.type, enabled=spec.precision == "fp16" and spec.launcher != "accelerate"
        )
        drill = self.fault is not None and self.fault.targets(spec.run_id)
        self.eager_reason = eager_reason(spec, env.device, fault_drill=drill)
        # Graphs are captured on a side stream, and DDP must be built on the stream it runs on.
        self.stream = torch.cuda.Stream(env.device) if self.eager_reason is None else None
        with self._step_stream():
            self.wrapped = self._wrap()
            # Training loss, correct predictions and samples of the epoch so far.
            self.sums = torch.zeros(3, device=env.device, dtype=torch.float64)
        # What runs a training micro-step: the wrapped model, compiled for `step: compile`
        # after the first step (which runs eagerly, so the precision probe sees it).
        self.step_module = self.wrapped
        # (Under DDP, dynamo splits the compiled graph at DDP's bucket boundaries, so the
        # all-reduces still start during the backward: tests/test_engine_cuda.py checks that
        # such a run learns what eager DDP learns.)
        self.compile_pending = self.stream is not None and spec.step == "compile"
        ddp = isinstance(self.wrapped, nn.parallel.DistributedDataParallel)
        self.captured = None
        if self.stream is not None:
            self.captured = CapturedStep(
                self._group_micro_step,
                self._zero_grads_in_place,
                11 if ddp else 3,
                self.stream,
                batch_size=spec.batch_size,
                accumulate=spec.grad_accum_steps > 1,
            )
            torch.cuda.synchronize(env.device)  # the side stream starts after the setup copies

    # -- launcher hooks
    def _wrap(self) -> nn.Module:
        spec, env = self.spec, self.env
        if spec.launcher == "dp":
            return nn.DataParallel(self.model, device_ids=list(range(spec.nproc_per_node)))
        if spec.launcher == "torchrun":
            ids = [env.device.index] if env.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if spec.launcher == "accelerate":
            # Data sharding stays ours (the same for every launcher); accelerate prepares the
            # model (DDP, mixed precision) and the optimizer (its loss scaler).
            acc = env.accelerator
            if self.scheduler is None:
                model, self.optimizer = acc.prepare(self.model, self.optimizer)
            else:
                model, self.optimizer, self.scheduler = acc.prepare(
                    self.model, self.optimizer, self.scheduler
                )
            return model
        return self.model

    def _backward(self, loss: torch.Tensor) -> None:
        if self.env.accelerator is not None:
            self.env.accelerator.backward(loss)  # applies accelerate's own loss scaling
        else:
            self.scaler.scale(loss).backward()

    def _no_sync(self, skip_sync: bool):
        """Skip DDP's gradient all-reduce on the micro-steps before an optimizer step."""
        if not skip_sync:
            return contextlib.nullcontext()
        if self.env.accelerator is not None:
            return self.env.accelerator.no_sync(self.wrapped)
        if isinstance(self.wrapped, nn.parallel.DistributedDataParallel):
            return self.wrapped.no_sync()
        return contextlib.nullcontext()

    def _optimizer_step(self) -> None:
        if self.env.accelerator is not None:
            self.optimizer.step()  # accelerate's optimizer unscales and skips inf steps itself
        else:
            self.scaler.step(self.optimizer)  # a plain step when the scaler is disabled
            self.scaler.update()
        if not (self.captured and self.captured.graphs):  # (captured: the gradients live on)
            self.optimizer.zero_grad(set_to_none=True)
        elif self.captured.accumulate:
            self._zero_grads_in_place()  # the captured micro-steps add into these tensors
        # (Else a replayed step writes every gradient: nothing to zero.)
        if self.scheduler is not None:
            self.scheduler.step()

    def _autocast(self):
        return torch.autocast(
            self.env.device.type,
            dtype=self.autocast_dtype,
            enabled=self.autocast_dtype is not None,
            # Autocast's cache of low-precision weight copies is freed when the context exits,
            # but a captured graph would keep reading them: PyTorch's CUDA-graph notes say to
            # turn it off for captured regions.
            cache_enabled=self.stream is None,
        )

    def _zero_grads_in_place(self) -> None:
        """Zero every gradient, allocating the missing ones: a captured step keeps reading and
        writing these very tensors."""
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self.optimizer.zero_grad(set_to_none=False)

    def _group_micro_step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        sync: bool,
        divisor: int | None = None,
        fault: Fault | None = None,
    ) -> None:
        """One micro-step of an accumulation group, all-reducing (DDP) only when `sync`; the
        loss is divided by the group's size (default `grad_accum_steps`: a full group, the one
        CapturedStep captures)."""
        with self._no_sync(skip_sync=not sync):
            self._micro_step(x, y, divisor or self.spec.grad_accum_steps, fault)

    def _step_stream(self):
        return torch.cuda.stream(self.stream) if self.stream else contextlib.nullcontext()

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on the training device (a no-op for `loader: device`)."""
        x = x.to(self.env.device, non_blocking=True).contiguous(memory_format=self.memory_format)
        return x, y.to(self.env.device, non_blocking=True)

    def _micro_step(
        self, x: torch.Tensor, y: torch.Tensor, divisor: int = 1, fault: Fault | None = None
    ) -> None:
        """Forward, loss and backward of one micro-batch, adding its loss, correct predictions
        and size to `self.sums` (on the device: no host sync inside the epoch)."""
        with self._autocast():
            logits = self.step_module(x)
            loss = self.criterion(logits, y)
        if fault:
            loss = fault.fire(loss)
        self._backward(loss / divisor)
        self.sums[0] += loss.detach().double() * len(y)
        self.sums[1] += (logits.argmax(1) == y).sum()
        self.sums[2] += len(y)
        if self.compile_pending:
            # Inductor fuses the step's elementwise work (BN, activation, pooling, their
            # backward) into a few kernels; the CUDA graph then replays those.
            # Static shapes (the ragged last batch gets its own graph, outside the capture) and
            # a fresh cache, so nothing compiled for an earlier run in this process recompiles
            # with dynamic shapes in the middle of a capture.
            torch._dynamo.reset()
            self.step_module = torch.compile(self.wrapped, dynamic=False)
            self.compile_pending = False

    # -- epochs
    def train_epoch(self, epoch: int) -> tuple[float, float]:
        with self._step_stream():
            return self._train_epoch(epoch)

    def _train_epoch(self, epoch: int) -> tuple[float, float]:
        self.wrapped.train()
        self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        k, n = self.spec.grad_accum_steps, len(self.train_loader)
        tail_start = n - n % k  # the last group may hold fewer than k micro-batches
        fault = self.fault  # a DMLS_FAULT drill fires halfway through its epoch
        if fault and not fault.hits(self.spec.run_id, self.env.rank, epoch + 1):
            fault = None
        self.sums.zero_()
        for step, (x, y) in enumerate(self._progress(self.train_loader, epoch)):
            x, y = self._to_device(x, y)
            last_micro = (step + 1) % k == 0 or step + 1 == n
            if self.captured is not None and step < tail_start:
                self.captured(x, y, sync=last_micro)
            else:  # (and a last group of fewer than k micro-batches: its divisor differs)
                divisor = k if step < tail_start else n - tail_start
                self._group_micro_step(x, y, last_micro, divisor, fault if step == n // 2 else None)
            if last_micro:
                self._optimizer_step()
        loss_sum, correct, count = self.env.all_reduce_sum(self.sums).tolist()
        return loss_sum / count, correct / count

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        self.wrapped.eval()
        plain = nn.CrossEntropyLoss(reduction="sum")  # test loss without label smoothing
        sums = torch.zeros(3, device=self.env.device, dtype=torch.float64)
        for x, y in self.test_loader:
            x, y = self._to_device(x, y)
            with self._autocast():
                logits = self.wrapped(x)
            sums[0] += plain(logits.float(), y).double()
            sums[1] += (logits.argmax(1) == y).sum()
            sums[2] += len(y)
        loss_sum, correct, count = self.env.all_reduce_sum(sums).tolist()
        if int(count) != self.n_test:
            raise RuntimeError(f"evaluated {int(count)} test samples, expected {self.n_test}")
        return loss_sum / count, correct / count

    def _progress(self, loader, epoch: int) -> Iterator:
        if not self.env.is_main:
            return iter(loader)
        return tqdm(
            loader,
            desc=f"epoch {epoch + 1}/{self.spec.epochs}",
            file=sys.stderr,
            mininterval=5.0,
            ascii=True,
            leave=True,  # the final 100% line stays in the log
        )

    def _sync(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)

    def fit(self, checkpoint_path: Path) -> dict[str, Any]:
        """Train the remaining epochs (all of them, unless a checkpoint of this spec exists),
        checkpointing after each."""
        spec = self.spec
        progress = self._resume(checkpoint_path)
        resumed_from_epoch = progress.epoch
        status, reason, diverged_epoch = "ok", None, None
        checkpoint_time = 0.0
        while progress.epoch < spec.epochs and not progress.stopped_early_epoch:
            epoch = progress.epoch
            self._sync()
            t0 = time.perf_counter()
            train_loss, train_acc = self.train_epoch(epoch)
            self._sync()
            t1 = time.perf_counter()
            test_loss, test_acc = self.evaluate()
            self._sync()
            t2 = time.perf_counter()
            progress.history.append(
                {
                    "epoch": epoch + 1,
                    "train_loss": train_loss,
                    "train_accuracy": train_acc,
                    "test_loss": test_loss,
                    "test_accuracy": test_acc,
                    "train_time_s": t1 - t0,
                    "eval_time_s": t2 - t1,
                    "lr": self.optimizer.param_groups[0]["lr"],
                }
            )
            if self.env.is_main:
                print(
                    f"epoch {epoch + 1}/{spec.epochs}  train loss {train_loss:.4f} "
                    f"acc {train_acc:.4f}  test loss {test_loss:.4f} acc {test_acc:.4f}  "
                    f"{t1 - t0:.2f} s",
                    flush=True,
                )
            # The losses are reduced over ranks, so every rank stops at the same epoch.
            if not (math.isfinite(train_loss) and math.isfinite(test_loss)):
                status, diverged_epoch = "diverged", epoch + 1
                reason = (
                    f"non-finite loss at epoch {epoch + 1} (train {train_loss}, test {test_loss})"
                )
                break
            if test_loss < progress.best_test_loss:
                progress.best_test_loss, progress.epochs_since_best = test_loss, 0
            else:
                progress.epochs_since_best += 1
            patience = spec.early_stopping_patience
            if patience and progress.epochs_since_best >= patience:
                progress.stopped_early_epoch = epoch + 1
            t3 = time.perf_counter()
            self._save_checkpoint(checkpoint_path, progress)
            checkpoint_time += time.perf_counter() - t3
        return {
            "checkpoint_time_s": checkpoint_time,
            "status": status,
            "reason": reason,
            "history": progress.history,
            "stopped_early_epoch": progress.stopped_early_epoch,
            "diverged_epoch": diverged_epoch,
            "resumed_from_epoch": resumed_from_epoch,
        }

    # -- checkpoints (dmls/training/checkpoint.py says what they hold and why)
    def _scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler in use: ours, or accelerate's own for its fp16."""
        if self.env.accelerator is not None:
            return self.env.accelerator.scaler
        return self.scaler if self.scaler.is_enabled() else None

    def _save_checkpoint(self, path: Path, progress: Progress) -> None:
        rng = self.env.gather(checkpoint.rng_state(self.env.device))
        if not self.env.is_main:
            return
        scaler = self._scaler()
        state = {
            "epoch": progress.epoch,
            "progress": asdict(progress),
            "model": self.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "precisions": sorted(self.probe.seen),
            "rng": rng,
        }
        checkpoint.save(path, self.spec, state)

    def _resume(self, path: Path) -> Progress:
        state, note = checkpoint.load(path, self.spec)
        if self.env.is_main:
            print(note, flush=True)
        if state is None:
            return Progress()
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if (scaler := self._scaler()) is not None:
            scaler.load_state_dict(state["scaler"])
        self.probe.seen.update(state["precisions"])
        # Last: building the trainer above drew from the generators.
        checkpoint.set_rng_state(state["rng"][self.env.rank], self.env.device)
        return Progress(**state["progress"])

    def step_record(self) -> dict[str, Any]:
        """How the training steps really ran: replayed from a CUDA graph, or eagerly and why."""
        compiled = self.step_module is not self.wrapped
        record: dict[str, Any] = {
            "requested": self.spec.step,
            "compiled": compiled,
            "memory_format": "channels_last"
            if self.memory_format == torch.channels_last
            else "contiguous",
        }
        if self.captured is None:
            return record | {"mode": "eager", "eager_reason": self.eager_reason}
        summary = self.captured.summary
        if not summary["captured"]:
            reason = f"no epoch had more than {self.captured.warmup_steps} full batches to warm up"
            return record | summary | {"mode": "eager", "eager_reason": reason}
        return record | summary | {"mode": "cuda_graph", "eager_reason": None}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}


def _rank_facts(env: Distributed, spec: RunSpec) -> dict[str, Any]:
    gpus = []
    if env.device.type == "cuda":
        indices = range(spec.nproc_per_node) if spec.launcher == "dp" else [env.device.index]
        for i in indices:
            gpus.append(
                {
                    "index": i,
                    "name": torch.cuda.get_device_name(i),
                    "peak_gpu_mem_allocated_bytes": torch.cuda.max_memory_allocated(i),
                    "peak_gpu_mem_reserved_bytes": torch.cuda.max_memory_reserved(i),
                }
            )
    return {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "node_rank": env.node_rank,
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "device": str(env.device),
        "gpus": gpus,
        # Where the rank was allowed to run (a local run's reservation, or Slurm's allocation).
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # ru_maxrss is in KiB on Linux; DataLoader workers are separate processes, not counted.
        "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def train(
    spec: RunSpec, data_dir: Path, model_path: Path, checkpoint_path: Path
) -> dict[str, Any] | None:
    """Run one training, resuming from `checkpoint_path` when it holds this spec's last
    finished epoch; rank 0 saves the final weights to `model_path` and returns the result
    (other ranks None)."""
    wall_start = time.perf_counter()
    env = start_processes(spec)
    joined = time.perf_counter()
    torch.set_num_threads(max(1, int(os.environ.get("DMLS_THREADS_PER_PROCESS", "1"))))
    trainer = Trainer(spec, env, data_dir)
    fit_start = time.perf_counter()
    outcome = trainer.fit(checkpoint_path)
    fit_end = time.perf_counter()
    ranks = env.gather(_rank_facts(env, spec))
    effective = env.gather(trainer.probe.effective)
    result = None
    if env.is_main:
        history = outcome["history"]
        train_time = sum(h["train_time_s"] for h in history)
        last = history[-1] if history else {}
        torch.save(
            {"model": trainer.state_dict(), "spec": spec.to_dict(), "epochs": len(history)},
            model_path,
        )
        result = {
            "status": outcome["status"],
            "reason": outcome["reason"],
            "history": history,
            "final": {
                "train_loss": last.get("train_loss"),
                "train_accuracy": last.get("train_accuracy"),
                "test_loss": last.get("test_loss"),
                "test_accuracy": last.get("test_accuracy"),
                "best_test_accuracy": max((h["test_accuracy"] for h in history), default=None),
                "epochs_completed": len(history),
                "stopped_early_epoch": outcome["stopped_early_epoch"],
                "diverged_epoch": outcome["diverged_epoch"],
            },
            "resumed_from_epoch": outcome["resumed_from_epoch"],
            # Where the run's seconds went, in order: joining the process group, loading the
            # data and building the model (setup); the epochs (train, eval, checkpoints);
            # gathering the results, saving the model and leaving the group (teardown; it and
            # the wall time are set below). train.py adds the imports before all of it.
            "timing": {
                "setup_s": fit_start - wall_start,
                "process_group_s": joined - wall_start,  # of setup: joining (NCCL's init)
                "train_time_s": train_time,
                "eval_time_s": sum(h["eval_time_s"] for h in history),
                "checkpoint_time_s": outcome["checkpoint_time_s"],
                "fit_s": fit_end - fit_start,
                "samples_per_s": trainer.n_train * len(history) / train_time
                if train_time
                else None,
            },
            "effective_precision": "/".join(sorted(set(effective))),
            "fp8_linear_layers": trainer.fp8_linear_layers,
            "step": trainer.step_record(),
            "data": {
                k: trainer.manifest.get(k) for k in ("name", "synthetic", "source", "input_shape")
            }
            | {"n_train": trainer.n_train, "n_test": trainer.n_test},
            "world_size": env.world_size,
            "ranks": ranks,
        }
    if trainer.captured is not None:
        # The graph holds NCCL work of the group's communicator: destroying the group while
        # the graph lived hung both DDP ranks in destroy_process_group (2× H100, torch 2.11).
        trainer.captured.release()
    env.close()
    if result is not None:
        end = time.perf_counter()
        result["timing"] |= {"teardown_s": end - fit_end, "wall_time_s": end - wall_start}
    return result
