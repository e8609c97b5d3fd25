"""The device-resident data path: the same samples as the course's DataLoader, and augmentations
that do what torchvision's do, checked image by image."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dmls.config.spec import AugmentSpec
from dmls.data import device_resident
from dmls.data.device_resident import CROP_PADDING, BatchAugment, DeviceLoader, sampler_order

CPU = torch.device("cpu")


def augment(**on) -> AugmentSpec:
    return AugmentSpec(
        **({"random_crop": False, "horizontal_flip": False, "color_jitter": 0.0,
            "rotation_degrees": 0.0} | on)
    )  # fmt: skip


def identity_stats(channels: int) -> tuple[list[float], list[float]]:
    return [0.0] * channels, [1.0] * channels  # normalisation off: outputs stay in [0, 1]


@pytest.mark.parametrize("world, drop_last", [(1, False), (2, False), (3, True)])
def test_each_rank_gets_the_samples_of_the_course_dataloader_in_its_order(world, drop_last):
    n, batch = 103, 8
    inputs, labels = torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n)
    for rank in range(world):
        for epoch in (0, 1):
            ours = DeviceLoader(
                inputs, labels, DistributedSampler(range(n), world, rank, seed=7), batch,
                drop_last, transform=None,
            )  # fmt: skip
            theirs = DataLoader(
                TensorDataset(inputs, labels), batch_size=batch, drop_last=drop_last,
                sampler=DistributedSampler(range(n), world, rank, seed=7),
            )  # fmt: skip
            ours.set_epoch(epoch)
            theirs.sampler.set_epoch(epoch)
            got, want = list(ours), list(theirs)
            assert len(ours) == len(theirs) == len(got) == len(want)
            for (x, y), (x_ref, y_ref) in zip(got, want, strict=True):
                assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_without_augmentation_images_are_only_standardised():
    images = torch.randint(0, 256, (5, 3, 6, 6), dtype=torch.uint8)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    out = BatchAugment(augment(), mean, std, CPU)(images)
    expected = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(
        std
    ).view(1, 3, 1, 1)
    torch.testing.assert_close(out, expected)


def crops_of(image: torch.Tensor) -> list[tuple[int, int, bool, torch.Tensor]]:
    """Every (dy, dx, flipped) crop torchvision's RandomCrop(padding=4) + flip can produce."""
    _, h, w = image.shape
    padded = F.pad(image, (CROP_PADDING,) * 4)
    found = []
    for dy in range(2 * CROP_PADDING + 1):
        for dx in range(2 * CROP_PADDING + 1):
            crop = padded[:, dy : dy + h, dx : dx + w]
            found += [(dy, dx, False, crop), (dy, dx, True, crop.flip(-1))]
    return found


def test_crop_and_flip_give_each_image_its_own_torchvision_crop():
    torch.manual_seed(0)
    n = 200
    # Distinct random pixels: a crop of one image matches exactly one (offset, flip).
    images = torch.randint(1, 256, (n, 2, 8, 8), dtype=torch.uint8)
    out = BatchAugment(augment(random_crop=True, horizontal_flip=True), *identity_stats(2), CPU)(
        images
    )
    params = set()
    for image, result in zip(images.float() / 255, out, strict=True):
        matches = [(dy, dx, f) for dy, dx, f, c in crops_of(image) if torch.equal(c, result)]
        assert len(matches) == 1, "each output is exactly one crop of its own image"
        params.add(matches[0])
    flips = sum(f for _, _, f in params)
    # Different images draw different parameters: most of the 162 combinations appear, and
    # about half the draws are flipped.
    assert len(params) > 60 and 0.3 < flips / len(params) < 0.7


def test_colour_jitter_scales_a_grey_image_by_a_brightness_factor_in_range():
    torch.manual_seed(0)
    strength, n = 0.4, 500
    grey = torch.full((n, 3, 4, 4), 100, dtype=torch.uint8)
    out = BatchAugment(augment(color_jitter=strength), *identity_stats(3), CPU)(grey)
    # Contrast and saturation leave a flat grey image alone; brightness scales it.
    per_image = out.flatten(1)
    assert torch.allclose(per_image, per_image[:, :1].expand_as(per_image))
    factors = per_image[:, 0] / (100 / 255)
    assert factors.min() >= 1 - strength - 1e-6 and factors.max() <= 1 + strength + 1e-6
    assert factors.std() > 0.1  # drawn per image, not once per batch


