"""The fast data path (`loader: device`): the dataset lives on the training device, batches are
gathered and augmented there, many images per kernel.

The course's path (`loader: torch`) augments one image at a time in DataLoader workers and
copies every batch to the GPU; at batch 32 that costs more than the training step itself. Here
an epoch is one index tensor: the order is the one the course path's `DistributedSampler`
draws (so each rank sees exactly the samples it would see there, in the same order), and
the epoch's images are gathered from the resident uint8 set and augmented a few thousand at a
time, each image with its own random parameters. A step then only slices its batch. Nothing here
waits for the device, so the host can queue steps ahead of the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from dmls.config.spec import AugmentSpec

CROP_PADDING = 4  # the course's RandomCrop(size, padding=4)
EPOCH_CHUNK = 8192  # images augmented per kernel: bounds the augmentation's temporary memory
# ITU-R 601 luma, the weights torchvision's rgb_to_grayscale uses.
GREY_WEIGHTS = (0.299, 0.587, 0.114)


class BatchAugment:
    """The course's augmentations (random crop with padding 4, horizontal flip, colour jitter,
    rotation; in torchvision's order) applied to a whole uint8 batch, each image drawing its own
    random parameters, then standardised per channel. Returns float32 (B, C, H, W)."""

    def __init__(
        self,
        augment: AugmentSpec,
        mean: list[float],
        std: list[float],
        device: torch.device,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.augment, self.device, self.memory_format = augment, device, memory_format
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        a = self.augment
        x = self._crop_and_flip(images) if a.random_crop or a.horizontal_flip else images
        x = x.float().div_(255)
        if a.color_jitter:
            x = self._color_jitter(x, a.color_jitter)
        if a.rotation_degrees:
            x = self._rotate(x, a.rotation_degrees)
        x = (x - self.mean) / self.std
        return x.contiguous(memory_format=self.memory_format)

    def _uniform(self, n: int, low: float, high: float) -> torch.Tensor:
        return torch.empty(n, device=self.device).uniform_(low, high)

    def _crop_and_flip(self, images: torch.Tensor) -> torch.Tensor:
        """Crop and flip in one gather: each output pixel reads its source pixel of the
        zero-padded image, at a per-image offset, mirrored for the flipped images."""
        n, c, h, w = images.shape
        pad = CROP_PADDING if self.augment.random_crop else 0
        padded = F.pad(images, (pad, pad, pad, pad)) if pad else images
        dy = torch.randint(0, 2 * pad + 1, (n, 1), device=self.device)
        dx = torch.randint(0, 2 * pad + 1, (n, 1), device=self.device)
        rows = dy + torch.arange(h, device=self.device)  # (n, h)
        cols = torch.arange(w, device=self.device).expand(n, w)
        if self.augment.horizontal_flip:
            flip = torch.rand(n, 1, device=self.device) < 0.5
            cols = torch.where(flip, w - 1 - cols, cols)
        cols = dx + cols  # (n, w)
        source = rows[:, :, None] * (w + 2 * pad) + cols[:, None, :]  # (n, h, w) flat indices
        source = source.view(n, 1, h * w).expand(n, c, h * w)
        return padded.flatten(2).gather(2, source).view(n, c, h, w)

    def _color_jitter(self, x: torch.Tensor, strength: float) -> torch.Tensor:
        """Brightness, contrast, then saturation (grey images have none), each factor drawn
        per image from [max(0, 1 - s), 1 + s] as torchvision's ColorJitter does; torchvision
        also shuffles the order per call, a difference that doesn't matter for training."""
        n, low, high = x.shape[0], max(0.0, 1 - strength), 1 + strength

        def blend(image: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
            factor = self._uniform(n, low, high).view(n, 1, 1, 1)
            return (factor * image + (1 - factor) * other).clamp_(0, 1)

        x = blend(x, torch.zeros_like(x))  # brightness: scale towards black
        x = blend(x, _grey(x).mean(dim=(1, 2, 3), keepdim=True))  # contrast: towards mean grey
        if x.shape[1] == 3:
            x = blend(x, _grey(x))  # saturation: towards the image's own grey
        return x

    def _rotate(self, x: torch.Tensor, degrees: float) -> torch.Tensor:
        """Rotation about the centre by an angle drawn per image from [-d, d], nearest
        neighbour, zero fill (torchvision's RandomRotation defaults).
        The sampling grid is F.affine_grid's for [[cos, -sin, 0], [sin, cos, 0]], written out
        elementwise: affine_grid makes it with a batched matrix multiply, whose first call
        allocates cuBLAS's workspace (32 MiB on an H200) before training's first step, so the
        runs that rotate measured that much less "GPU memory a step adds" than the others
        (bench/rotation_workspace.py)."""
        n, _, h, w = x.shape
        angle = self._uniform(n, -math.radians(degrees), math.radians(degrees))
        cos, sin = angle.cos().view(n, 1, 1), angle.sin().view(n, 1, 1)
        # affine_grid's base grid (align_corners=False): the pixel centres, in [-1, 1]
        across = (torch.arange(w, device=x.device) * 2 + 1) / w - 1
        down = ((torch.arange(h, device=x.device) * 2 + 1) / h - 1).view(h, 1)
        grid = torch.stack([cos * across - sin * down, sin * across + cos * down], dim=-1)
        return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def _grey(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    r, g, b = GREY_WEIGHTS
    return (r * x[:, 0:1] + g * x[:, 1:2] + b * x[:, 2:3]).contiguous()


def sampler_order(sampler: DistributedSampler) -> torch.Tensor:
    """`list(sampler)` as a tensor: the same indices in the same order (DistributedSampler's
    seeded shuffle, padding and rank stride), built with tensor ops. Building the Python list
    of every index took 13 ms of each epoch, with both GPUs idle meanwhile: as long as six
    steps of batch 512 (2× H100, profiler trace). tests/test_device_resident.py compares the two."""
    n = len(sampler.dataset)  # type: ignore[arg-type]
    if sampler.shuffle:
        generator = torch.Generator()
        generator.manual_seed(sampler.seed + sampler.epoch)
        indices = torch.randperm(n, generator=generator)
    else:
        indices = torch.arange(n)
    # Pad by repeating the order (or drop the tail) so every rank gets as many samples.
    indices = indices.repeat(math.ceil(sampler.total_size / n))[: sampler.total_size]
    order = indices[sampler.rank : sampler.total_size : sampler.num_replicas]
    assert len(order) == sampler.num_samples, (len(order), sampler.num_samples)
    return order


class DeviceLoader:
    """Training batches of one rank, drawn from tensors resident on the training device.

    Same contract as the DataLoader it replaces: `len()` batches per epoch, `set_epoch` for a
    new shuffle, and the same samples per rank in the same order (the indices come from a
    `DistributedSampler`). `images` are uint8 NCHW (augmented per batch) or float32 features.
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        sampler: DistributedSampler,
        batch_size: int,
        drop_last: bool,
        transform: BatchAugment | None,
    ) -> None:
        self.inputs, self.labels, self.sampler = inputs, labels, sampler
        self.batch_size, self.drop_last, self.transform = batch_size, drop_last, transform

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # One host-to-device copy per epoch: this rank's whole index list.
        order = sampler_order(self.sampler)
        order = order.pin_memory() if self.inputs.is_cuda else order
        order = order.to(self.inputs.device, non_blocking=True)[: len(self) * self.batch_size]
        # The whole epoch is gathered and augmented up front, a chunk of images per kernel: a
        # step then only slices its batch, which keeps the host ahead of a small-batch GPU step.
        inputs, labels = self.inputs[order], self.labels[order]
        if self.transform:
            inputs = torch.cat([self.transform(chunk) for chunk in inputs.split(EPOCH_CHUNK)])
        for start in range(0, len(order), self.batch_size):
            end = start + self.batch_size
            yield inputs[start:end], labels[start:end]


class DeviceBatches:
    """Fixed batches of tensors already on the device (the test shard): no shuffle, no copy."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
        self.inputs, self.labels, self.batch_size = inputs, labels, batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.labels), self.batch_size):
            end = start + self.batch_size
            yield self.inputs[start:end], self.labels[start:end]
