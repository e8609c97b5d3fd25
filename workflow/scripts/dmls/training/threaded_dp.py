"""DataParallel whose replicas persist, and run on threads that persist, from step to step.

`ThreadedDataParallel` is nn.DataParallel (one process; scatter, replicate, forward, gather)
with its two per-step rebuilds taken out: `PersistentReplicas` keeps the replicas' module
objects and weights between steps, and `ReplicaThreads` runs their forwards on long-lived
threads. The strategy `DataParallel` (training/parallel.py) uses it for `replica_threads:
persistent`. It reaches into torch's private API (`torch._foreach_*`, `torch.utils._pytree`,
modules' `_parameters`/`_modules` dictionaries), which is why it lives apart from the strategies.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, cast

import torch
from torch import nn


class ThreadedDataParallel(nn.DataParallel):
    """nn.DataParallel (scatter, replicate, forward, gather; one process) whose replicas run on
    `ReplicaThreads` instead of new threads every step, and persist between steps
    (`PersistentReplicas`) instead of being built again every step: each step copies the
    weights into them, and the backward ends by summing their gradients onto the first GPU."""

    def __init__(self, module: nn.Module, device_ids: list[int]) -> None:
        super().__init__(module, device_ids=device_ids)
        self.threads = ReplicaThreads(device_ids)
        self.replicas = PersistentReplicas()

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.replicas.sum_gradients_in_backward(super().forward(*inputs, **kwargs))

    # DataParallel passes its own device_ids here, ints; the stub allows torch.device too.
    def replicate(  # type: ignore[override]  # narrower than the stub: ints only
        self, module: nn.Module, device_ids: list[int]
    ) -> list[nn.Module]:
        return self.replicas(module, [torch.device("cuda", d) for d in device_ids])

    def parallel_apply(self, replicas, inputs, kwargs):
        return self.threads.apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])


class ReplicaThreads:
    """Long-lived threads running the replicas' forwards each step: the calling thread runs the
    first GPU's replica, and one thread per other GPU runs that GPU's.

    nn.DataParallel starts a new thread per replica every step (`parallel_apply`), and cuDNN's
    execution plans are cached per thread (pytorch/pytorch#103939): every forward then builds
    its convolution plans again. Here every replica runs on a thread that lives as long as the
    model, so its plans are kept; the first GPU's on the calling thread, which saves handing it
    to another thread and back each step. What runs for each replica is what `parallel_apply`
    runs: the replica on its device and the caller's current stream there, under the caller's
    grad mode and autocast state (a context is entered only where the thread's own state
    differs: each costs host time in a step that is all host time)."""

    def __init__(self, devices: list[int]) -> None:
        self.pools = {
            # Each thread's current device is set once, when it starts.
            d: ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"dp-gpu{d}",
                initializer=torch.cuda.set_device,
                initargs=(d,),
            )
            for d in devices[1:]
        }

    def apply(
        self, modules: list[nn.Module], inputs: list[Any], kwargs: list[dict], devices: list[int]
    ) -> list[Any]:
        grad = torch.is_grad_enabled()
        autocast = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")

        def forward(module, args, kw, stream):  # on a replica's thread, its device current
            torch.set_grad_enabled(grad)
            with (
                torch.cuda.stream(stream)
                if torch.cuda.current_stream() != stream
                else contextlib.nullcontext(),
                torch.autocast("cuda", dtype=autocast[1])
                if autocast[0]
                else contextlib.nullcontext(),
            ):
                return module(*_as_args(args), **kw)

        # The other GPUs' replicas start first, each on the caller's current stream of its GPU.
        futures = [
            self.pools[d].submit(forward, m, a, k, torch.cuda.current_stream(d))
            for m, a, k, d in zip(modules[1:], inputs[1:], kwargs[1:], devices[1:], strict=True)
        ]
        try:  # then this thread runs the first GPU's, under its own grad mode and autocast
            with (
                torch.cuda.device(devices[0])
                if torch.cuda.current_device() != devices[0]
                else contextlib.nullcontext()
            ):
                first = modules[0](*_as_args(inputs[0]), **kwargs[0])
        except BaseException:
            wait(futures)  # the other replicas end before the error leaves the step
            raise
        return [first, *(f.result() for f in futures)]  # a replica's error is raised here

    def close(self) -> None:
        for pool in self.pools.values():
            pool.shutdown()


def _as_args(args: Any) -> tuple:
    return tuple(args) if isinstance(args, list | tuple) else (args,)


class PersistentReplicas:
    """The replicas DataParallel copies the model into, kept whole from step to step: module
    objects and parameter tensors. The first device's replica is the network itself.

    nn.parallel.replicate builds every replica again each step: it broadcasts the parameters
    and buffers through autograd (a Broadcast node whose backward sums the replicas'
    gradients onto the first device) and builds a new module object for every module of every
    other replica in Python. Here each other device keeps one copy of the network, built
    once, whose parameters and buffers are views into one flat tensor per dtype, laid out as
    the network's are (so multi-tensor copies take their one-kernel path). Each step gathers
    the network's weights into a flat staging tensor on the first device (one multi-tensor
    copy) and copies that to each other device (one copy); once the backward is done, each
    copy's gradients, views into one flat tensor too, come back the same way and are added to
    the network's (one copy, one multi-tensor add), as the Broadcast node's backward sums
    them, and are zeroed. What a replica learns is what replicate's learns: the same weights
    each step, its gradients summed onto the first device, its buffer updates (BatchNorm's
    running statistics) dropped as replicate's are. A parameter to which the network itself
    gave no gradient keeps none: the replicas run the same code, so none of them used it.

    The copies are built again when the module tree or its parameters or buffers (by
    identity, dtype or requires_grad) or the devices change; train/eval modes are mirrored
    each step. Other attributes a module reassigns after that are not seen by its copies: the
    course's models reassign none."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._copies: list[nn.Module] = []  # one per device after the first
        self._modules: list[list[nn.Module]] = []  # per copy, in network.modules() order
        self._weights: list[_FlatViews] = []  # per dtype: parameters and buffers
        self._grads: list[_FlatViews] = []  # per dtype: the parameters that take a gradient
        self._params: list[torch.Tensor] = []  # the network's
        self.builds = 0  # how many times the copies were built (tests, benches)

    def __call__(self, network: nn.Module, devices: list[torch.device]) -> list[nn.Module]:
        """The network's replicas on `devices` (the first is the network's own device), holding
        the network's current weights."""
        modules = list(network.modules())
        params = list(network.parameters())
        tensors = params + list(network.buffers())
        key = (
            tuple(devices),
            tuple(map(id, modules)),
            tuple(map(id, tensors)),
            tuple(t.dtype for t in tensors),
            tuple(p.requires_grad for p in params),
        )
        if key != self._key:
            self._build(network, modules, tensors, len(params), devices, key)
        with torch.no_grad():
            for group in self._weights:
                group.send([tensors[i] for i in group.indices])
        modes = [m.training for m in modules]
        for copy_modules in self._modules:
            for module, mode in zip(copy_modules, modes, strict=True):
                module.training = mode
        return [network, *self._copies]

    def _build(
        self,
        network: nn.Module,
        modules: list[nn.Module],
        tensors: list[torch.Tensor],
        n_params: int,
        devices: list[torch.device],
        key: tuple,
    ) -> None:
        self._key = None
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        self._weights = [_FlatViews(tensors, ix, devices) for ix in by_dtype.values()]
        trained: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(tensors[:n_params]):
            if p.requires_grad:
                trained.setdefault(p.dtype, []).append(i)
        self._grads = [_FlatViews(tensors, ix, devices) for ix in trained.values()]
        self._copies, self._modules = [], []
        for d in range(1, len(devices)):
            views = {
                i: v for g in self._weights for i, v in zip(g.indices, g.views[d], strict=True)
            }
            grads = {i: v for g in self._grads for i, v in zip(g.indices, g.views[d], strict=True)}
            copy_ = _copy_onto(network, tensors, views, grads)
            self._copies.append(copy_)
            self._modules.append(list(copy_.modules()))
            if len(self._modules[-1]) != len(modules):
                raise RuntimeError("a replica's module tree differs from the network's")
        self._params = tensors[:n_params]
        self._key = key
        self.builds += 1

    def sum_gradients(self) -> None:
        """Add the copies' gradients into the network's and zero them: what replicate's
        Broadcast node does in the backward."""
        for group in self._grads:
            group.receive_into([self._params[i].grad for i in group.indices])

    def sum_gradients_in_backward(self, output: Any) -> Any:
        """Have the backward that reaches `output` end by summing the copies' gradients onto
        the network's (`sum_gradients`, queued on autograd's engine as DDP and FSDP queue
        theirs: it runs once the whole backward is done, its streams synchronised)."""
        if not self._copies or not torch.is_grad_enabled():
            return output
        engine = torch.autograd.Variable._execution_engine

        def queue(grad: torch.Tensor) -> torch.Tensor:
            engine.queue_callback(self.sum_gradients)
            return grad

        # Every output that takes a gradient: a backward through two of them sums twice, the
        # second time zeros.
        for leaf in torch.utils._pytree.tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                leaf.register_hook(queue)
        return output


