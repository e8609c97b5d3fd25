"""What the config tells of a run's training set before any file is read: its size, where the
config fixes it, and the batches that size can't fill.

The engine refuses, once it has read the data, a step's batch larger than the training set and
a gradient-accumulation group larger than an epoch (training/trainer.py `_check_batches`), and a
validation split that leaves less than a batch (data/loaders.py `_splits`). Here the same rules
are applied before any job, where the size is known without reading a file: a synthetic set's
`n_train`, a published set whose files a checksum fixes, or a run's own `train_samples` (which
caps it). The user's own files (`data.tabular.dir`, a Fashion-MNIST folder of one's own, a
CIFAR-10 archive of another MD5) are known only once read: their runs are checked in the job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The published training sets: CIFAR-10's archive is read only when it has data.cifar10.md5 (the
# official archive's by default), and Debian's dataset-fashion-mnist and torchvision's download
# are the published IDX files.
PUBLISHED_TRAIN_SAMPLES = {"cifar10": 50_000, "fashion_mnist": 60_000}
PUBLISHED_TEST_SAMPLES = {"cifar10": 10_000, "fashion_mnist": 10_000}
# What the engine's own refusals add: they come from a job, where the config check could not.
FOUND_IN_THE_JOB = "found in the job: this data's size is known only once it is read"


def known_train_samples(
    dataset: str, data: Mapping[str, Any], schema: Mapping[str, Any]
) -> tuple[int, str] | None:
    """The training samples `dataset` has under config `data` (the schema's defaults where a
    key is absent, as dmls.data.datasets reads it) and where that number comes from, when the
    config fixes it; None where only reading the data tells."""
    node = schema["properties"]["data"]["properties"][dataset]
    cfg, defaults = data.get(dataset) or {}, node.get("properties", {})
    if dataset == "synthetic_cifar":
        return cfg.get("n_train", node["default"]["n_train"]), "data.synthetic_cifar.n_train"
    if dataset == "tabular":
        if cfg.get("dir"):
            return None
        synthetic = cfg.get("synthetic") or {}
        size = synthetic.get("n_train", defaults["synthetic"]["default"]["n_train"])
        return size, "data.tabular.synthetic.n_train"
    if dataset == "cifar10":
        official = defaults["md5"]["default"]
        if cfg.get("md5", official) == official:
            source = "CIFAR-10's published set, as data.cifar10.md5 fixes it"
            return PUBLISHED_TRAIN_SAMPLES[dataset], source
    # Fashion-MNIST with no folder of one's own: Debian's package or the download.
    if dataset == "fashion_mnist" and not cfg.get("debian_dir"):
        return PUBLISHED_TRAIN_SAMPLES[dataset], "Fashion-MNIST's published set"
    return None  # the user's own files, of any size


def known_test_samples(
    dataset: str, data: Mapping[str, Any], schema: Mapping[str, Any]
) -> int | None:
    """The test samples `dataset` has under config `data`, where the config fixes them (as
    `known_train_samples` decides it); None where only reading the data tells."""
    if known_train_samples(dataset, data, schema) is None:
        return None
    node = schema["properties"]["data"]["properties"][dataset]
    cfg, defaults = data.get(dataset) or {}, node.get("properties", {})
    if dataset == "synthetic_cifar":
        return cfg.get("n_test", node["default"]["n_test"])
    if dataset == "tabular":
        synthetic = cfg.get("synthetic") or {}
        return synthetic.get("n_test", defaults["synthetic"]["default"]["n_test"])
    return PUBLISHED_TEST_SAMPLES[dataset]


def epoch_samples(
    spec: Any, data: Mapping[str, Any], schema: Mapping[str, Any]
) -> tuple[int, str, str] | None:
    """The samples run `spec` trains on each epoch, where the config fixes them: the engine
    trains on the first `train_samples` of what the validation split leaves. With where that
    number comes from, and "has" where it is the set's size or "has at most" where
    `train_samples` alone caps a set of unknown size; None where only reading the data tells."""
    known = known_train_samples(spec.dataset, data, schema)
    n, how, has = None, "", "has at most"
    if known is not None:
        n, how, has = known[0], known[1], "has"
        if held_out := spec.validation_samples:
            n, how = n - held_out, f"{how}; validation_samples holds out {held_out} more"
    if spec.train_samples and (n is None or spec.train_samples < n):
        n, how = spec.train_samples, "train_samples"
    return None if n is None else (n, how, has)


def problems(spec: Any, data: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The engine's refusal of run `spec`'s batch (a dmls.config.spec.RunSpec, which imports
    this module), made before any job where the config fixes the training set's size or
    `train_samples` caps it: a line naming the key, its value and the samples; none where the
    size is known only once the data is read (the module's doc)."""
    where = f"studies.{spec.study}.runs.{spec.run}"
    step = spec.batch_size * spec.replicas  # as the engine counts a step's samples
    known = known_train_samples(spec.dataset, data, schema)
    held_out = spec.validation_samples
    if known is not None and step <= known[0] < step + held_out:
        # The split leaves less than a step (a batch above the whole set is named as such).
        total, source = known
        return [
            f"{where}.validation_samples: {held_out} of the {total} training samples ({source}) "
            f"held out leave {max(total - held_out, 0)} to train, fewer than one step's batch "
            f"of {step}; use at most {total - step}"
        ]
    sized = epoch_samples(spec, data, schema)
    if sized is None:
        return []
    n, how, has = sized
    if known is not None and step > known[0] and n == known[0] - held_out:
        n, how = known  # the batch exceeds even the whole set: name the whole set
    if step > n:
        return [
            f"{where}.batch_size: {spec.batch_size} per replica × {spec.replicas} replica(s) = "
            f"{step} samples per step, but the training set {has} {n} ({how}); use at most "
            f"{n // spec.replicas}"
        ]
    # Each rank's epoch has ceil(n / step) micro-batches, fewer where a last batch is dropped.
    micro_batches = math.ceil(n / step)
    if spec.grad_accum_steps > micro_batches:
        return [
            f"{where}.grad_accum_steps: {spec.grad_accum_steps} micro-batches per optimizer "
            f"step, but an epoch has at most {micro_batches} per rank: the training set {has} "
            f"{n} ({how}), in micro-batches of {step} over all replicas; use at most "
            f"{micro_batches}"
        ]
    return []
