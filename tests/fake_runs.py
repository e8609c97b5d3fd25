"""Fake run records and studies for the report's tests (tests/test_report_*.py and the
modules that build studies from them): a metrics.json as the supervisor writes it, with
chosen numbers (`fake_metrics`, one seed's result `fake_seed`, a history `epochs`), A1's
study with one seed (`a1_study`) and with three (`seeds_study`), and a record moved onto a
CPU host (`_on_cpu`)."""

from conftest import alike, make_spec
from dmls import record
from dmls.report.cells import MIB
from dmls.report.study import Study


def fake_metrics(
    run: str,
    status: str = "ok",
    *,
    study: str = "parallelism",
    samples_per_s: float = 1000.0,
    test_accuracy: float = 0.80,
    gpu_mib: float | None = 300.0,
    history: list[dict] | None = None,
    eager_reason: str | None = None,
    spread: tuple[float, ...] = (1.0,),
    **spec_overrides,
) -> dict:
    """A metrics.json as dmls.supervisor.supervise writes it, with chosen numbers;
    `eager_reason`: the run trained eagerly for this reason (else from a CUDA graph, unless it
    asked for eager)."""
    spec_overrides.setdefault("seeds", len(spread))
    spec = make_spec(study=study, run=run, **spec_overrides).to_dict()
    processes = spec["nodes"] * spec["nproc_per_node"] if spec["launcher"] != "dp" else 1
    replicas = spec["nodes"] * spec["nproc_per_node"]
    metrics = {
        "metrics_version": record.VERSION,
        "study": study,
        "run": run,
        "status": status,
        "reason": None if status == "ok" else f"{run} could not run: no CUDA GPU on this host",
        "spec": spec,
        "derived": {
            "processes": processes,
            "replicas": replicas,
            "global_batch_size": spec["batch_size"] * replicas,
            "device": "cuda",
            "nodes_emulated": False,
        },
        "host": {
            "hostname": "h",
            "gpus": ["NVIDIA H100"],
            "cpu_model": "Xeon",
            "cpu_count": 16,
            "python": "3.12",
            "torch": "2.11",
            "accelerate": "1.15",
            "platform": "Linux",
            "cuda": "13.0",
            "cudnn": 91000,
            "nccl": "2.27.3",
            "gpu_memory_bytes": [80 * 2**30],
            "cuda_driver": "580.1",
        },
        "started_at": "2026-11-26T05:00:00+00:00",
        "finished_at": "2026-11-26T05:01:40+00:00",
        "launch": {"isolation": "host", "seconds": 100.0},
    }
    if status != "ok":
        return metrics
    epochs = spec["epochs"]
    history = history or [
        {
            "epoch": e,
            "train_loss": 2.0 / e,
            "train_accuracy": test_accuracy + 0.01 * e,
            "test_loss": 2.1 / e,
            "test_accuracy": test_accuracy * e / epochs,
            "train_time_s": 10.0,
            "eval_time_s": 1.0,
            "lr": 0.001,
        }
        for e in range(1, epochs + 1)
    ]
    gpus = (
        []
        if gpu_mib is None
        else [
            {
                "index": 0,
                "name": "NVIDIA H100",
                "peak_gpu_mem_allocated_bytes": gpu_mib * MIB,
                "peak_gpu_mem_reserved_bytes": 2 * gpu_mib * MIB,
            }
        ]
    )
    # One seed per factor: each seed's numbers are the run's times its factor (1: one seed).
    seeds = [
        fake_seed(k, history, samples_per_s, gpu_mib, f, gpus=processes)
        for k, f in enumerate(spread)
    ]
    step = {
        "requested": spec["step"],
        "compiled": False,
        "mode": "eager" if eager_reason or spec["step"] == "eager" else "cuda_graph",
        "eager_reason": eager_reason or ("step: eager" if spec["step"] == "eager" else None),
    }
    data = {"name": "cifar10", "synthetic": False, "source": "torchvision",
            "input_shape": [3, 32, 32]}  # fmt: skip
    for s in seeds:
        s |= {"effective_precision": spec["precision"], "fp8_linear_layers": 0,
              "parameters": 1000, "step": step, "data": data}  # fmt: skip
    wall = sum(s["timing"]["train_time_s"] for s in seeds) + 5
    job = {
        "seeds": seeds,
        "timing": dict(
            setup_s=2.0, process_group_s=0.1, fit_s=wall - 5, teardown_s=3.0, wall_time_s=wall
        ),
        "world_size": processes,
        "ranks": [
            {"rank": r, "hostname": "h", "gpus": gpus, "peak_host_rss_bytes": 2000 * MIB}
            for r in range(processes)
        ],
        "energy": dict(measured=False, reason="a fake run", counts="GPU", update_period_s=None),
    }
    return metrics | record.combine(job)


