"""One rank's training, validation and test batches: through the course's DataLoader
(`loader: torch`) or resident on the training device (`loader: device`,
data/device_resident.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from dmls.config import data_sizes
from dmls.config.spec import RunSpec, SpecError
from dmls.data import datasets
from dmls.data.device_resident import CROP_PADDING, BatchAugment, DeviceBatches, DeviceLoader


@dataclass
class Loaders:
    """One rank's training batches (and the sampler that orders them), test batches and, with
    `validation_samples`, validation batches (None without)."""

    train: Any  # DataLoader or DeviceLoader: `len()`, iteration, and a `sampler` with set_epoch
    test: Any
    sampler: DistributedSampler
    n_train: int
    n_test: int
    manifest: dict
    # Distinct training samples no rank's step sees in an epoch (each rank's last batch
    # dropped, less the sampler's padding copies among them: `distinct_unseen`), and why.
    unseen_per_epoch: int = 0
    unseen_reason: str | None = None
    validation: Any = None
    n_validation: int = 0


def normalization(manifest: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set's per-channel mean and std (prepared with the dataset), shaped to
    broadcast over (C, H, W)."""
    return (
        torch.tensor(manifest["mean"]).view(-1, 1, 1),
        torch.tensor(manifest["std"]).view(-1, 1, 1),
    )


def normalize(images: torch.Tensor, manifest: dict) -> torch.Tensor:
    """uint8 (…, C, H, W) → float, scaled to [0, 1] and standardised per channel."""
    mean, std = normalization(manifest)
    return (images.float() / 255 - mean) / std