class _FlatViews:
    """Tensors `indices` of a list, all of one dtype, laid out in one flat tensor per device:
    `views[d]` are views into device d's flat tensor with the tensors' own sizes and strides
    (a dense layout, channels_last or not, keeps its strides; another becomes dense),
    each starting on a 256-byte boundary as an allocation of its own would (CUDA kernels and
    cuDNN load vectors that must be aligned: views packed end to end raised "misaligned
    address")."""

    ALIGN_BYTES = 256

    def __init__(
        self, tensors: list[torch.Tensor], indices: list[int], devices: list[torch.device]
    ) -> None:
        self.indices = indices
        like = [tensors[i] for i in indices]
        align = max(1, self.ALIGN_BYTES // like[0].element_size())
        self.offsets, total = [], 0
        for t in like:
            self.offsets.append(total)
            total += -(-t.numel() // align) * align
        self.flats = [torch.zeros(total, dtype=like[0].dtype, device=d) for d in devices]
        self.views = [_carve(flat, like, self.offsets) for flat in self.flats]

    def send(self, sources: list[torch.Tensor]) -> None:
        """Copy `sources` (on the first device) into every device's views."""
        torch._foreach_copy_(self.views[0], sources)
        for flat in self.flats[1:]:
            flat.copy_(self.flats[0], non_blocking=True)

    def receive_into(self, targets: list[torch.Tensor | None]) -> None:
        """Add every other device's views into `targets` (on the first device; None: skipped)
        and zero them."""
        present = [k for k, t in enumerate(targets) if t is not None]
        for flat in self.flats[1:]:
            if present:
                self.flats[0].copy_(flat, non_blocking=True)
                torch._foreach_add_(
                    cast("list[torch.Tensor]", [targets[k] for k in present]),  # not None
                    [self.views[0][k] for k in present],
                )
            flat.zero_()


def _carve(flat: torch.Tensor, like: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    # Strides as torch.empty_like lays out a tensor like t: t's own where t is dense
    # (channels_last too), a dense layout in t's order of dimensions where it is not.
    return [
        flat.as_strided(t.shape, torch.empty_like(t, device="meta").stride(), offset)
        for t, offset in zip(like, offsets, strict=True)
    ]


def _copy_onto(
    network: nn.Module,
    tensors: list[torch.Tensor],
    views: dict[int, torch.Tensor],
    grads: dict[int, torch.Tensor],
) -> nn.Module:
    """The network's module tree once more, each module a shallow copy as `replicate` makes
    its replicas' (hooks and other attributes shared with the network's: a forward hook sees
    every replica), its parameter i (in `tensors`) a leaf on views[i] with grads[i] as its
    gradient, its buffer i views[i]."""
    index = {id(t): i for i, t in enumerate(tensors)}
    made_tensors: dict[int, torch.Tensor] = {}
    made_modules: dict[int, nn.Module] = {}

    def tensor(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        i = index[id(t)]
        if i not in made_tensors:
            made_tensors[i] = views[i]
            if is_param:
                made_tensors[i] = nn.Parameter(views[i], requires_grad=t.requires_grad)
                made_tensors[i].grad = grads.get(i)
        return made_tensors[i]

    def module_copy(module: nn.Module) -> nn.Module:
        if id(module) not in made_modules:  # (a module shared within the tree stays shared)
            replica = made_modules[id(module)] = module.__new__(type(module))
            replica.__dict__ = module.__dict__.copy()
            replica._parameters = {
                name: None if p is None else cast(nn.Parameter, tensor(p, True))
                for name, p in module._parameters.items()
            }
            replica._buffers = {
                name: None if b is None else tensor(b, False) for name, b in module._buffers.items()
            }
            replica._modules = {
                name: None if m is None else module_copy(m) for name, m in module._modules.items()
            }
        return made_modules[id(module)]

    return module_copy(network)
