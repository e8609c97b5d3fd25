"""How a run does data parallelism: one class per way, chosen once from the spec's launcher.

| launcher     | sharding  | strategy                   | ranks × GPUs | gradients averaged by     |
|--------------|-----------|----------------------------|--------------|---------------------------|
| `single`     |           | `SingleDevice`             | 1 × 1        | (nothing to average)      |
| `dp`         |           | `DataParallel`             | 1 × N        | summing onto GPU 0        |
| `torchrun`   | none      | `DistributedDataParallel`  | N × 1        | DDP's bucketed all-reduce |
| `torchrun`   | optimizer | `ShardedOptimizer`         | N × 1        | DDP's bucketed all-reduce |
| `torchrun`   | gradients | `FullyShardedDataParallel` | N × 1        | FSDP2's reduce-scatter    |
| `torchrun`   | full      | `FullyShardedDataParallel` | N × 1        | FSDP2's reduce-scatter    |
| `accelerate` |           | `Accelerate`               | N × 1        | the DDP accelerate builds |

A strategy joins the process group the launcher prepared (`join`), places the model's
parameters as it keeps them (`shard`) and builds the optimizer over them (`make_optimizer`),
wraps the model (`prepare`), runs the backward (`backward`), skips the gradient sync on the
micro-steps before an optimizer step (`no_sync`), steps the optimizer with its loss scaler
(`optimizer_step`), says why a CUDA graph can't capture its step (`capture_blockers`), and
gives and takes the whole model's and optimizer's state for checkpoints (`model_state`,
`optimizer_state` and their `load_*`: every rank calls them, rank 0 gets the state; a sharded
strategy gathers it there). The trainer calls only these, so it reads the same for every
launcher; outside this module only launch.py (the commands) and the spec (what the torch-free
side needs) look at the launcher. torchrun's strategies share `Distributed` (joining the process
group torchrun prepared): DDP (with ZeRO-1 on it) and FSDP2 are each a strategy of their own.
DataParallel's persistent replicas and threads are in training/threaded_dp.py.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
import torch.distributed as dist
from torch import nn

from dmls.config.spec import RunSpec
from dmls.training.models import shard_units
from dmls.training.optimizers import make_optimizer, optimizer_recipe
from dmls.training.threaded_dp import ThreadedDataParallel

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# fp8 as torchao's float8 training runs: the eligible Linear layers' GEMMs in fp8
# (precision.convert_to_float8), everything else under bf16 autocast, so an fp8 run differs
# from a bf16 run in those GEMMs alone.
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class WorldSizeMismatch(RuntimeError):
    """The launcher started a different number of processes than the spec asks for."""


@dataclass
class Process:
    """Who this process is, from what torchrun / accelerate put in the environment."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device

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