def test_rotation_turns_each_image_about_its_centre_within_the_range():
    torch.manual_seed(0)
    n, size, degrees = 300, 9, 30.0
    image = torch.zeros(size, size, dtype=torch.uint8)
    image[4, 4] = 255  # the centre: stays where it is
    image[4, 8] = 200  # on the right edge's midpoint: swings up or down with the angle
    out = BatchAugment(augment(rotation_degrees=degrees), *identity_stats(1), CPU)(
        image.expand(n, 1, size, size).contiguous()
    )
    assert torch.all(out[:, 0, 4, 4] == 1.0)
    rows = [int(torch.nonzero(o[0] == 200 / 255)[0, 0]) for o in out if (o[0] == 200 / 255).any()]
    # A point at radius 4 rotated by at most 30° moves at most 4·sin(30°) = 2 rows.
    assert rows and max(abs(r - 4) for r in rows) <= math.ceil(4 * math.sin(math.radians(degrees)))
    assert len(set(rows)) >= 3  # angles differ between images


def test_rotation_samples_on_affine_grids_grid_without_a_matrix_multiply(monkeypatch):
    """affine_grid's batched GEMM allocated cuBLAS's workspace before training's first step, so
    the rotating runs measured 32 MiB less GPU memory a step adds (bench/rotation_workspace.py):
    the grid is now elementwise, the same grid and so the same images."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 11, 13), dtype=torch.uint8)
    rotate = BatchAugment(augment(rotation_degrees=25.0), *identity_stats(3), CPU)
    grids = []
    sample = torch.nn.functional.grid_sample

    def recording(x: torch.Tensor, grid: torch.Tensor, **kw) -> torch.Tensor:
        grids.append(grid)
        return sample(x, grid, **kw)

    monkeypatch.setattr(device_resident.F, "grid_sample", recording)
    torch.manual_seed(1)
    ours = rotate(images)
    torch.manual_seed(1)
    angle = torch.empty(64).uniform_(-math.radians(25.0), math.radians(25.0))
    cos, sin, zero = angle.cos(), angle.sin(), torch.zeros(64)
    theta = torch.stack([cos, -sin, zero, sin, cos, zero], dim=1).view(64, 2, 3)
    theirs = torch.nn.functional.affine_grid(theta, [64, 3, 11, 13], align_corners=False)
    assert torch.allclose(grids[0], theirs, atol=1e-6)
    expected = sample(images.float() / 255, theirs, mode="nearest", padding_mode="zeros",
                      align_corners=False)  # fmt: skip
    assert (ours != expected).float().mean() < 1e-3  # (a rounding may pick a neighbour)


def test_the_epoch_is_transformed_in_chunks_without_changing_any_batch(monkeypatch):

    monkeypatch.setattr(device_resident, "EPOCH_CHUNK", 5)  # chunk edges inside batches
    n, batch = 23, 4
    images = torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.2, 0.2]
    ours = DeviceLoader(
        images, torch.arange(n), DistributedSampler(range(n), 1, 0, seed=3), batch, False,
        BatchAugment(augment(), mean, std, CPU),
    )  # fmt: skip
    normalised = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(
        std
    ).view(1, 3, 1, 1)
    theirs = DataLoader(
        TensorDataset(normalised, torch.arange(n)), batch_size=batch,
        sampler=DistributedSampler(range(n), 1, 0, seed=3),
    )  # fmt: skip
    got, want = list(ours), list(theirs)
    assert [len(y) for _, y in got] == [4, 4, 4, 4, 4, 3]
    for (x, y), (x_ref, y_ref) in zip(got, want, strict=True):
        torch.testing.assert_close(x, x_ref)
        assert torch.equal(y, y_ref)


@pytest.mark.parametrize("n, world", [(103, 1), (103, 2), (103, 4), (2, 5), (7, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_the_epoch_order_tensor_is_the_samplers_own_order(n, world, shuffle, drop_last):
    # (2, 5): fewer samples than ranks, so DistributedSampler pads by repeating the order.
    for rank in range(world):
        sampler = DistributedSampler(range(n), world, rank, shuffle, seed=11, drop_last=drop_last)
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            assert sampler_order(sampler).tolist() == list(sampler)
