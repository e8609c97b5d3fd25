"""D4 (question 7): model sharding, memory per GPU measured against the closed form.

The same wide MLP (`hidden` × `hidden` Linear layers, config keys), batch and AdamW trained by
the engine's strategies (training/parallel.py) on N processes, for each N of `processes`:

| strategy  | ZeRO stage | what each rank keeps whole          | what it keeps 1/N of          |
|-----------|------------|-------------------------------------|-------------------------------|
| none      | (DDP)      | parameters, gradients, Adam state   | -                             |
| optimizer | ZeRO-1     | parameters, gradients               | Adam state                    |
| gradients | ZeRO-2-like| parameters from forward to backward | parameters, gradients, state  |
| full      | ZeRO-3     | one or two layers' parameters       | parameters, gradients, state  |

Each rank is a process of its own, started by torchrun as a training run's ranks are
(special/ranks.py: one failing stops the others), and trains through the engine's public
interface (`strategy_for`, `Trainer.train_epoch`): one warm-up epoch, whose first step's memory
is split by the tensors that hold it (parameters, gradients and optimizer state, this rank's
part of them; the layer outputs of the forward), seen through torch's module and optimizer
hooks, then `repeats` timed epochs. Steps run eagerly (FSDP2 and ZeroRedundancyOptimizer run
Python between the collectives, so a CUDA graph can't capture them, and DDP gets no graph
either, so that steps compare like with like) with the fused AdamW kernel (no foreach
temporaries). On a GPU, the peak allocated over the timed epochs is the allocator's
(`torch.cuda.max_memory_allocated`); the CPU has no such count, so on the CPU only the split is
measured (with Gloo and a small model, which CI runs).

Bytes per parameter (fp32, AdamW: 4 for the weight, 4 for its gradient, 8 for the two moments),
P parameters, N ranks, U the largest layer's parameters, A the forward's layer outputs:

| strategy  | state at the step | peak, predicted                                        |
|-----------|-------------------|--------------------------------------------------------|
| none      | 16·P              | 16·P + 4·P (DDP's gradient buckets) + A                |
| optimizer | (8 + 8/N)·P       | (8 + 8/N)·P + 4·P (buckets) + A                        |
| gradients | 16·P/N            | 12·P/N + 4·P (gathered weights) + 2·4·U + A            |
| full      | 16·P/N            | 12·P/N + max over layers k of B(k) + A (below)         |

Where the peaks fall: DDP's and ZeRO-1's at the end of the backward, every gradient and its
bucket copy alive. ZeRO-2's early in the backward: every layer's weights gathered since the
forward, while this step's sharded gradients don't exist yet (the last step's were freed by
zero_grad); each layer's backward then frees its gathered weights and adds its gradient's 1/N,
and two layers' unsharded gradients are alive at a time (one being computed, the previous one
being reduce-scattered on FSDP2's side stream). That is the issue's (4 + 12/N)·P. ZeRO-3's
falls in the backward too, where the allocator's history of a step (bench/sharding_memory.py,
4× H200, N = 2 and 4) shows what is alive beside the sharded weights and Adam state (12·P/N):
the gradient shards of the layers whose backward is done, and four layer-size buffers, layer
k's gathered weights and the gradient being computed for them, layer k−1's weights
prefetched into the all-gather buffer and layer k+1's unsharded gradient in the
reduce-scatter's input. With W(j) the bytes of layer j's weights, B(k) = Σ_{j>k} W(j)/N +
2·W(k) + W(k−1) + W(k+1); for the wide MLP the maximum is in the third layer's backward.
(Simpler forms miss: for ZeRO-3, every gradient shard and three buffers, 16·P/N + 3·4·U, is
right at N = 2 only because two errors cancel, and 0.94× the peak at N = 4; for ZeRO-2, every
sharded gradient and one unsharded one, 16·P/N + 4·P + 4·U, is 1.1× the measured peak.)

Communication per step is predicted from the collectives sweep of the same results folder
(A5 explained) where it measured the same backend, device and N: DDP all-reduces the gradients
in 25 MiB buckets; ZeRO-1 also sends every rank the others' updated shards (an all-gather's
worth of bytes, which torch's implementation broadcasts); FSDP2 all-gathers each layer's
weights once (gradients) or twice (full) and reduce-scatters its gradients. A message larger
than the sweep's largest is timed at the largest one's bandwidth (large messages are
bandwidth-bound: the sweep's last points show it).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import socket
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from dmls import stats
from dmls.comm import calls_ms, ddp_buckets, setup_rows
from dmls.config.spec import RunSpec, special_run_spec
from dmls.files import new_figure, read_json, save_figure, write_csv, write_json
from dmls.protocol import as_rank
from dmls.special import ranks
from dmls.training.models import build_model, shard_units

if TYPE_CHECKING:
    from dmls.training.trainer import Trainer

log = logging.getLogger(__name__)

# What ran, by name: fully_shard without resharding after the forward is FSDP's counterpart of
# ZeRO-2, but it shards the parameters at rest as well (16/N bytes of state, not 4 + 12/N).
STAGES = {
    "none": "DDP",
    "optimizer": "ZeroRedundancyOptimizer (ZeRO-1)",
    "gradients": "fully_shard, no reshard after forward",
    "full": "fully_shard (ZeRO-3)",
}
BACKENDS = {"cuda": "nccl", "cpu": "gloo"}
# The table (sharding.csv): bytes in MiB and per parameter; summary.json keeps the bytes.
MIB_COLUMNS = ("params", "grads", "optimizer", "activations", "state", "state_expected",
               "peak_allocated", "peak_predicted")  # fmt: skip
COLUMNS = (
    "device", "processes", "strategy", "stage", "status", "reason", "parameters_m",
    *(f"{c}_mib" for c in MIB_COLUMNS), "state_bytes_per_parameter",
    "closed_form_bytes_per_parameter", "expected_bytes_per_parameter", "peak_over_predicted",
    "step_ms", "step_ms_ci95", "comm_predicted_ms",
)  # fmt: skip


def _mib(n: float | None) -> float | int | None:
    """Bytes in MiB: whole MiB from 100 up (shown with thousands separators), else 2 decimals."""
    if not n:
        return None
    mib = n / 2**20
    return round(mib) if mib >= 100 else round(mib, 2)


def table_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of sharding.csv: memory in MiB and in bytes per parameter."""
    out = {k: row.get(k) for k in COLUMNS if k in row}
    if row["status"] != "ok":
        return out
    p = row["parameters"]
    out |= {f"{c}_mib": _mib(row.get(f"{c}_bytes")) for c in MIB_COLUMNS}
    return out | {
        "parameters_m": p / 1e6,
        "closed_form_bytes_per_parameter": row["state_closed_form_bytes"] / p,
        "expected_bytes_per_parameter": row["state_expected_bytes"] / p,
    }


