"""One job of a run: every seed of its spec, trained in this process one after the other.

`train(spec)` picks the run's parallel strategy (training/parallel.py), joins the process group
the launcher prepared, opens the energy meter and settles the garbage collector
(training/collector.py) once; then each seed gets a `Trainer` of its own (training/trainer.py),
resumes from its own checkpoint or is kept when an earlier attempt finished it, and the job
returns its result (record.new_job, from the seeds training/results.py measured).
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import torch

from dmls import record
from dmls.config.spec import RunSpec
from dmls.data.loaders import load_manifest
from dmls.training import checkpoint, energy, results
from dmls.training.collector import GarbageCollection
from dmls.training.parallel import Process, SingleDevice, strategy_for
from dmls.training.results import rank_facts, reset_gpu_peaks, seed_result
from dmls.training.trainer import Trainer


def train(
    spec: RunSpec,
    data_dir: Path,
    run_dir: Path,
    checkpoint_path: Path,
    collector: GarbageCollection | None = None,
) -> dict | None:
    """Train every seed of `spec` in this process (`RunSpec.seed_specs`): the process group,
    the imports and the data are set up once, each seed gets a trainer of its own. Each seed
    resumes from its own checkpoint (`RunSpec.seed_checkpoint`) when it holds that seed's last
    finished epoch, and a seed that finished in an earlier attempt of the job is kept as it
    was. `collector` is the garbage collector's policy (by default "freeze"). Rank 0 saves each
    seed's final weights in `run_dir` and returns the job's result (other ranks None)."""
    times = {"start": time.perf_counter()}
    strategy = strategy_for(spec)
    process = strategy.join()
    times["joined"] = time.perf_counter()
    torch.set_num_threads(max(1, int(os.environ.get("DMLS_THREADS_PER_PROCESS", "1"))))
    gpus = strategy.gpu_indices()
    meter, no_energy = energy.EnergyMeter.open(gpus)
    meter, no_energy = energy.agree(meter, process.gather(no_energy))
    (collector or GarbageCollection()).before_training()
    seeds = []
    for k, seed_spec in enumerate(spec.seed_specs()):
        if process.is_main and spec.seeds > 1:
            print(f"seed {seed_spec.seed} ({k + 1} of {spec.seeds})", flush=True)
        path = spec.seed_checkpoint(checkpoint_path, seed_spec.seed)
        model_path = run_dir / ("model.pt" if spec.seeds == 1 else f"model-seed{seed_spec.seed}.pt")
        kept = _finished_seed(seed_spec, data_dir, path)
        if kept is not None:
            if process.is_main:
                print(f"seed {seed_spec.seed} finished in an earlier attempt: kept", flush=True)
                _save_model(model_path, seed_spec, kept)
            seeds.append(kept["result"] | {"kept": True})
        else:
            fit_start, result = _train_seed(
                seed_spec, strategy, process, data_dir, path, model_path, meter, gpus
            )
            if result is not None:
                seeds.append(result)
        if k == 0:  # the job's setup ends where its first seed's training starts
            times["fit_start"] = fit_start if kept is None else time.perf_counter()
    times["fit_end"] = time.perf_counter()
    ranks = process.gather(rank_facts(process, gpus))
    strategy.close()
    if not process.is_main:
        return None
    times["end"] = time.perf_counter()
    job_energy = results.job_energy(no_energy, getattr(meter, "update_period_s", None))
    return record.new_job(
        seeds, times=times, world_size=process.world_size, ranks=ranks, energy=job_energy
    )


def _train_seed(
    spec: RunSpec,
    strategy: SingleDevice,
    process: Process,
    data_dir: Path,
    path: Path,
    model_path: Path,
    meter: energy.EnergyMeter | None,
    gpus: list[int],
) -> tuple[float, dict | None]:
    """Train one seed of the job: when its training started and its result (rank 0; else
    None). Everything the seed built dies with this call's frame:
    `_free_earlier_seeds` collects what reference cycles still hold before the next seed."""
    _free_earlier_seeds(gpus)
    reset_gpu_peaks(gpus)
    built = time.perf_counter()
    trainer = Trainer(spec, strategy, process, data_dir, meter=meter)
    fit_start = time.perf_counter()
    outcome = trainer.fit(path)
    fit_s = time.perf_counter() - fit_start
    all_peaks = process.gather(trainer.memory.seed_peaks())
    step_memory = process.gather(trainer.memory.record())
    effective = process.gather(trainer.probe.effective)
    weights = trainer.model_state()  # every rank: a sharded strategy gathers them
    result = None
    if process.is_main:
        result = seed_result(
            spec.seed,
            outcome,
            loaders=trainer.data,
            setup_s=fit_start - built,
            fit_s=fit_s,
            effective_precisions=effective,
            fp8_linear_layers=trainer.fp8_linear_layers,
            step=trainer.step_record(),
            peaks=all_peaks,
            step_memory=step_memory,
            parameters=sum(p.numel() for p in trainer.model.parameters()),
            layers=trainer.layers(),
            energy_period_s=getattr(meter, "update_period_s", None),
        )
        state = {"epoch": len(outcome["history"]), "model": weights}
        _save_model(model_path, spec, state)
        # The seed's end, kept until the job's result is written: a job killed during a later
        # seed does not train this one again.
        trainer.save_finished(path, state | {"result": result})
    trainer.release()
    strategy.end_seed()
    return fit_start, result


def _free_earlier_seeds(gpus: list[int]) -> None:
    """Give back what earlier seeds of the job still hold on its GPUs, before this seed's peaks
    are reset, so that every seed's peak is measured from the same state:
    - what sits in reference cycles until the garbage collector's next pass: frames of
      torch.optim's Optimizer constructor hold the trainer, and with it the model, its
      gradients, the optimizer state and the CUDA graph's pool;
    - the cuBLAS workspaces PyTorch keeps for every (handle, stream) pair: each seed captures
      its graph on a new stream, so each would leave one behind and raise the later seeds'
      peaks. PyTorch's own leak checks and CUDA graph trees clear these workspaces the same
      way."""
    gc.collect()
    for i in gpus:
        with torch.cuda.device(i):
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()


def _finished_seed(spec: RunSpec, data_dir: Path, path: Path) -> dict[str, Any] | None:
    """The state a finished seed left in its checkpoint (`Trainer.save_finished`), or None
    when the seed has yet to train or finish (its trainer then resumes or starts it)."""
    if not path.exists():
        return None
    manifest = load_manifest(data_dir, spec.dataset)
    state, _ = checkpoint.load(path, checkpoint.identity(spec, manifest), set_aside=False)
    return state if state is not None and "result" in state else None


def _save_model(path: Path, spec: RunSpec, state: dict[str, Any]) -> None:
    torch.save({"model": state["model"], "spec": spec.to_dict(), "epochs": state["epoch"]}, path)