class AugmentedImages(Dataset):
    """uint8 NCHW images augmented one sample at a time (torchvision), as the course does,
    then standardised like the test set."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, spec: RunSpec, manifest: dict):
        from torchvision.transforms import v2  # imported only here: it costs seconds per process

        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)
        self.mean, self.std = normalization(manifest)
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


@functools.lru_cache(maxsize=2)
def _dataset(data_dir: Path, name: str) -> datasets.Dataset:
    """A prepared dataset, read from disk once per process: the seeds of a job share it."""
    return datasets.load(data_dir, name)


def load_manifest(data_dir: Path, name: str) -> dict[str, Any]:
    """The manifest of a prepared dataset (its SHA-256 is part of a checkpoint's identity)."""
    return _dataset(Path(data_dir), name).manifest


def make_loaders(
    spec: RunSpec,
    data_dir: Path,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    samples_per_step: int,
    memory_format: torch.memory_format,
    devices_per_step: int = 1,
    min_samples_per_device: int = 1,
) -> Loaders:
    """Rank `rank`'s shard of the dataset in batches of `samples_per_step` (what one process
    takes per micro-step, split over `devices_per_step` devices by DataParallel), on `device`
    for `loader: device`. A ragged last batch that would leave a device fewer than
    `min_samples_per_device` samples is dropped, and the loaders say so."""
    ds = _dataset(Path(data_dir), spec.dataset)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = _splits(spec, ds)
    # Every launcher shards through DistributedSampler, a single process with 1 replica: the
    # shuffled order is then the same, and 2 ranks × batch B/2 see exactly 1 rank × batch B.
    sampler: DistributedSampler[int] = DistributedSampler(
        range(len(y_train)),  # type: ignore[arg-type]  # any sized sequence: it takes the len
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=spec.seed,
    )
    last = len(sampler) % samples_per_step  # the ragged last batch of each epoch, if any
    unseen_reason = _unseen_reason(spec, last, devices_per_step, min_samples_per_device)
    drop_last = unseen_reason is not None
    evaluation = functools.partial(
        _evaluation_batches,
        spec,
        manifest=ds.manifest,
        rank=rank,
        world_size=world_size,
        device=device,
        samples_per_step=samples_per_step,
        memory_format=memory_format,
    )
    test = evaluation(x_test, y_test)
    validation = evaluation(x_val, y_val) if spec.validation_samples else None
    train = _training_batches(
        spec,
        x_train,
        y_train,
        ds.manifest,
        sampler,
        device=device,
        samples_per_step=samples_per_step,
        drop_last=drop_last,
        memory_format=memory_format,
    )
    return Loaders(
        train,
        test,
        sampler,
        len(y_train),
        len(y_test),
        ds.manifest,
        distinct_unseen(sampler, len(y_train), last) if drop_last else 0,
        unseen_reason,
        validation,
        len(y_val),
    )


def _loader_options(spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """`loader: torch`'s DataLoader options, the same for training and evaluation."""
    return dict(
        num_workers=spec.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=spec.num_workers > 0,
    )


def _evaluation_batches(
    spec: RunSpec,
    x: np.ndarray,
    y: np.ndarray,
    *,
    manifest: dict[str, Any],
    rank: int,
    world_size: int,
    device: torch.device,
    samples_per_step: int,
    memory_format: torch.memory_format,
) -> Any:
    """This rank's evaluation batches of (x, y): standardised, never augmented, sharded
    without DistributedSampler's padding, so the reduced metrics cover every sample
    exactly once. The validation split and the test set go through here alike."""
    images = x.ndim == 4
    xs = normalize(torch.from_numpy(x), manifest) if images else torch.from_numpy(x)
    xs, ys = xs[rank::world_size], torch.from_numpy(y)[rank::world_size]
    batch = max(samples_per_step, 256)
    if spec.loader == "device":
        xs = xs.contiguous(memory_format=memory_format) if images else xs
        return DeviceBatches(xs.to(device), ys.to(device), batch)
    return DataLoader(
        TensorDataset(xs, ys), batch_size=batch, shuffle=False, **_loader_options(spec, device)
    )


def _training_batches(
    spec: RunSpec,
    x: np.ndarray,
    y: np.ndarray,
    manifest: dict[str, Any],
    sampler: DistributedSampler,
    *,
    device: torch.device,
    samples_per_step: int,
    drop_last: bool,
    memory_format: torch.memory_format,
) -> Any:
    """This rank's training batches in the sampler's order: resident on `device`, images
    augmented and standardised there a batch at a time (`loader: device`), or a DataLoader."""
    if spec.loader == "device":
        transform = None
        if x.ndim == 4:
            transform = BatchAugment(
                spec.augment, manifest["mean"], manifest["std"], device, memory_format
            )
        return DeviceLoader(
            torch.from_numpy(x).to(device),
            torch.from_numpy(y).to(device),
            sampler,
            samples_per_step,
            drop_last,
            transform,
        )
    return DataLoader(
        _training_set(spec, x, y, manifest),
        batch_size=samples_per_step,
        sampler=sampler,
        drop_last=drop_last,
        **_loader_options(spec, device),
    )


Arrays = tuple[np.ndarray, np.ndarray]


def _splits(spec: RunSpec, ds: datasets.Dataset) -> tuple[Arrays, Arrays, Arrays]:
    """The run's (x, y) for training, validation and test: `validation_samples` held out of the
    training arrays, then `train_samples` and `test_samples` cut from the rest."""
    x_train, y_train, x_test, y_test = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    x_val, y_val = x_train[:0], y_train[:0]
    if spec.validation_samples:
        # The last rows, before `train_samples`: every seed and run on this data holds out the
        # same samples and trains on (a prefix of) the same rest.
        keep = len(y_train) - spec.validation_samples
        step_samples = spec.batch_size * spec.replicas
        if keep < step_samples:
            raise SpecError(
                f"studies.{spec.study}.runs.{spec.run}.validation_samples: "
                f"{spec.validation_samples} of the {len(y_train)} training samples held out "
                f"leave {max(keep, 0)} to train, fewer than one step's batch of {step_samples}; "
                f"use at most {len(y_train) - step_samples} ({data_sizes.FOUND_IN_THE_JOB})"
            )
        x_train, x_val = x_train[:keep], x_train[keep:]
        y_train, y_val = y_train[:keep], y_train[keep:]
    if spec.train_samples:
        x_train, y_train = x_train[: spec.train_samples], y_train[: spec.train_samples]
    if spec.test_samples:
        x_test, y_test = x_test[: spec.test_samples], y_test[: spec.test_samples]
    return (x_train, y_train), (x_val, y_val), (x_test, y_test)


def distinct_unseen(sampler: DistributedSampler, n: int, last: int) -> int:
    """How many of the `n` training samples no rank sees in an epoch where each rank drops its
    last `last` positions. The sampler pads its shuffled order to a multiple of the ranks with
    copies of the order's first samples (`total_size - n` of them) and deals position i to
    rank i mod R, so the dropped positions are the order's last R × last, the padding copies
    among them, their originals at its start, which are seen: 513 samples on 2 ranks drop 2
    positions, one of them a copy, and leave 1 sample unseen."""
    dropped = last * sampler.num_replicas
    padding = sampler.total_size - n
    return max(dropped - padding, 0) if dropped < sampler.total_size else n


def _unseen_reason(
    spec: RunSpec, last: int, devices_per_step: int, min_samples_per_device: int
) -> str | None:
    """Why the ragged last batch of `last` samples can't train (it is then dropped), or None."""
    # DataParallel scatters a batch as torch.chunk splits it.
    smallest = min(len(c) for c in torch.arange(last).chunk(devices_per_step)) if last else 0
    if last and spec.precision == "fp8":
        # fp8 GEMMs need the batch divisible by 16 in the weight-gradient matmul too.
        return f"fp8 matmuls can't take the last batch of {last} sample(s)"
    if last and smallest < min_samples_per_device:
        return (
            f"the last batch would put {smallest} sample(s) on a device, and batch norm over "
            f"feature vectors needs at least {min_samples_per_device} in training"
        )
    return None


def _training_set(
    spec: RunSpec, x: np.ndarray, y: np.ndarray, manifest: dict[str, Any]
) -> torch.utils.data.Dataset:
    """The training samples as `loader: torch`'s DataLoader takes them."""
    if x.ndim != 4:  # feature vectors: already float32, nothing to transform
        return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    if _has_augmentation(spec):
        return AugmentedImages(x, y, spec, manifest)
    # Every epoch sees the same tensors: convert once, not per sample.
    return TensorDataset(normalize(torch.from_numpy(x), manifest), torch.from_numpy(y))