class SetupFailed(RuntimeError):
    """A setup's ranks failed: its row says why, the other setups go on."""


def run_spec(cfg: dict[str, Any], device: str, strategy: str, processes: int) -> RunSpec:
    """The engine's run for one setup (what `model` means on this device: `cfg[device]`)."""
    shape = cfg["model"][device]
    return special_run_spec(
        "sharding",
        f"{strategy}_{processes}_{device}",
        dataset=cfg["dataset"],
        device=device,
        backend=BACKENDS[device],
        launcher="torchrun",
        nproc_per_node=processes,
        sharding=strategy,
        step="eager",
        epochs=1 + cfg["repeats"],
        batch_size=cfg["batch_size"],
        train_samples=cfg["batch_size"] * processes * cfg["steps"],
        test_samples=cfg["batch_size"] * processes,
        num_workers=0,
        seeds=1,
        model={
            "name": "wide_mlp",
            "hidden": shape["hidden"],
            "layers": shape["layers"],
            "activation": "relu",
        },
        optimizer={"name": "adamw", "lr": 1e-4, "weight_decay": 0.01},
        scheduler={"name": "none"},
        augment={"random_crop": False, "horizontal_flip": False},
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    # ZeroRedundancyOptimizer keeps this rank's shard in the optimizer it wraps (`optim`).
    local = getattr(optimizer, "optim", optimizer)
    return [v for state in local.state.values() for v in state.values() if torch.is_tensor(v)]


def _layer_outputs(model: torch.nn.Module) -> tuple[list[int], list[Any]]:
    """Forward hooks summing the bytes of every leaf module's output that is new memory (not a
    view of its input, as Flatten's is): the activations a backward keeps."""
    total = [0]

    def hook(module, inputs, output):
        if inputs and output.untyped_storage().data_ptr() == inputs[0].untyped_storage().data_ptr():
            return
        total[0] += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    return total, [m.register_forward_hook(hook) for m in leaves]


def _rank(spec: str, data_dir: str, out: str, reports: str) -> None:
    """One rank of a setup (a process of its own, started by `measure`): rank 0 writes every
    rank's record to `out`, a rank that fails its error to `reports`."""
    with as_rank(Path(reports)):
        _train_rank(RunSpec.from_json(spec), Path(data_dir), Path(out))


def _train_rank(run: RunSpec, data_dir: Path, out: Path) -> None:
    from dmls.training.parallel import strategy_for
    from dmls.training.trainer import Trainer

    torch.set_num_threads(1)
    strategy = strategy_for(run)
    process = strategy.join()
    device = process.device
    trainer = Trainer(run, strategy, process, data_dir, fused_optimizer=True)
    params = list(trainer.model.parameters())
    # Warm-up (Adam's state, communicators, the allocator's pools), its first step measured.
    first_step, steps = _warm_up(trainer, params)
    record: dict[str, Any] = {
        "rank": process.rank,
        "parameters": sum(p.numel() for p in params),  # a DTensor's numel is the whole one
        "params_bytes": local_bytes(params),
        "grads_bytes": first_step["grads_bytes"],
        "optimizer_bytes": local_bytes(_optimizer_tensors(trainer.optimizer)),
        "activations_bytes": first_step["activations_bytes"],
    }
    trainer.synchronize()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_s = []
    for epoch in range(1, run.epochs):
        trainer.synchronize()
        start = time.perf_counter()
        trainer.train_epoch(epoch)
        trainer.synchronize()
        step_s.append((time.perf_counter() - start) / steps)
    record["step_s"] = step_s
    record["peak_allocated_bytes"] = (
        torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    )
    records = process.gather(record)
    trainer.release()
    strategy.end_seed()
    strategy.close()
    if process.is_main:
        out.write_text(json.dumps(records))


def _warm_up(trainer: Trainer, params: Sequence[torch.Tensor]) -> tuple[dict[str, int], int]:
    """Train the warm-up epoch; return what its first step held (the bytes of this rank's
    gradients when the optimizer steps, of the layer outputs of its forward) and the epoch's
    optimizer steps."""
    outputs, hooks = _layer_outputs(trainer.model)
    first: dict[str, int] = {}
    steps = [0]

    def before_step(*_: Any) -> None:
        if not first:
            first.update(
                grads_bytes=local_bytes(p.grad for p in params), activations_bytes=outputs[0]
            )
            for h in hooks:  # one forward's outputs: the next steps' are not counted
                h.remove()
        steps[0] += 1

    counting = trainer.optimizer.register_step_pre_hook(before_step)
    try:
        trainer.train_epoch(0)
    finally:
        counting.remove()
        for h in hooks:
            h.remove()
    return first, steps[0]


def measure(spec: RunSpec, data_dir: Path, out_dir: Path) -> list[dict[str, Any]]:
    """Every rank's record of one setup, its ranks started as a training run's are
    (special/ranks.py). A failed setup's folder (`ranks/<run>`) keeps the ranks' output and
    errors."""
    raw, folder = out_dir / f".{spec.run}.json", out_dir / "ranks" / spec.run
    args = {"spec": spec.to_json(), "data_dir": str(data_dir), "out": str(raw),
            "reports": str(folder)}  # fmt: skip
    try:
        ranks.run(
            __name__,
            [json.dumps(args)],
            name=f"sharding.{spec.run}",
            folder=folder,
            nproc_per_node=spec.processes,
        )
    except ranks.RanksFailed as e:
        raise SetupFailed(str(e)) from None
    records = json.loads(raw.read_text())
    raw.unlink()
    return records


def closed_form(strategy: str, p: int, n: int) -> int:
    """The textbook bytes of state per rank (the table above)."""
    return round({"none": 16 * p, "optimizer": 8 * p + 8 * p / n}.get(strategy, 16 * p / n))


def predicted_peak(
    strategy: str, state: int, p: int, layers: list[int], n: int, activations: int
) -> int:
    """The state as the implementation splits it (`expected_state`) plus what the step holds
    beside it at its peak (the table above); `layers` holds the bytes of each layer's weights
    in forward order (`layout`)."""
    if strategy in ("none", "optimizer"):
        return state + 4 * p + activations  # DDP's buckets: the gradients copied for all-reduce
    # FSDP2: this step's sharded gradients (a quarter of the state) don't all exist at the peak.
    weights_and_adam = state - state // 4
    if strategy == "gradients":
        # Every layer's weights gathered since the forward, two unsharded gradients.
        return weights_and_adam + 4 * p + 2 * max(layers) + activations

    def backward_of(k: int) -> float:  # ZeRO-3, in the backward of layer k (docstring)
        after = layers[k + 1] if k + 1 < len(layers) else 0
        before = layers[k - 1] if k > 0 else 0
        return sum(layers[k + 1 :]) / n + 2 * layers[k] + before + after

    return round(weights_and_adam + max(map(backward_of, range(len(layers)))) + activations)


def zero1_largest_share(numels: list[int], n: int) -> int:
    """Parameters whose Adam state ZeroRedundancyOptimizer gives its most loaded rank: it
    assigns whole tensors, largest first, each to the rank holding the fewest elements so far
    (torch's `_partition_parameters`), so a rank holds at least the largest tensor whatever N."""
    loads = [0] * n
    for numel in sorted(numels, reverse=True):
        loads[loads.index(min(loads))] += numel
    return max(loads)


def layout(spec: RunSpec, input_shape: list[int], classes: int) -> tuple[list[tuple], list[int]]:
    """The model built on the meta device (no memory): its parameters' shapes, and the bytes
    (fp32) of each layer FSDP2 gathers."""
    with torch.device("meta"):
        model = build_model(spec.model, input_shape, classes)
    shapes = [tuple(p.shape) for p in model.parameters()]
    return shapes, [4 * sum(p.numel() for p in u.parameters()) for u in shard_units(model)]


def expected_state(strategy: str, shapes: list[tuple[int, ...]], n: int) -> int:
    """Bytes of state on the most loaded rank as the implementations split it: DDP whole;
    ZeroRedundancyOptimizer by whole tensors (`zero1_largest_share`); FSDP2 each tensor along
    dim 0, padded to a multiple of N."""
    numels = [math.prod(s) for s in shapes]
    p = sum(numels)
    if strategy == "none":
        return 16 * p
    if strategy == "optimizer":
        return 8 * p + 8 * zero1_largest_share(numels, n)
    return 16 * sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)


