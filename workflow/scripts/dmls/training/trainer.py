"""One rank's training of one seed, the same loop for every run: single process, DataParallel,
DDP or FSDP under torchrun, accelerate.

`Trainer` builds the seed's data, model, optimizer and step once, then `fit` runs the epochs,
checkpointing after each. What differs between launchers lives in the strategy
(training/parallel.py) and how a step runs in the step object (training/steps.py), both chosen
once at setup; the epoch loop below is the same code for every run, so studies compare like
with like. The job around it (its seeds, process group and result) is training/job.py.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dmls.config import data_sizes
from dmls.config.spec import RunSpec, SpecError
from dmls.data.loaders import make_loaders
from dmls.training import checkpoint, energy
from dmls.training.faults import Drill
from dmls.training.models import build_model, describe
from dmls.training.optimizers import make_scheduler
from dmls.training.parallel import Process, SingleDevice
from dmls.training.precision import Autocast, PrecisionProbe, convert_to_float8
from dmls.training.results import StepMemory
from dmls.training.steps import build_step, eager_reason, on_stream


@dataclass
class Progress:
    """Where a run stands after its last finished epoch (what a checkpoint resumes)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_val_loss: float = math.inf
    best_epoch: int | None = None  # the epoch of `best_val_loss` (None before any)
    epochs_since_best: int = 0
    stopped_early_epoch: int | None = None

    @property
    def epoch(self) -> int:
        """Epochs finished."""
        return len(self.history)


