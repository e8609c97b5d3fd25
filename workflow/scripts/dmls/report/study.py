"""One study's runs: what varied, how each run ended and, for the runs that finished, numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd

from dmls import record, stats
from dmls.config.studies import baseline_run, varying_settings
from dmls.report import cells, targets
from dmls.report.aggregate import summarize
from dmls.report.run_numbers import RunNumbers

# Only finished runs have numbers in the report; the others show their status and reason.
OK = "ok"
# Settings that span the nodes x processes grid of the cluster studies.
GRID_KEYS = ("nodes", "nproc_per_node")
# How data reaches the model and how a step runs: runs scale against runs of their own path.
PATH_KEYS = ("loader", "step")
# What a study's runs shared, by config `isolation`, for its provenance line. Where none of
# them overlapped another job in time, the page says so instead (page.ran_alone).
SHARED = {
    "host": "no other job of this DAG beside it",
    "devices": "beside other jobs on other cores and GPUs (the CPU package shared)",
    "none": "shared host, timings not comparable",
}
ALONE = "one job at a time (no other job ran meanwhile)"
# Settings of the processes' environment that leave what trains the same (B1's n1xp2_passive:
# OpenMP's idle threads asleep); a grid study's ablation, off its grid.
ENV_KEYS = ("omp_wait_policy",)


class ReportError(ValueError):
    """A study's report settings don't match its runs (names the config key)."""


# (column in the summary row, header), each number shown as dmls.report.cells.FORMATS says,
# with its 95% interval where the summary row has one (`<column>_ci95`); numbers only ever come
# from `ok` runs. The first epoch also pays for warm-up (cuDNN autotuning, CUDA-graph capture,
# compiling); the steady epoch (median of epochs 2..E) is what runs compare on.
RESULT_COLUMNS: list[tuple[str, str]] = [
    ("device", "Device"),
    ("effective_precision", "Precision (measured)"),
    ("processes", "Processes"),
    ("global_batch_size", "Global batch"),
    ("epochs_completed", "Epochs"),
    ("train_accuracy", "Train acc. (%)"),
    ("test_accuracy", "Test acc. (%)"),
    ("train_loss", "Train loss"),
    ("test_loss", "Test loss"),
    ("first_epoch_s", "First epoch (s)"),
    ("steady_epoch_s", "Steady epoch (s)"),
    ("samples_per_s", "Samples/s (steady epoch)"),
    ("peak_gpu_mem_allocated_bytes", "Peak GPU mem., max GPU (MiB)"),
    ("step_gpu_mem_bytes", "GPU mem. a step adds, allocated (MiB)"),
    ("graph_pool_reserved_bytes", "CUDA-graph pools, reserved (MiB)"),
    ("gpu_mem_per_gpu", "Peak GPU mem. per GPU (MiB)"),
    ("peak_host_rss_bytes", "Peak RSS, max rank (MiB)"),
]

# The result columns shown with a 95% interval: the measured ones that every seed records,
# each over the seeds it counts (record.counted_seeds; not host RSS, the job's peak over its
# ranks; not the epoch count, which only varies with early stopping).
INTERVAL_COLUMNS = frozenset(record.SEED_METRICS) - {"epochs_completed"}
# With a study's `target_accuracy`: the time, epochs and GPU energy to reach it, with their
# intervals.
TARGET_COLUMNS = frozenset({"time_to_target_s", "epochs_to_target", "energy_to_target_j"})
# The GPUs' joules over the training in the seeds of a warm process (Study.energy_column).
WARM_ENERGY = "train_energy_warm_j"
# Where the runs' GPUs reported energy (training/energy.py): joules per steady epoch and over
# the whole training.
ENERGY_COLUMNS: list[tuple[str, str]] = [
    ("steady_epoch_energy_j", "Steady epoch energy, GPUs (J)"),
    ("train_energy_j", "Training energy, GPUs (J)"),
]


@dataclass(frozen=True)
class Study:
    key: str
    title: str
    baseline: str
    runs: pd.DataFrame  # one summary row per run (dmls.report.aggregate.summarize), config order
    histories: dict[str, pd.DataFrame]  # per-epoch history of every `ok` run
    metrics: dict[str, dict[str, Any]]  # the raw metrics.json of every run
    # The study's target test accuracy (config `target_accuracy`): time to reach it per run.
    target_accuracy: float | None = None
    # Every run's numbers, built once from its record (the numbers layer).
    numbers: dict[str, RunNumbers] = field(default_factory=dict)
    # How much jobs of identical settings differ, per kind of device (stats.job_noise over the
    # results folder's A/A jobs, quantities.job_noise): every speed compared between two runs,
    # each its own job, is judged against it.
    job_noise: dict[str, stats.JobNoise] = field(default_factory=dict)

    @classmethod
    def from_metrics(
        cls,
        key: str,
        settings: dict[str, Any],
        metrics: Sequence[dict],
        job_noise: dict[str, stats.JobNoise] | None = None,
    ) -> Study:
        """`settings` is the study's config block; `metrics` its runs' files, config order;
        `job_noise` how much the results folder's identical jobs differ (quantities.job_noise)."""
        if not metrics:
            raise ReportError(f"studies.{key}: the study has no runs")
        by_run = {m["run"]: m for m in metrics}
        runs = pd.DataFrame([summarize(m) for m in metrics]).set_index("run", drop=False)
        baseline = baseline_run(settings, list(by_run))
        if baseline not in by_run:
            raise ReportError(
                f"studies.{key}.baseline: {baseline!r} is not one of its runs {list(by_run)}"
            )
        runs["gpu_mem_per_gpu"] = [_gpu_memory_per_gpu(m) for m in metrics]
        # The GPUs' mean power in training: their joules over the seconds, means over seeds.
        if "train_energy_j" in runs:  # (no run that trained: no such column)
            runs["train_power_w"] = runs["train_energy_j"].astype(float) / runs["train_time_s"]
            warm = pd.DataFrame([_warm_energy(m) for m in metrics], index=runs.index)
            runs = runs.join(warm)
        target = settings.get("target_accuracy")
        if target is not None:
            reached = pd.DataFrame([_to_target(m, target) for m in metrics], index=runs.index)
            runs = runs.join(reached)
        histories = {m["run"]: pd.DataFrame(m["history"]) for m in metrics if m["status"] == OK}
        numbers = {run: RunNumbers(m) for run, m in by_run.items()}
        return cls(
            key,
            settings.get("title") or key,
            baseline,
            runs,
            histories,
            by_run,
            target,
            numbers,
            job_noise or {},
        )

    @property
    def ok(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] == OK]

    @property
    def varying(self) -> list[str]:
        """Spec keys (without the `spec.` prefix) whose value differs between runs."""
        return varying_settings([m["spec"] for m in self.metrics.values()])

    @property
    def is_grid(self) -> bool:
        """The runs span nodes x processes and vary nothing else (B1, B2)."""
        return set(self.varying) - set(ENV_KEYS) == set(GRID_KEYS)

    @property
    def grid(self) -> pd.DataFrame:
        """The runs on the grid: those of the processes' default environment (ENV_KEYS; a
        record from before a setting has no column of it, and was of its default)."""
        on_grid = pd.Series(True, index=self.runs.index)
        for column in (f"spec.{key}" for key in ENV_KEYS if f"spec.{key}" in self.runs):
            on_grid &= self.runs[column].fillna("default") == "default"
        return self.runs[on_grid]

    @property
    def scales_workers(self) -> bool:
        """Runs differ in how many workers train, and only in how they are launched and which
        data path and step they use (A1, B1, B2)."""
        launch_keys = {"launcher", "replica_threads", "sharding", *GRID_KEYS, *PATH_KEYS, *ENV_KEYS}
        return self.runs["replicas"].nunique() > 1 and set(self.varying) <= launch_keys

    def scaling_reference(self, run: str) -> str | None:
        """What `run`'s speed-up is measured against: the baseline when it finished and shares
        the run's data path and the step it took, else the finished run with the fewest
        workers on that path (A1's DataLoader runs scale against single_gpu_dataloader, not
        single_gpu; DataParallel, which asks for a CUDA graph and steps eagerly, against
        single_gpu_eager, not the graph-replayed single_gpu)."""
        ok, row = self.ok, self.runs.loc[run]
        if row["status"] != OK:
            return None
        same = ok[(ok["spec.loader"] == row["spec.loader"]) & (ok["step_mode"] == row["step_mode"])]
        if same.empty:
            return None
        return self.baseline if self.baseline in same.index else same["replicas"].idxmin()

    def speedup(self, run: str) -> tuple[str, stats.Comparison] | None:
        """`run`'s throughput over its scaling reference's, as (reference, ratio with the
        interval of the seeds' samples/s and of the variation between jobs, stats.across_jobs);
        None for the reference itself or with none."""
        reference = self.scaling_reference(run)
        if reference in (None, run):
            return None
        samples = [self.seed_values(r, "samples_per_s") for r in (run, reference)]
        noise = self.job_noise.get(device_kind(self.metrics[run]))
        ratio = stats.across_jobs(samples[0], samples[1], noise)
        return reference, cast(stats.Comparison, ratio)  # (finished runs: both have values)

    @property
    def sweep_key(self) -> str | None:
        """The one numeric setting this study sweeps (A6 batch size, A7 accumulation), if any."""
        varying = self.varying
        if len(varying) != 1:
            return None
        values = self.runs[f"spec.{varying[0]}"]
        return varying[0] if pd.api.types.is_numeric_dtype(values) else None

    @property
    def memory(self) -> tuple[str, str] | None:
        """The memory this study compares, as (column, description): on GPUs the course's, the
        peak allocated bytes per GPU (the largest GPU's); on CPUs host RSS; None when no run
        finished. What a step adds (`step_memory`) is ours, shown beside it, never in its
        place."""
        if self.ok.empty:
            return None
        if self.ok["peak_gpu_mem_allocated_bytes"].notna().all():
            return "peak_gpu_mem_allocated_bytes", "peak GPU memory (max over GPUs)"
        return "peak_host_rss_bytes", "peak host RSS (max over ranks)"

    @property
    def step_memory(self) -> bool:
        """Whether every finished run recorded what a step adds (allocated bytes above what
        its GPU held as the first step began: training/results.py StepMemory)."""
        step = self.ok.get("step_gpu_mem_bytes")
        return step is not None and not self.ok.empty and bool(step.notna().all())

    @property
    def isolation(self) -> set[str]:
        """What the finished runs shared with other jobs (config `isolation`): `host` (no other
        job of the DAG; what else ran on the host is measured: `provenance`'s load),
        `devices` (the CPU package, not their cores or GPUs) or `none` (everything)."""

        def of(launch: dict[str, Any]) -> str:
            if "isolation" in launch:
                return launch["isolation"]
            return "host" if launch.get("exclusive") else "none"  # metrics before `isolation`

        return {of(m.get("launch") or {}) for m in self.metrics.values() if m["status"] == OK}

    def provenance(self) -> dict[str, Any]:
        """What the finished runs ran on, for one line under the section's answer: the data
        (name, SYNTHETIC or real, training samples), epochs, seeds, the card (or CPU) and
        whether the jobs had the host to themselves. A value that differs between runs lists
        each."""
        ran = [m for m in self.metrics.values() if m["status"] == OK]

        def each(values: list[Any]) -> str:
            distinct = list(dict.fromkeys(str(v) for v in values))
            return "/".join(distinct)

        if not ran:
            return {}
        data: list[Any] = [m.get("data") or {} for m in ran]
        hosts = [m["host"] for m in ran]
        cards = [  # what trained: a CPU run on a GPU host names the CPU
            cells.gpu_card(h)
            if h.get("gpus") and m["derived"].get("device") != "cpu"
            else f"CPU: {h['cpu_model']}"
            for m, h in zip(ran, hosts, strict=True)
        ]
        return {
            "dataset": each([d.get("name") for d in data]),
            "data": each([cells.DATA_NAMES.get(d.get("name"), d.get("name")) for d in data]),
            "synthetic": any(d.get("synthetic") for d in data),
            "nodes": (
                "nodes emulated on one host (its cores shared, loopback between them)"
                if any(m["derived"].get("nodes_emulated") for m in ran)
                else ""
            ),
            "train_samples": each([f"{d['n_train']:,}" for d in data if d.get("n_train")]),
            "epochs": each([m["spec"]["epochs"] for m in ran]),
            "seeds": each([record.seed_count(m) for m in ran]),
            "card": each(cards),
            "torch": each([h.get("torch") for h in hosts]),
            "isolation": "; ".join(SHARED.get(i, i) for i in sorted(self.isolation)),
            "load": _load(ran),
        }

    def model_table(self) -> dict[str, Any] | None:
        """The model as it ran, layer by layer (the record's `layers`: training/models.py
        describe), from the baseline run, else the first that finished: what the course asks a
        student to describe, with the parameters and the fp32 gradient DDP all-reduces. None
        where no finished run recorded it (records before it did)."""
        order = [self.baseline, *self.ok.index]
        run = next((r for r in order if r in self.ok.index and self.metrics[r].get("layers")), None)
        if run is None:
            return None
        layers = self.metrics[run]["layers"]
        total = sum(layer["parameters"] for layer in layers)
        rows = [
            [
                layer["layer"],
                layer["kind"],
                " × ".join(map(str, layer["output_shape"])),
                f"{layer['parameters']:,}" if layer["parameters"] else "",
            ]
            for layer in layers
        ]
        return {
            "run": run,
            "columns": ["layer", "kind", "output (one sample)", "parameters"],
            "rows": rows,
            "total": f"{total:,} parameters, {4 * total / cells.MIB:.2f} MiB of fp32 gradient",
        }

    @property
    def key_columns(self) -> list[tuple[str, str]]:
        """The columns a study's question asks about, shown without scrolling: accuracy,
        throughput of the steady epochs, and the memory the study compares."""
        headers = dict(self.result_columns)
        columns = ["test_accuracy", "samples_per_s"]
        if self.memory is not None:
            columns.append(self.memory[0])
            if self.step_memory:  # and, ours, the part of that peak a step adds
                columns.append("step_gpu_mem_bytes")
            pools = self.ok.get("graph_pool_reserved_bytes")
            if pools is not None and (pools > 0).any():  # where replayed steps' activations live
                columns.append("graph_pool_reserved_bytes")
        return [(c, headers[c]) for c in columns]

    def key_table(self) -> dict[str, Any]:
        """`results_table` with the key columns only; a run skipped for the reason of a run
        above it says so instead of repeating it (the full table repeats every reason)."""
        table = self.results_table(self.key_columns)
        first: dict[str, str] = {}
        for row in table["rows"]:
            if row["status"] == OK or not row["reason"]:
                continue
            if row["reason"] in first:
                row["reason"] = f"the reason given for {first[row['reason']]}"
            else:
                first[row["reason"]] = row["run"]
        return table

    def settings_table(self) -> dict[str, Any]:
        """What was run: one row per run, one column per setting that varies, and the step each
        run took (a DataParallel run asked for a graph steps eagerly; a run that did not train
        took none)."""
        columns = ["run", *self.varying, "step taken"]
        rows = [
            [
                run,
                *(cells.setting(self.runs.at[run, f"spec.{k}"]) for k in self.varying),
                step_taken(self.metrics[run]),
            ]
            for run in self.runs.index
        ]
        return {"columns": columns, "rows": rows}

    def by_seed(self, run: str, metric: str) -> dict[Any, float]:
        """`seed_values`, keyed by seed (a run's one value, where the seeds don't record it,
        by "job"): what stats.paired pairs."""
        if metric == WARM_ENERGY:
            return self.numbers[run].by_seed("train_energy_j", record.TO_TARGET)
        if metric not in record.SEED_METRICS:
            values = self.seed_values(run, metric)
            return {"job": values[0]} if values else {}
        return self.numbers[run].by_seed(metric)

    def seed_values(self, run: str, metric: str) -> list[float]:
        """`run`'s values of `metric` over the seeds it counts (record.counted_seeds, the one
        rule: the finished seeds, a warm process's for GPU memory), what its mean, interval
        and every comparison come from; a metric the seeds don't record (host RSS, the job's
        peak over its ranks) is the run's one value."""
        if metric == WARM_ENERGY:
            return self.numbers[run].values("train_energy_j", record.TO_TARGET)
        if metric not in record.SEED_METRICS:
            value = self.runs.at[run, metric]
            return [] if pd.isna(value) else [float(value)]
        return self.numbers[run].values(metric)

    def seconds_to_target(self, run: str) -> list[float] | None:
        """Each timed seed's time to the study's target accuracy (record.timed_seeds), None
        unless every seed reached it."""
        assert self.target_accuracy is not None  # asked only of a study with a target
        return targets.timed_to_target(self.metrics[run], self.target_accuracy, 0)

    def joules_to_target(self, run: str) -> list[float] | None:
        """Each timed seed's GPU energy to the target accuracy, None unless every seed reached
        it with its energy measured."""
        assert self.target_accuracy is not None  # asked only of a study with a target
        return targets.timed_to_target(self.metrics[run], self.target_accuracy, 2)

    @property
    def energy_measured(self) -> bool:
        """Whether any finished run has its GPUs' energy (the energy columns, figure and
        comparisons are shown only then)."""
        ok = self.ok
        return not ok.empty and ok["train_energy_j"].notna().any()

    @property
    def energy_column(self) -> tuple[str, str]:
        """(column, how it is counted) that compares the runs' energy: per steady epoch, or over
        the whole training where a measured run has no steady epoch's (a single epoch, or
        epochs too short for the counter: `steady_energy_reason`), in the seeds of a warm
        process (`WARM_ENERGY`)."""
        measured = self.ok[self.ok["train_energy_j"].notna()]
        if measured["steady_epoch_energy_j"].isna().any():
            return WARM_ENERGY, "over the training (seeds of a warm process)"
        return "steady_epoch_energy_j", "per steady epoch"

    def steady_energy_reason(self, run: str) -> str | None:
        """Why `run`'s steady epoch has no joules although its energy was measured (its first
        seed's reason: training/energy.resolution_reason), or None."""
        for seed in self.metrics[run].get("seeds", []):
            if reason := (seed.get("energy") or {}).get("steady_epoch_energy_reason"):
                return reason
        return None

    @property
    def no_energy_reasons(self) -> dict[str, list[str]]:
        """Why finished runs have no energy: reason -> runs."""
        reasons: dict[str, list[str]] = {}
        for run, row in self.ok.iterrows():
            if pd.isna(row["train_energy_j"]):
                reason = row.get("energy_reason") or "not recorded (metrics from before energy)"
                reasons.setdefault(reason, []).append(run)
        return reasons

    @property
    def single_seed_runs(self) -> list[str]:
        """The finished runs that trained one seed: their numbers have no interval."""
        ok = self.ok
        return [] if ok.empty else list(ok.index[ok["n_seeds"] == 1])

    @property
    def result_columns(self) -> list[tuple[str, str]]:
        """RESULT_COLUMNS, the GPU energy where it was measured, and with a target accuracy the
        time, epochs (and energy) to reach it."""
        energy = self.energy_measured
        columns = [*RESULT_COLUMNS, *(ENERGY_COLUMNS if energy else [])]
        if self.target_accuracy is None:
            return columns
        target = f"{100 * self.target_accuracy:g}%"
        columns += [
            ("time_to_target_s", f"Time to {target} test acc. (s)"),
            ("epochs_to_target", f"Epochs to {target}"),
        ]
        if energy:
            columns.append(("energy_to_target_j", f"GPU energy to {target} (J)"))
        return [*columns, ("seeds_to_target", "Seeds that reached it")]

    def results_table(self, columns: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        """The results of every run in `columns` (by default every result column), each mean
        over seeds with its 95% interval; runs that did not finish carry their reason only."""
        columns = columns or self.result_columns
        rows = []
        for run, row in self.runs.iterrows():
            ran = row["status"] == OK
            # (A study where no run finished has no columns of numbers at all.)
            shown = [
                cells.cell(
                    row.get(col),
                    cells.FORMATS[col],
                    shown=ran,
                    ci95=_ci95(row, col),
                    bounds=cells.bounds_of(col),
                )
                for col, _ in columns
            ]
            rows.append(
                {"run": run, "status": row["status"], "reason": row["reason"] or "", "cells": shown}
            )
        return {"columns": [header for _, header in columns], "rows": rows}

    def results_frame(self) -> pd.DataFrame:
        """The results as numbers (for CSV): numeric columns blank unless the run is `ok`, each
        mean over seeds followed by its interval's half-width (`<column>_ci95`)."""
        columns = ["run", "status", "reason", *(f"spec.{k}" for k in self.varying)]
        numeric = ["n_seeds"]
        for column, _ in self.result_columns:
            if column not in ("device", "effective_precision", "seeds_to_target"):
                with_ci = column in INTERVAL_COLUMNS | TARGET_COLUMNS
                numeric += [column, f"{column}_ci95"] if with_ci else [column]
        text = ["device", "effective_precision"]
        if self.target_accuracy is not None:
            text.append("seeds_to_target")
        frame = self.runs.reindex(columns=[*columns, *text, *numeric])
        frame.loc[frame["status"] != OK, [*text[1:], *numeric]] = None
        return frame


# How a step ran (training/steps.py `step_record`), in words.
STEP_MODES = {"cuda_graph": "CUDA graph", "eager": "eager"}


def step_taken(metrics: dict[str, Any]) -> str:
    """The step a run took: "CUDA graph", "eager", "compiled, CUDA graph", ...; empty for a run
    that did not train."""
    step = metrics.get("step") or {}
    if metrics["status"] != OK or not step.get("mode"):
        return ""
    mode = STEP_MODES.get(step["mode"], step["mode"])
    return f"compiled, {mode}" if step.get("compiled") else mode


def _ci95(row: pd.Series, column: str) -> float | None:
    """The half-width of the 95% interval of `column`'s mean, where the column shows one."""
    return row.get(f"{column}_ci95") if column in INTERVAL_COLUMNS | TARGET_COLUMNS else None


def _warm_energy(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's GPU energy over the training in the seeds of a warm process (targets.warm_energy)."""
    estimate = targets.warm_energy(metrics) if metrics["status"] == OK else None
    if estimate is None:
        return {}
    return {WARM_ENERGY: estimate.mean, f"{WARM_ENERGY}_ci95": estimate.half_width}


def _to_target(metrics: dict[str, Any], target: float) -> dict[str, Any]:
    """A run's time, epochs and energy to `target` (targets.to_target), for a run that finished."""
    return targets.to_target(metrics, target) if metrics["status"] == OK else {}


def _gpu_memory_per_gpu(metrics: dict[str, Any]) -> str | None:
    """Peak allocated memory of every GPU, rank by rank, e.g. '312.1 / 313.8', each the mean
    over the seeds the run's peak is counted over (record.per_gpu_peaks)."""
    if metrics["status"] != OK:
        return None
    return " / ".join(cells.mib(b) for b in record.per_gpu_peaks(metrics) or []) or None


def _load(ran: list[dict[str, Any]]) -> str:
    """What shared the host, as measured rather than as configured: the host's 1-minute load
    average as each run began against its cores, and how far apart one seed's steady epochs
    (identical work) ran, the most over the runs' seeds; empty where neither was recorded."""
    loads = [
        m["launch"]["load_average_before"][0]
        for m in ran
        if (m.get("launch") or {}).get("load_average_before")
    ]
    cores = {m["host"].get("cpu_count") for m in ran} - {None}
    spreads = [
        max(e) / min(e)
        for m in ran
        for seed in m.get("seeds") or []
        if len(e := record.steady_epochs(seed)) > 1 and min(e) > 0
    ]
    parts = []
    if loads:
        span = (
            f"{min(loads):.1f}–{max(loads):.1f}" if max(loads) > min(loads) else f"{loads[0]:.1f}"
        )
        on = f"/{'/'.join(map(str, sorted(cores)))} cores" if cores else ""
        parts.append(f"load {span}{on}")
    if spreads:
        parts.append(f"epochs ≤{max(spreads):.2f}× apart")
    return "; ".join(parts)


def device_kind(metrics: dict[str, Any]) -> str:
    """ "cuda" or "cpu": where a run's first rank trained."""
    return "cuda" if str(metrics["derived"].get("device")).startswith("cuda") else "cpu"