def predicted_comm_ms(
    strategy: str, layers: list[int], sweep: pd.DataFrame | None, backend: str, device: str, n: int
) -> float | None:
    """The collectives of one step, each timed by the sweep's interpolated latency; None when
    the sweep did not measure this backend, device and N, or these sizes."""
    if sweep is None:
        return None
    mine = setup_rows(sweep.to_dict("records"), backend, device, n)

    total = sum(layers)
    if strategy in ("none", "optimizer"):
        calls = [("all_reduce", size) for size in ddp_buckets(total)]
        if strategy == "optimizer":
            calls.append(("all_gather", total))
    else:
        gathers = 1 if strategy == "gradients" else 2
        calls = [
            (op, size) for size in layers for op in ["all_gather"] * gathers + ["reduce_scatter"]
        ]
    return calls_ms(mine, calls)


def _row(
    spec: RunSpec,
    strategy: str,
    records: list[dict],
    shapes: list[tuple[int, ...]],
    layers: list[int],
    sweep: pd.DataFrame | None,
) -> dict[str, Any]:
    """One setup's row: the largest rank's bytes (memory per GPU is what limits), the closed
    form and the step time (mean and 95% interval over the timed epochs, rank 0's clock)."""
    n, device = spec.processes, spec.device
    worst = max(records, key=lambda r: r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"])
    p = worst["parameters"]
    state = worst["params_bytes"] + worst["grads_bytes"] + worst["optimizer_bytes"]
    closed, expected = closed_form(strategy, p, n), expected_state(strategy, shapes, n)
    predicted = predicted_peak(strategy, expected, p, layers, n, worst["activations_bytes"])
    peak = max((r["peak_allocated_bytes"] or 0) for r in records) or None
    step = stats.mean_interval([1000 * s for s in records[0]["step_s"]])
    assert step is not None  # repeats ≥ 1 timed epochs (the schema; epochs = 1 + repeats)
    return {
        "device": device,
        "processes": n,
        "strategy": strategy,
        "stage": STAGES[strategy],
        "status": "ok",
        "reason": None,
        "parameters": p,
        **{
            k: worst[k]
            for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
        },
        "state_bytes": state,
        "state_closed_form_bytes": closed,
        "state_over_closed_form": state / closed,
        "state_expected_bytes": expected,
        "state_over_expected": state / expected,
        "peak_allocated_bytes": peak,
        "other_bytes": peak - state if peak else None,
        "peak_predicted_bytes": predicted if peak else None,
        "peak_over_predicted": peak / predicted if peak else None,
        "state_bytes_per_parameter": state / p,
        "peak_bytes_per_parameter": peak / p if peak else None,
        "step_ms": step.mean,
        "step_ms_ci95": step.half_width,
        "comm_predicted_ms": predicted_comm_ms(
            strategy, layers, sweep, BACKENDS[device], device, n
        ),
        "step_ms_samples": [1000 * s for s in records[0]["step_s"]],
    }


def unavailable(device: str, n: int) -> str | None:
    if device == "cuda" and torch.cuda.device_count() < n:
        return f"needs {n} CUDA GPUs, this host has {torch.cuda.device_count()}"
    if device == "cuda" and not torch.distributed.is_nccl_available():
        return "this torch has no NCCL"
    return None


def run(cfg: dict[str, Any], out_dir: Path, *, data_dir: Path, **_: Any) -> dict[str, Any]:
    sweep_file = cfg.get("collectives_csv")
    sweep = pd.read_csv(sweep_file) if sweep_file and Path(sweep_file).exists() else None
    manifest = json.loads((Path(data_dir) / f"{cfg['dataset']}.json").read_text())
    # Data that could not be had here (offline, without Debian's package): every part is
    # skipped with the preparation's reason, as C's are, not started to fail in its ranks.
    no_data = None
    if manifest.get("status") == "unavailable":
        no_data = f"dataset {cfg['dataset']} unavailable: {manifest.get('reason')}"
    rows: list[dict[str, Any]] = []
    # Each measured setup's records, kept until the study has written its results: a study
    # stopped part-way (a time limit, a lost machine) measures only the setups left when it
    # runs again.
    kept = out_dir / "measured"
    for device in cfg["devices"]:
        for n in cfg["processes"]:
            for strategy in cfg["strategies"]:
                spec = run_spec(cfg, device, strategy, n)
                base = {"device": device, "processes": n, "strategy": strategy,
                        "stage": STAGES[strategy]}  # fmt: skip
                if (reason := unavailable(device, n) or no_data) is not None:
                    rows.append(base | {"status": "skipped", "reason": reason})
                    continue
                log.info("D4: %s (%s) on %d %s rank(s)", strategy, STAGES[strategy], n, device)
                shape = manifest["input_shape"], manifest["num_classes"]
                shapes, layers = layout(spec, *shape)
                try:
                    records = measure_once(spec, data_dir, out_dir, kept / f"{spec.run}.json")
                except SetupFailed as e:
                    log.error("D4: %s on %d %s rank(s) failed: %s", strategy, n, device, e)
                    rows.append(base | {"status": "failed", "reason": str(e)})
                    continue
                rows.append(_row(spec, strategy, records, shapes, layers, sweep))
    write_csv(out_dir / "sharding.csv", [table_row(r) for r in rows], COLUMNS)
    save_figure(_figure(rows), out_dir / "memory.png")
    shutil.rmtree(kept, ignore_errors=True)
    return {"rows": rows}


def measure_once(spec: RunSpec, data_dir: Path, out_dir: Path, path: Path) -> list[dict]:
    """`measure`'s records of one setup, or those an earlier attempt of the study measured
    for the same run spec, torch and host and kept in `path`."""
    # (As JSON reads it back: the spec's tuples as lists. The host, not its GPUs' names: this
    # process starts no CUDA context of its own beside the ranks'.)
    identity = {"spec": json.loads(spec.to_json()), "torch": torch.__version__,
                "host": socket.gethostname()}  # fmt: skip
    if path.exists():
        earlier = read_json(path)
        if earlier.get("identity") == identity:
            log.info("D4: %s measured by an earlier attempt: kept", spec.run)
            return earlier["records"]
    records = measure(spec, data_dir, out_dir)
    path.parent.mkdir(exist_ok=True)
    write_json(path, {"identity": identity, "records": records})
    return records


def _figure(rows: list[dict[str, Any]]):
    ok = [r for r in rows if r["status"] == "ok"]
    device = "cuda" if any(r["device"] == "cuda" for r in ok) else "cpu"
    mine = [r for r in ok if r["device"] == device]
    fig = new_figure(max(6, 1.7 * len(mine) + 2), 3.8)
    ax = fig.subplots()
    # Wrapped, so that the strategies' long names don't run into each other.
    labels = [
        f"{textwrap.fill(r['stage'], 16, break_long_words=False)}\nN={r['processes']}" for r in mine
    ]
    bottom = [0.0] * len(mine)
    parts = [
        ("params_bytes", "parameters"),
        ("grads_bytes", "gradients"),
        ("optimizer_bytes", "Adam state"),
    ]
    if device == "cuda":
        parts.append(("other_bytes", "rest of the peak (buffers, activations)"))
    for i, (key, name) in enumerate(parts):
        values = [(r[key] or 0) / 2**30 for r in mine]
        ax.bar(labels, values, bottom=bottom, color=f"C{i}", label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    xs = range(len(mine))
    # The predictions as bars' ticks: the state's closed form and, on a GPU, the peak's.
    marks: dict[str, Any] = {"marker": "_", "s": 400, "zorder": 3}
    closed = [r["state_closed_form_bytes"] / 2**30 for r in mine]
    ax.scatter(xs, closed, color="black", label="state, closed form", **marks)
    if device == "cuda":
        peaks = [r["peak_predicted_bytes"] / 2**30 for r in mine]
        ax.scatter(xs, peaks, color="red", label="peak, predicted", **marks)
    ax.set(
        ylabel="GiB per rank (the largest rank)", title=f"Memory per rank by strategy ({device})"
    )
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return fig


if __name__ == "__main__":
    _rank(**json.loads(sys.argv[1]))