class Trainer:
    """The epoch loop of one rank, built once from the spec."""

    model: nn.Module  # built by `_build_model`

    def __init__(
        self,
        spec: RunSpec,
        strategy: SingleDevice,
        process: Process,
        data_dir: Path,
        *,
        fused_optimizer: bool | None = None,
        meter: energy.EnergyMeter | None = None,
    ) -> None:
        """`fused_optimizer` overrides the choice of the optimizer's kernels (by default fused
        with the fast step, as the course's code without it): D4 steps eagerly, as sharded
        strategies must, yet compares their memory without foreach's temporaries. With a
        `meter` (the same on every rank: energy.agree), each epoch records the joules its
        training and evaluation drew on all ranks' GPUs."""
        self.spec, self.strategy, self.process = spec, strategy, process
        self.meter = meter
        self.checkpoints = checkpoint.Writer()  # the epochs' checkpoints, written meanwhile
        # Early stopping goes back to the weights of the lowest validation loss: rank 0 keeps
        # a copy of them (the whole model's, on the CPU), and its checkpoints keep it too.
        self.keeps_best = bool(spec.early_stopping_patience)
        self.best_model: dict[str, torch.Tensor] | None = None
        device = process.device
        # Every generator from the seed first: a seed trained after others in the same process
        # draws exactly what it would draw in a job of its own (its data order, augmentation,
        # DataLoader workers' seeds).
        seed_everything(spec.seed)
        drill = Drill.from_env(spec.run_id, process.rank, spec.seed)
        # The fast step on a GPU (`step: graph|compile`); `step: eager` is the course's code.
        fast = device.type == "cuda" and spec.step != "eager"
        # channels_last: cuDNN's convolutions run NHWC natively; NCHW costs a transpose each.
        images = spec.model.name in ("cnn", "lenet5") and strategy.channels_last
        self.memory_format = torch.channels_last if fast and images else torch.contiguous_format
        torch.backends.cudnn.benchmark = fast and strategy.cudnn_autotune
        self._load_data(data_dir)
        self._check_batches()
        self._build_model()
        # Sharded before the optimizer sees the parameters: FSDP2 replaces them by shards.
        self.model = strategy.shard(self.model)
        fused = fast if fused_optimizer is None else fused_optimizer
        optimizer, scheduler = self._build_optimizer(fused)
        self._build_step(optimizer, scheduler, drill)

    def _load_data(self, data_dir: Path) -> None:
        """This rank's loaders, and the measure of its GPUs' memory over their steps."""
        spec, strategy, process = self.spec, self.strategy, self.process
        # BatchNorm1d needs more than one value per channel in training: B's MLP can't train on
        # a last batch of one sample (per device).
        feature_batch_norm = spec.model.name == "mlp" and spec.model.batch_norm
        self.data = make_loaders(
            spec,
            data_dir,
            rank=process.rank,
            world_size=process.world_size,
            device=process.device,
            samples_per_step=strategy.samples_per_step,
            memory_format=self.memory_format,
            devices_per_step=strategy.samples_per_step // spec.batch_size,
            min_samples_per_device=2 if feature_batch_norm else 1,
        )
        self.memory = StepMemory(strategy.gpu_indices(), len(self.data.train))
        if self.data.unseen_reason and process.is_main:
            print(
                f"{self.data.unseen_per_epoch} training sample(s) left out of each epoch "
                f"(no rank sees them): {self.data.unseen_reason}",
                flush=True,
            )

    def _check_batches(self) -> None:
        """SpecError when the data can't fill the batch or the accumulation the spec records."""
        spec, data = self.spec, self.data
        step_samples = spec.batch_size * spec.replicas
        if step_samples > data.n_train:
            # Else the one batch an epoch has is the data, and the batch recorded is not it.
            n_validation = data.n_validation
            held_out = (
                f" (validation_samples holds out {n_validation} more)" if n_validation else ""
            )
            raise SpecError(
                f"studies.{spec.study}.runs.{spec.run}.batch_size: {spec.batch_size} per replica "
                f"× {spec.replicas} replica(s) = {step_samples} samples per step, but the "
                f"training set has {data.n_train}{held_out}; use at most "
                f"{data.n_train // spec.replicas} ({data_sizes.FOUND_IN_THE_JOB})"
            )
        micro_batches = len(data.train)
        if spec.grad_accum_steps > micro_batches:
            # Else every optimizer step would see fewer samples than the global batch recorded.
            raise SpecError(
                f"studies.{spec.study}.runs.{spec.run}.grad_accum_steps: {spec.grad_accum_steps}"
                f" micro-batches per optimizer step, but an epoch has {micro_batches} per rank "
                f"({data.n_train} samples, {self.strategy.samples_per_step} per micro-batch); "
                f"use at most {micro_batches} ({data_sizes.FOUND_IN_THE_JOB})"
            )

    def _build_model(self) -> None:
        """The model from the seed, on this rank's device, its Linear layers in fp8 where the
        strategy converts them, with the probe of the precision its first layer produces."""
        torch.manual_seed(self.spec.seed)  # identical initial weights on every rank
        manifest = self.data.manifest
        self.model = build_model(self.spec.model, manifest["input_shape"], manifest["num_classes"])
        self.model.to(  # type: ignore[call-overload]  # takes both; the stub's overloads don't
            self.process.device, memory_format=self.memory_format
        )
        self.fp8_linear_layers = (
            convert_to_float8(self.model) if self.strategy.converts_to_float8 else 0
        )
        self.probe = PrecisionProbe(self.model)
        if self.fp8_linear_layers:
            # An fp8 GEMM returns the dtype of its input, so the hook can't see it: say so here.
            self.probe.seen.add("fp8")

    def _build_optimizer(self, fused: bool) -> tuple[Any, Any]:
        """The strategy's optimizer over the (sharded) model's parameters, and the spec's
        learning-rate schedule over its optimizer steps (None without one)."""
        optimizer = self.strategy.make_optimizer(self.model.parameters(), fused=fused)
        steps_per_epoch = math.ceil(len(self.data.train) / self.spec.grad_accum_steps)
        return optimizer, make_scheduler(self.spec, optimizer, steps_per_epoch)

    def _build_step(self, optimizer: Any, scheduler: Any, drill: Drill | None) -> None:
        """The strategy's module, optimizer and scheduler, and the step that trains them: from
        a CUDA graph captured on a side stream, or eagerly for the reason `eager_reason` gives."""
        spec, strategy, device = self.spec, self.strategy, self.process.device
        reason = eager_reason(spec, strategy, device, fault_drill=drill is not None)
        # Graphs are captured on a side stream, and DDP must be built on the stream it runs on.
        stream = torch.cuda.Stream(device) if reason is None else None
        self.autocast = Autocast(device.type, strategy.autocast_dtype, cache_enabled=stream is None)
        self.stream, self.drill = stream, drill
        with on_stream(stream):
            self.module, self.optimizer, self.scheduler = strategy.prepare(
                self.model, optimizer, scheduler
            )
            self.step = build_step(
                spec,
                stream=stream,
                reason=reason,
                drill=drill,
                module=self.module,
                strategy=strategy,
                optimizer=self.optimizer,
                autocast=self.autocast,
                criterion=nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing),
                device=device,
            )

    # -- epochs
    def train_epoch(self, epoch: int) -> tuple[float, float]:
        with on_stream(self.stream):
            return self._train_epoch(epoch)

    def _train_epoch(self, epoch: int) -> tuple[float, float]:
        self.module.train()
        self.data.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        k, n = self.spec.grad_accum_steps, len(self.data.train)
        tail_start = n - n % k  # the last group may hold fewer than k micro-batches
        if self.drill is not None:
            # A drill's run resumes from the epoch before, whatever the disk's speed.
            self.checkpoints.flush()
            self.drill.start_epoch(epoch + 1, n)
        self.step.sums.zero_()
        for i, (x, y) in enumerate(self._progress(self.data.train, epoch)):
            x, y = self.to_device(x, y)
            last_micro = (i + 1) % k == 0 or i + 1 == n
            with self.memory.step():
                # Accumulation (nanoGPT's recipe): the loss of each of a group's micro-batches
                # is divided by the group's size, and only its last micro-step all-reduces.
                self.step(x, y, sync=last_micro, divisor=k if i < tail_start else n - tail_start)
                if last_micro:
                    self.optimizer_step()
        self.memory.epoch_end()
        loss_sum, correct, count = self.process.all_reduce_sum(self.step.sums).tolist()
        return loss_sum / count, correct / count

    def optimizer_step(self) -> None:
        self.strategy.optimizer_step(self.optimizer)
        self.step.after_optimizer_step()
        if self.scheduler is not None:
            self.scheduler.step()

    @torch.no_grad()
    def evaluate(self, split: str = "test") -> tuple[float, float]:
        """Loss and accuracy on the `split` set ("test" or "validation"), over all ranks."""
        batches, expected = (
            (self.data.validation, self.data.n_validation)
            if split == "validation"
            else (self.data.test, self.data.n_test)
        )
        self.module.eval()
        plain = nn.CrossEntropyLoss(reduction="sum")  # the loss without label smoothing
        sums = torch.zeros(3, device=self.process.device, dtype=torch.float64)
        for x, y in batches:
            x, y = self.to_device(x, y)
            with self.autocast():
                logits = self.module(x)
            sums[0] += plain(logits.float(), y).double()
            sums[1] += (logits.argmax(1) == y).sum()
            sums[2] += len(y)
        loss_sum, correct, count = self.process.all_reduce_sum(sums).tolist()
        if int(count) != expected:
            raise RuntimeError(f"evaluated {int(count)} {split} samples, expected {expected}")
        return loss_sum / count, correct / count

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on the training device (a no-op for `loader: device`)."""
        device = self.process.device
        x = x.to(device, non_blocking=True).contiguous(memory_format=self.memory_format)
        return x, y.to(device, non_blocking=True)

    def _progress(self, loader, epoch: int) -> Iterator:
        if not self.process.is_main:
            return iter(loader)
        return tqdm(
            loader,
            desc=f"epoch {epoch + 1}/{self.spec.epochs}",
            file=sys.stderr,
            mininterval=5.0,
            ascii=True,
            leave=True,  # the final 100% line stays in the log
        )

    def synchronize(self) -> None:
        """Wait for the device, so that a time taken next covers the work queued before."""
        if self.process.device.type == "cuda":
            torch.cuda.synchronize(self.process.device)

    def fit(self, checkpoint_path: Path) -> dict[str, Any]:
        """Train the remaining epochs (all of them, unless a checkpoint of this spec exists),
        checkpointing after each (`checkpoint.Writer`: the last one is on disk when this
        returns, or raises).

        When early stopping fires, the model goes back to the weights of the epoch with the
        lowest validation loss (Keras's `restore_best_weights`), on every rank, and the
        outcome's `restored_best` holds that epoch and its numbers measured again
        (`_restore_best`). A run that reaches its last epoch, or diverges, keeps its last
        weights, and `restored_best` is None."""
        progress = self._resume(checkpoint_path)
        resumed_from_epoch = progress.epoch
        try:
            outcome = self._epochs(progress, checkpoint_path)
            restored = self._restore_best(progress) if progress.stopped_early_epoch else None
        except BaseException:
            # The last finished epoch's checkpoint still lands: a rerun resumes from it.
            with contextlib.suppress(Exception):
                self.checkpoints.flush()
            raise
        t = time.perf_counter()
        self.checkpoints.flush()  # the last epoch's, before the seed's end replaces it
        outcome["checkpoint_time_s"] += time.perf_counter() - t
        return outcome | {
            "history": progress.history,
            "stopped_early_epoch": progress.stopped_early_epoch,
            "restored_best": restored,
            "resumed_from_epoch": resumed_from_epoch,
        }

    def _epochs(self, progress: Progress, checkpoint_path: Path) -> dict[str, Any]:
        """Train and evaluate epochs, each followed by its checkpoint, until the spec's last,
        early stopping (on the validation loss only) or a non-finite loss."""
        spec = self.spec
        status, reason, diverged_epoch = "ok", None, None
        checkpoint_time = 0.0
        while progress.epoch < spec.epochs and not progress.stopped_early_epoch:
            epoch = progress.epoch
            self.synchronize()
            t0, j0 = time.perf_counter(), self._joules()
            train_loss, train_acc = self.train_epoch(epoch)
            self.synchronize()
            t1, j1 = time.perf_counter(), self._joules()
            val = self.evaluate("validation") if self.data.validation is not None else None
            test_loss, test_acc = self.evaluate()
            self.synchronize()
            t2, j2 = time.perf_counter(), self._joules()
            progress.history.append(
                {"epoch": epoch + 1, "train_loss": train_loss, "train_accuracy": train_acc}
                | ({"val_loss": val[0], "val_accuracy": val[1]} if val else {})
                | {
                    "test_loss": test_loss,
                    "test_accuracy": test_acc,
                    "train_time_s": t1 - t0,
                    "eval_time_s": t2 - t1,
                    "lr": self.optimizer.param_groups[0]["lr"],
                }
                | self._epoch_energy(j1 - j0, j2 - j1)
            )
            losses = {"train": train_loss} | ({"val": val[0]} if val else {}) | {"test": test_loss}
            if self.process.is_main:
                val_line = f"val loss {val[0]:.4f} acc {val[1]:.4f}  " if val else ""
                print(
                    f"epoch {epoch + 1}/{spec.epochs}  train loss {train_loss:.4f} "
                    f"acc {train_acc:.4f}  {val_line}test loss {test_loss:.4f} "
                    f"acc {test_acc:.4f}  {t1 - t0:.2f} s",
                    flush=True,
                )
            # The losses are reduced over ranks, so every rank stops at the same epoch.
            if not all(map(math.isfinite, losses.values())):
                status, diverged_epoch = "diverged", epoch + 1
                said = ", ".join(f"{name} {loss}" for name, loss in losses.items())
                reason = f"non-finite loss at epoch {epoch + 1} ({said})"
                break
            # Model selection reads the validation split only, never the test set.
            if val is not None:
                if val[0] < progress.best_val_loss:
                    progress.best_val_loss, progress.epochs_since_best = val[0], 0
                    progress.best_epoch = epoch + 1
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
            "diverged_epoch": diverged_epoch,
        }

    def _joules(self) -> float:
        return self.meter.joules() if self.meter is not None else 0.0

    def _epoch_energy(self, train_j: float, eval_j: float) -> dict[str, float]:
        """An epoch's joules in training and in evaluation, summed over the ranks (outside
        the timed windows); {} without a meter."""
        if self.meter is None:
            return {}
        joules = torch.tensor([train_j, eval_j], dtype=torch.float64, device=self.process.device)
        train_j, eval_j = self.process.all_reduce_sum(joules).tolist()
        return {"train_energy_j": train_j, "eval_energy_j": eval_j}

    # -- the best weights, which early stopping goes back to
    def _restore_best(self, progress: Progress) -> dict[str, Any]:
        """Load the weights of the epoch with the lowest validation loss (`best_model`, rank
        0's copy, sent to every rank so that the ranks stay identical) back into the model,
        and measure them again on the validation and test sets: that epoch and its numbers.
        Evaluation is deterministic, so they are that epoch's history row; a difference is
        said in the log."""
        if progress.best_epoch is None or (self.process.is_main and not self.best_model):
            raise RuntimeError(
                f"early stopping at epoch {progress.stopped_early_epoch} found no best weights"
            )
        best = self.process.gather(self.best_model if self.process.is_main else None)[0]
        self.strategy.load_model_state(self.model, best)
        val_loss, val_acc = self.evaluate("validation")
        test_loss, test_acc = self.evaluate()
        measured = {
            "val_loss": val_loss, "val_accuracy": val_acc,
            "test_loss": test_loss, "test_accuracy": test_acc,
        }  # fmt: skip
        epoch = progress.best_epoch
        row = progress.history[epoch - 1]
        note = f"early stopping: restored the weights of epoch {epoch}, the lowest validation loss"
        if differ := ", ".join(f"{k} {v} ({row[k]})" for k, v in measured.items() if v != row[k]):
            note += f"; measured again, they differ from that epoch's (in brackets): {differ}"
        if self.process.is_main:
            print(note, flush=True)
        return {"epoch": epoch} | measured

    # -- checkpoints (training/checkpoint.py says what they hold and why)
    def _save_checkpoint(self, path: Path, progress: Progress) -> None:
        rng = self.process.gather(checkpoint.rng_state(self.process.device))
        # Every rank takes part: a sharded strategy gathers the state onto rank 0.
        model, optimizer = self.model_state(), self.strategy.optimizer_state(self.optimizer)
        if not self.process.is_main:
            return
        if self.keeps_best and progress.best_epoch == progress.epoch:
            # A copy: on a CPU device the state's tensors are the model's own.
            self.best_model = {name: t.detach().clone() for name, t in model.items()}
        scaler = self.strategy.loss_scaler
        state = {
            "epoch": progress.epoch,
            "progress": asdict(progress),
            "model": model,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "precisions": sorted(self.probe.seen),
            "rng": rng,
        } | ({"best_model": self.best_model} if self.keeps_best else {})
        self.checkpoints.submit(path, self._checkpoint_identity(), state)

    def _resume(self, path: Path) -> Progress:
        state, note = checkpoint.load(
            path, self._checkpoint_identity(), set_aside=self.process.is_main
        )
        if state is not None and self.keeps_best and "best_model" not in state:
            # Written before checkpoints kept them: the run could not go back to its best.
            state = None
            note = (
                f"ignoring checkpoint {path}: it holds no best weights for early stopping to go "
                "back to (written before checkpoints kept them); starting from epoch 1"
            )
        if self.process.is_main:
            print(note, flush=True)
        if state is None:
            return Progress()
        if self.process.is_main:  # (every rank reads the file; rank 0 keeps the best weights)
            self.best_model = state.get("best_model")
        self.strategy.load_model_state(self.model, state["model"])
        self.strategy.load_optimizer_state(self.optimizer, state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if (scaler := self.strategy.loss_scaler) is not None:
            scaler.load_state_dict(state["scaler"])
        self.probe.seen.update(state["precisions"])
        # Last: building the trainer above drew from the generators.
        checkpoint.set_rng_state(state["rng"][self.process.rank], self.process.device)
        return Progress(**state["progress"])

    def _checkpoint_identity(self) -> dict[str, str]:
        return checkpoint.identity(self.spec, self.data.manifest)

    def layers(self) -> list[dict[str, Any]]:
        """The model layer by layer as it ran (models.describe: kinds, output shapes, own
        parameters), for the record."""
        manifest = self.data.manifest
        return describe(self.spec.model, manifest["input_shape"], manifest["num_classes"])

    def model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 (every rank calls it; the others get {})."""
        return self.strategy.model_state(self.model)

    def save_finished(self, path: Path, state: dict[str, Any]) -> None:
        """Replace the seed's last epoch checkpoint by its end: weights and result (rank 0)."""
        checkpoint.save(path, self._checkpoint_identity(), state)

    def release(self) -> None:
        """Free what this seed's trainer holds on the devices (CUDA graphs, loaders)."""
        self.step.release()
        self.checkpoints.close()
        del self.module, self.optimizer, self.scheduler, self.model, self.data

    def step_record(self) -> dict[str, Any]:
        """How the training steps really ran: replayed from a CUDA graph, or eagerly and why."""
        channels_last = self.memory_format == torch.channels_last
        return {
            "requested": self.spec.step,
            "compiled": self.step.compiled,
            "memory_format": "channels_last" if channels_last else "contiguous",
            "wrapper": self.strategy.wrapper(),
        } | self.step.record()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # the CPU's and every CUDA device's