def fake_seed(
    seed: int,
    history: list[dict],
    samples_per_s: float,
    gpu_mib: float | None,
    factor: float,
    gpus: int = 1,
) -> dict:
    """One seed's result (training/results.py `seed_result`), its numbers scaled by `factor`;
    `gpus` GPUs peaked alike."""
    history = [
        {"eval_time_s": 1.0, "lr": 0.001}
        | h
        | {k: h[k] * factor for k in ("train_loss", "test_loss", "train_time_s")}
        | {k: min(1.0, h[k] * factor) for k in ("train_accuracy", "test_accuracy")}
        for h in history
    ]
    last = history[-1]
    train_time = sum(h["train_time_s"] for h in history)
    return {
        "seed": seed,
        "status": "ok",
        "reason": None,
        "kept": False,
        "history": history,
        "final": {
            "train_loss": last["train_loss"],
            "train_accuracy": last["train_accuracy"],
            "test_loss": last["test_loss"],
            "test_accuracy": last["test_accuracy"],
            "best_test_accuracy": max(h["test_accuracy"] for h in history),
            "epochs_completed": len(history),
            "stopped_early_epoch": None,
            "diverged_epoch": None,
        },
        "timing": {
            "setup_s": 0.5,
            "train_time_s": train_time,
            "eval_time_s": sum(h["eval_time_s"] for h in history),
            "checkpoint_time_s": 0.0,
            "fit_s": train_time + sum(h["eval_time_s"] for h in history),
            "first_epoch_s": history[0]["train_time_s"],
            "steady_epoch_s": history[-1]["train_time_s"],
            "samples_per_s": samples_per_s / factor,
        },
        "peak_gpu_mem_allocated_bytes": None if gpu_mib is None else gpu_mib * MIB * factor,
        "peak_gpu_mem_reserved_bytes": None if gpu_mib is None else 2 * gpu_mib * MIB * factor,
        "peak_gpu_mem_allocated_per_gpu_bytes": (
            [] if gpu_mib is None else [gpu_mib * MIB * factor] * gpus
        ),
    }


def a1_study(**settings) -> Study:
    metrics = [
        fake_metrics("single_gpu", launcher="single", epochs=3, test_accuracy=0.80),
        fake_metrics("dataparallel_2gpu", "skipped", launcher="dp", nproc_per_node=2, epochs=3),
        fake_metrics(
            "ddp_2gpu",
            launcher="torchrun",
            nproc_per_node=2,
            samples_per_s=1620.0,
            epochs=3,
            test_accuracy=0.796,
            gpu_mib=310.0,
        ),
    ]
    return alike("parallelism", {"title": "A1. Parallelism", **settings}, metrics)


def epochs(train_times_s: list[float], test_accuracy: float = 0.80) -> list[dict]:
    """A history whose epochs took these training times (the first with its warm-up)."""
    return [
        {
            "epoch": e,
            "train_loss": 2.0 / e,
            "train_accuracy": 0.85,
            "test_loss": 2.1 / e,
            "test_accuracy": test_accuracy * e / len(train_times_s),
            "train_time_s": seconds,
            "eval_time_s": 1.0,
        }
        for e, seconds in enumerate(train_times_s, start=1)
    ]


def seeds_study() -> Study:
    """single_gpu with three seeds at 0.9, 1.0 and 1.1 times its numbers, ddp_2gpu at 0.95,
    1.0 and 1.05; dataparallel_2gpu trained one seed."""
    metrics = [
        fake_metrics("single_gpu", launcher="single", epochs=3, history=epochs([15, 10, 10]),
                     spread=(0.9, 1.0, 1.1)),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0,
                     epochs=3, history=epochs([15, 10, 10]), spread=(0.95, 1.0, 1.05)),
        fake_metrics("dataparallel_2gpu", launcher="dp", nproc_per_node=2, epochs=3,
                     test_accuracy=0.796),
    ]  # fmt: skip
    return alike("parallelism", {}, metrics)


def _on_cpu(metrics: dict, kernels: dict | None, flags: list[str] | None) -> dict:
    metrics["derived"]["device"] = "cpu"
    metrics["host"]["cpu_half_precision"] = {"onednn_kernels": kernels, "flags": flags}
    return metrics