class SingleDevice:
    """`launcher: single`: one process trains on one device, the course's baseline. The other
    strategies change only what differs from it."""

    launcher: ClassVar[str] = "single"
    # Eager steps before a CUDA graph is captured (steps.CapturedStep): the first steps
    # allocate, autotune and (compiled) compile.
    graph_warmup_steps: ClassVar[int] = 3
    # Fixed shapes: let cuDNN time its convolution algorithms once (the fast step only).
    cudnn_autotune: ClassVar[bool] = True
    # Whether the fast step may keep conv weights channels_last (FSDP2 shards only contiguous
    # parameters).
    channels_last: ClassVar[bool] = True

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.process: Process | None = None  # set by `join`
        self.module: nn.Module | None = None  # the prepared (wrapped) model
        self.scaler: torch.amp.GradScaler | None = None

    # -- processes
    def join(self) -> Process:
        """Join the process group the launcher prepared; check it is the one the spec asked
        for."""
        device = self._device(0)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return self._checked(Process(0, 0, 1, 0, device))

    def _checked(self, process: Process) -> Process:
        spec = self.spec
        self.process = process
        if process.world_size != spec.processes:
            # Cheap to check, expensive to miss: `accelerate launch --multi_gpu` on a CPU host
            # silently starts independent single-process trainings.
            raise WorldSizeMismatch(
                f"run {spec.run_id} asks for {spec.processes} process(es) "
                f"({spec.nodes} node(s) × {spec.nproc_per_node}) but the launcher started a "
                f"world of {process.world_size} (rank {process.rank})"
            )
        return process

    def _device(self, local_rank: int) -> torch.device:
        spec = self.spec
        use_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
        if use_cuda and not torch.cuda.is_available():
            raise RuntimeError(
                f"run {spec.run_id} asks for device 'cuda' but CUDA is not available"
            )
        return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    @staticmethod
    def _node_rank() -> int:
        return int(os.environ.get("GROUP_RANK", 0))

    def gpu_indices(self) -> list[int]:
        """The GPUs this process trains on."""
        assert self.process is not None  # joined (`join`) before any other call
        device = self.process.device
        return [device.index] if device.type == "cuda" else []

    def end_seed(self) -> None:
        """Let go of the seed's prepared model: the next seed prepares a fresh one."""
        self.module = self.scaler = None

    def close(self) -> None:
        """Leave the process group (after the step has freed what it held of it)."""
        assert self.process is not None  # joined
        self.process.close()

    # -- data
    @property
    def samples_per_step(self) -> int:
        """Samples one process takes per micro-step."""
        return self.spec.batch_size

    # -- precision: the engine's own (training/precision.py), unless the launcher applies it
    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES.get(self.spec.precision)

    @property
    def converts_to_float8(self) -> bool:
        """Whether the engine swaps Linear layers for torchao's fp8 ones."""
        return self.spec.precision == "fp8"

    @property
    def loss_scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler in use (fp16), whose state a checkpoint keeps; None when none is."""
        return self.scaler if self.scaler is not None and self.scaler.is_enabled() else None

    # -- the model and its step
    def shard(self, model: nn.Module) -> nn.Module:
        """The model with its parameters placed as this strategy keeps them, before the
        optimizer is built over them (FSDP2 replaces them by this rank's shards)."""
        return model

    def make_optimizer(self, params, fused: bool) -> torch.optim.Optimizer:
        """The spec's optimizer over `params` (training/optimizers.py)."""
        return make_optimizer(self.spec, params, fused)

    def prepare(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
    ) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        """The model as it trains (wrapped), and the optimizer and scheduler that step it."""
        fp16 = self.spec.precision == "fp16"
        assert self.process is not None  # joined
        self.scaler = torch.amp.GradScaler(self.process.device.type, enabled=fp16)
        self.module = self._wrap(model)
        self.wrapped = _wrapper_name(model, self.module)
        return self.module, optimizer, scheduler

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model

    def wrapper(self) -> str:
        """What the prepared model trains inside, for the record: the wrapper's class
        (DistributedDataParallel, DataParallel, ...), or "none" for the bare model. At one
        process accelerate leaves the model bare while torchrun's code wraps it in DDP, whose
        per-step all-reduce hooks double a step of B's small MLP (bench/b_alone.py). Its
        name, not the model: a seed's model must die with the seed."""
        return self.wrapped

    def no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce (the micro-steps before an optimizer step)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        assert self.scaler is not None  # set by `prepare`
        self.scaler.scale(loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.scaler is not None  # set by `prepare`
        self.scaler.step(optimizer)  # a plain step when the scaler is disabled
        self.scaler.update()

    def capture_blockers(self) -> list[str]:
        """Why this strategy's step can't be captured as a CUDA graph (none: it can)."""
        return []

    # -- checkpoints: every rank calls these; rank 0 gets the state, the others an empty dict
    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights, on the CPU."""
        assert self.process is not None  # joined
        if not self.process.is_main:
            return {}
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(state)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state, as a checkpoint keeps it."""
        assert self.process is not None  # joined
        return optimizer.state_dict() if self.process.is_main else {}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


class DataParallel(SingleDevice):
    """`launcher: dp`: nn.DataParallel, one process driving `nproc_per_node` GPUs. Each step it
    splits the batch, copies the model to every GPU and sums the gradients on GPU 0. With
    `replica_threads: persistent`, `ThreadedDataParallel` (training/threaded_dp.py): the
    same, its replicas and their threads kept from step to step."""

    launcher = "dp"
    # Not under DataParallel, which runs its replicas in new threads every step: with
    # autotuning on, its step took 111 ms instead of 7 (2× H100, torch 2.11), as if it were
    # tuned again each time.
    cudnn_autotune = False

    def gpu_indices(self) -> list[int]:
        assert self.process is not None  # joined
        cuda = self.process.device.type == "cuda"
        return list(range(self.spec.nproc_per_node)) if cuda else []

    @property
    def samples_per_step(self) -> int:
        # DataParallel splits one batch over its GPUs: batch_size is per GPU, as for DDP.
        return self.spec.batch_size * self.spec.nproc_per_node

    def _wrap(self, model: nn.Module) -> nn.Module:
        devices = list(range(self.spec.nproc_per_node))
        if self.spec.replica_threads == "persistent":
            return ThreadedDataParallel(model, device_ids=devices)
        return nn.DataParallel(model, device_ids=devices)

    def end_seed(self) -> None:
        if isinstance(self.module, ThreadedDataParallel):
            self.module.threads.close()
        super().end_seed()

    def capture_blockers(self) -> list[str]:
        return ["DataParallel copies the model to its GPUs from Python in every step"]


def _gloo_blocker(spec: RunSpec) -> list[str]:
    if spec.backend == "gloo" and spec.replicas > 1:
        return [
            "gloo all-reduces CUDA tensors through host memory, which a CUDA graph can't capture"
        ]
    return []


class Distributed(SingleDevice):
    """`launcher: torchrun`: one process per replica, started by torchrun, in the process group
    it prepared. What DDP and FSDP share; each says how it keeps the model and reduces its
    gradients."""

    launcher = "torchrun"

    def join(self) -> Process:
        if "RANK" not in os.environ:
            raise RuntimeError("launcher 'torchrun' but RANK is unset: start rank.py via torchrun")
        local_rank = int(os.environ["LOCAL_RANK"])
        device = self._device(local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=self.spec.backend,
            timeout=COLLECTIVE_TIMEOUT,
            # NCCL binds its communicator to this GPU (and barrier() knows which one to use).
            device_id=device if self.spec.backend == "nccl" else None,
        )
        process = Process(
            dist.get_rank(), local_rank, dist.get_world_size(), self._node_rank(), device
        )
        return self._checked(process)

    def capture_blockers(self) -> list[str]:
        return _gloo_blocker(self.spec)


class DistributedDataParallel(Distributed):
    """`sharding: none`: every rank keeps the whole model; DDP all-reduces the gradients in
    buckets while the backward still runs."""

    # DDP's first iterations log and rebuild its buckets.
    graph_warmup_steps = 11

    def _wrap(self, model: nn.Module) -> nn.Module:
        assert self.process is not None  # joined
        device = self.process.device
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        ddp = cast(nn.parallel.DistributedDataParallel, self.module)  # `_wrap`'s, by `prepare`
        return ddp.no_sync() if skip else contextlib.nullcontext()


class ShardedOptimizer(DistributedDataParallel):
    """`sharding: optimizer` (ZeRO-1): DDP as above, the optimizer a ZeroRedundancyOptimizer.
    Each rank keeps the optimizer state of its 1/N of the parameters and updates only those;
    then every rank broadcasts its updated parameters to the others. Gradients are still
    all-reduced whole."""

    def make_optimizer(self, params, fused: bool) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kwargs = optimizer_recipe(self.spec, fused)
        return ZeroRedundancyOptimizer(list(params), optimizer_class=cls, **kwargs)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        zero = cast("ZeroRedundancyOptimizer", optimizer)  # `make_optimizer`'s
        zero.consolidate_state_dict(to=0)  # a collective: the shards' states onto rank 0
        assert self.process is not None  # joined
        return optimizer.state_dict() if self.process.is_main else {}

    def capture_blockers(self) -> list[str]:
        return [
            "ZeroRedundancyOptimizer broadcasts the updated parameters from Python after each step",
            *super().capture_blockers(),
        ]


class FullyShardedDataParallel(Distributed):
    """`sharding: gradients | full`: FSDP2 (`fully_shard`) on each layer with parameters
    (models.shard_units), then on the whole model. Each rank keeps 1/N of every parameter,
    gradient and optimizer state; a layer's parameters are all-gathered before it runs and its
    gradients reduce-scattered after its backward. `gradients` (ZeRO-2) keeps the gathered
    parameters from the forward to the backward (reshard_after_forward=False); `full` (ZeRO-3)
    frees them after each layer's forward and gathers them again for its backward."""

    channels_last = False

    def shard(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The mesh of this run's device (FSDP2's default takes CUDA whenever the host has it).
        process = self.process
        assert process is not None  # joined
        mesh = init_device_mesh(process.device.type, (process.world_size,))
        reshard = self.spec.sharding == "full"
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model  # `shard` made it FSDP2's, in place

    def wrapper(self) -> str:
        return "fully_shard (FSDP2)"  # (in place: the model is its own wrapper)

    @contextlib.contextmanager
    def _unsynced(self):
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        return self._unsynced() if skip else contextlib.nullcontext()

    @staticmethod
    def _options(**kw: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        # The shards all-gathered onto rank 0's CPU (the others get an empty dict).
        state = get_model_state_dict(model, options=self._options(cpu_offload=True))
        return cast("dict[str, torch.Tensor]", state)  # a full state dict: tensors

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        whole = cast("dict[str, Any]", state)  # the stub's dict of tensors and more
        set_model_state_dict(model, whole, options=self._options())  # each rank keeps its shard

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        assert self.module is not None  # set by `prepare`
        return get_optimizer_state_dict(
            self.module, optimizer, options=self._options(cpu_offload=True)
        )

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        assert self.module is not None  # set by `prepare`
        set_optimizer_state_dict(self.module, optimizer, state, options=self._options())

    def capture_blockers(self) -> list[str]:
        return [
            "FSDP2 gathers and frees each layer's parameters from Python hooks in every step",
            *super().capture_blockers(),
        ]


class Accelerate(SingleDevice):
    """`launcher: accelerate`: `accelerate launch` starts the processes, and its Accelerator
    prepares the model (DDP), the optimizer and the mixed precision (`--mixed_precision`, with
    its own loss scaler). Data sharding stays ours, the same for every launcher."""

    launcher = "accelerate"

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec)
        self.accelerator: Any = None
        self.fresh_scaler: dict[str, Any] | None = None  # the loss scaler's state before a step

    def join(self) -> Process:
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        # Mixed precision and CPU mode come from `accelerate launch` flags (environment).
        acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=COLLECTIVE_TIMEOUT)])
        self.accelerator = acc
        if acc.scaler is not None:
            self.fresh_scaler = copy.deepcopy(acc.scaler.state_dict())
        process = Process(
            acc.process_index,
            acc.local_process_index,
            acc.num_processes,
            self._node_rank(),
            acc.device,
        )
        return self._checked(process)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None  # accelerate's prepared model autocasts itself

    @property
    def converts_to_float8(self) -> bool:
        return False  # accelerate's fp8 backends convert the model in `prepare`

    @property
    def loss_scaler(self) -> torch.amp.GradScaler | None:
        return self.accelerator.scaler

    def prepare(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
    ) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        acc = self.accelerator
        if acc.scaler is not None:  # each seed starts from the initial loss scale
            acc.scaler.load_state_dict(self.fresh_scaler)
        if scheduler is None:
            self.module, optimizer = acc.prepare(model, optimizer)
        else:
            self.module, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
        self.wrapped = _wrapper_name(model, self.module)
        return self.module, optimizer, scheduler

    def end_seed(self) -> None:
        # The Accelerator keeps what it prepared (for its save_state); the next seed prepares
        # its own.
        self.accelerator.free_memory()
        super().end_seed()

    def no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        return self.accelerator.no_sync(self.module) if skip else contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)  # applies accelerate's own loss scaling

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()  # accelerate's optimizer unscales and skips inf steps itself

    def capture_blockers(self) -> list[str]:
        return [
            "accelerate prepares the model, optimizer and scaler its own way",
            *_gloo_blocker(self.spec),
        ]


def _wrapper_name(model: nn.Module, prepared: nn.Module) -> str:
    return "none" if prepared is model else type(prepared).__name__


STRATEGIES: dict[str, type[SingleDevice]] = {
    cls.launcher: cls for cls in (SingleDevice, DataParallel, DistributedDataParallel, Accelerate)
}


SHARDED: dict[str, type[Distributed]] = {
    "optimizer": ShardedOptimizer,
    "gradients": FullyShardedDataParallel,
    "full": FullyShardedDataParallel,
}


def strategy_for(spec: RunSpec) -> SingleDevice:
    """The strategy of `spec`'s launcher and sharding (nothing started yet: `join` does
    that)."""
    if spec.sharding != "none":
        return SHARDED[spec.sharding](spec)
    return STRATEGIES[spec.launcher](spec)
