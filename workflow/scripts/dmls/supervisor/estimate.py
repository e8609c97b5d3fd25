"""How long the DAG will take on this host, said when it starts (issue #41): an estimate, and
said to be one.

Each job Snakemake is about to run gets a time from costs measured on a reference host
(config/costs.yaml, written by tools/calibrate_costs.py from a results folder):

- a training run: its measured run's fixed time (launcher, imports, setup, teardown) plus, for
  every seed, its setup and warm-up (the first seed's includes capturing the step) and every
  epoch's training and evaluation scaled by samples, and checkpoint; a run the reference did
  not measure takes the costs of the runs most like it (same device, launcher, processes, step,
  loader, precision, then fewer of these); a run this host skips takes a skipped job's time;
- a special study: its measured time, as it ran there (not scaled by its settings: where they
  differ, the estimate names the keys);
- every other job (data, aggregation, the report): its rule's median time.

Then the jobs are packed onto this host as Snakemake starts them: whenever cores or GPUs free
up, the ready job of highest priority that fits starts (a job is ready when the jobs it needs
have finished). The reference is the cost table's `cpu` section on a host without a GPU and its
`cuda` section on a host with one; each job runs as fast as it did there.
"""

from __future__ import annotations

import heapq
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dmls.config.data_sizes import epoch_samples, known_test_samples
from dmls.config.spec import RunSpec
from dmls.supervisor.hardware import Host, missing_requirement, resolved_device

# What makes a run like another, most telling first: a run not measured takes the costs of
# those that agree with it on the most of these, in this order.
LIKENESS = ("device", "launcher", "processes", "step", "loader", "precision")
# A run's per-seed and per-epoch costs (tools/calibrate_costs.py writes them).
RUN_COSTS = ("fixed_s", "seed_s", "first_warmup_s", "train_s_per_sample", "eval_s_per_sample",
             "checkpoint_s")  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One job of the DAG as Snakemake will schedule it: what it is (`rule`, and the run or
    study it runs), what it holds and when it may start."""

    jobid: int
    rule: str
    name: str  # a run id, a special study's name, or the rule's own
    threads: int
    gpus: int
    priority: int
    needs: tuple[int, ...] = ()


@dataclass
class Estimate:
    """Each job's seconds and how they were found, and the DAG's wall when packed."""

    seconds: dict[int, float] = field(default_factory=dict)
    basis: dict[int, str] = field(default_factory=dict)  # measured, similar, skipped, rule, none
    # Special studies set otherwise than when measured: their keys that differ.
    changed: dict[str, list[str]] = field(default_factory=dict)
    wall_s: float = 0.0


def plain(resource: Any) -> int:
    """A Snakemake resource's number (its Resource object's value, or the number itself)."""
    value = getattr(resource, "value", resource)
    return int(value or 0)


def jobs_of(workflow: Any) -> list[Job] | None:
    """The jobs a Snakemake `workflow` is about to run (its DAG's jobs that need to run, read
    from the scheduler's own objects at onstart), as `Job`s; None where this Snakemake doesn't
    expose them (its internals moved)."""

    def name(job: Any) -> str:
        if job.rule.name == "train":
            return f"{job.wildcards.study}/{job.wildcards.run}"
        summary = [Path(f) for f in job.output if Path(f).name == "summary.json"]
        return summary[0].parent.name if summary else job.rule.name

    try:
        dag = workflow.dag
        return [
            Job(
                jobid=job.jobid,
                rule=job.rule.name,
                name=name(job),
                threads=plain(job.threads),
                gpus=plain(job.resources.get("gpu")),
                priority=job.priority,
                needs=tuple(dep.jobid for dep in dag.dependencies[job]),
            )
            for job in dag.needrun_jobs()
        ]
    except AttributeError:
        return None


def load_costs(path: Path) -> dict[str, Any]:
    """The cost table (config/costs.yaml)."""
    return yaml.safe_load(path.read_text()) or {}


def likeness(spec: RunSpec, host: Host) -> dict[str, Any]:
    """What `LIKENESS` compares of a run, as it runs on `host`."""
    return {
        "device": resolved_device(spec, host),
        "launcher": spec.launcher,
        "processes": spec.processes,
        "step": spec.step,
        "loader": spec.loader,
        "precision": spec.precision,
    }


def run_costs(spec: RunSpec, host: Host, measured: Mapping[str, Mapping]) -> tuple[dict, str]:
    """The costs a run takes: its own where the reference measured it ("measured"), else the
    median of the measured runs most like it ("similar"); none where nothing was measured."""
    if not measured:
        return {}, "none"
    if spec.run_id in measured:
        return dict(measured[spec.run_id]), "measured"
    mine = likeness(spec, host)
    for keys in range(len(LIKENESS), 0, -1):
        wanted = {k: mine[k] for k in LIKENESS[:keys]}
        alike = [c for c in measured.values() if all(c.get(k) == v for k, v in wanted.items())]
        if alike:
            return {k: statistics.median(c[k] for c in alike) for k in RUN_COSTS}, "similar"
    return {k: statistics.median(c[k] for c in measured.values()) for k in RUN_COSTS}, "similar"


def run_seconds(spec: RunSpec, costs: Mapping[str, float], n_train: int, n_eval: int) -> float:
    """A run's seconds from its costs: the fixed part, each seed's setup and warm-up, and each
    epoch's training over `n_train` samples, evaluation over `n_eval` and checkpoint."""
    epoch = (
        costs["train_s_per_sample"] * n_train
        + costs["eval_s_per_sample"] * n_eval
        + costs["checkpoint_s"]
    )
    seeds = spec.seeds * costs["seed_s"] + costs["first_warmup_s"]
    return costs["fixed_s"] + seeds + spec.seeds * spec.epochs * epoch


def samples(
    spec: RunSpec, config: Mapping[str, Any], schema: Mapping[str, Any], measured: Mapping[str, Any]
) -> tuple[int, int]:
    """A run's training samples per epoch and the samples it evaluates each epoch (test and
    validation), as the config fixes them; where it doesn't (the user's own files), the
    measured run's."""
    data = config.get("data") or {}
    sized = epoch_samples(spec, data, schema)
    n_train = sized[0] if sized else measured.get("n_train", 10_000)
    n_test = spec.test_samples or known_test_samples(spec.dataset, data, schema)
    n_test = n_test or measured.get("n_test", 10_000)
    return n_train, n_test + spec.validation_samples


def job_seconds(
    jobs: Iterable[Job],
    runs: Mapping[str, RunSpec],
    host: Host,
    section: Mapping[str, Any],
    config: Mapping[str, Any],
    schema: Mapping[str, Any],
) -> Estimate:
    """Every job's seconds on this host from the cost table's `section` (the module's doc)."""
    out = Estimate()
    measured = section.get("runs") or {}
    rules = section.get("rules") or {}
    studies = section.get("studies") or {}
    for job in jobs:
        if job.rule == "train":
            spec = runs[job.name]
            if missing_requirement(spec, host, nodes_here=spec.nodes):
                seconds, basis = section.get("skipped_job_s", 0.0), "skipped"
            else:
                costs, basis = run_costs(spec, host, measured)
                n_train, n_eval = samples(spec, config, schema, measured.get(spec.run_id, {}))
                seconds = run_seconds(spec, costs, n_train, n_eval) if costs else 0.0
        elif job.name in studies:
            seconds, basis = studies[job.name]["seconds"], "measured"
            mine = (config.get("special_studies") or {}).get(job.name) or {}
            ran = studies[job.name].get("settings") or {}
            if changed := sorted(k for k in ran if k in mine and mine[k] != ran[k]):
                out.changed[job.name] = changed
        elif job.rule in rules:
            seconds, basis = rules[job.rule], "rule"
        else:
            seconds, basis = 0.0, "none"
        out.seconds[job.jobid], out.basis[job.jobid] = float(seconds), basis
    return out


def pack(jobs: list[Job], seconds: Mapping[int, float], cores: int, gpus: int | None) -> float:
    """The wall time of `jobs` on `cores` cores and `gpus` GPUs (None: GPUs not scheduled), as
    Snakemake runs them: whenever a job ends, the ready jobs start in order of priority (then
    of the DAG) while they fit; a job asking for more than the host has gets all of it."""
    byid = {job.jobid: job for job in jobs}
    todo = dict(byid)
    done: set[int] = set()
    running: list[tuple[float, int]] = []  # (end, jobid)
    free_cores, free_gpus, now = cores, gpus or 0, 0.0

    def holds(job: Job) -> tuple[int, int]:
        return min(max(job.threads, 1), cores), (min(job.gpus, gpus) if gpus is not None else 0)

    while todo or running:
        # (a job it needs outside `jobs` is one Snakemake has no need to run: done already)
        ready = [j for j in todo.values() if all(n in done or n not in byid for n in j.needs)]
        for job in sorted(ready, key=lambda j: (-j.priority, j.jobid)):
            c, g = holds(job)
            if c <= free_cores and g <= free_gpus:
                free_cores, free_gpus = free_cores - c, free_gpus - g
                heapq.heappush(running, (now + seconds.get(job.jobid, 0.0), job.jobid))
                del todo[job.jobid]
        if not running:  # (nothing fits and nothing runs: a cycle, which a DAG has not)
            break
        now, jobid = heapq.heappop(running)
        done.add(jobid)
        c, g = holds(byid[jobid])
        free_cores, free_gpus = free_cores + c, free_gpus + g
    return now


def estimate(
    jobs: list[Job],
    runs: Mapping[str, RunSpec],
    host: Host,
    cores: int,
    gpus: int | None,
    costs: Mapping[str, Any],
    config: Mapping[str, Any],
    schema: Mapping[str, Any],
) -> tuple[Estimate, Mapping[str, Any]]:
    """Every job's seconds and the DAG's packed wall on this host, from the section of `costs`
    for a host of its kind; and that section."""
    section = costs.get("cuda" if host.gpu_count else "cpu") or {}
    out = job_seconds(jobs, runs, host, section, config, schema)
    out.wall_s = pack(jobs, out.seconds, cores, gpus)
    return out, section


def duration(seconds: float) -> str:
    """`seconds` as a reader says it: "40 s", "12 min", "2 h 5 min"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def said(
    jobs: list[Job],
    est: Estimate,
    section: Mapping[str, Any],
    cores: int,
    gpus: int | None,
    longest: int = 3,
) -> str:
    """The estimate as the DAG says it when it starts: the wall, what it rests on, the longest
    jobs, and the jobs that had no measured cost."""
    if not section.get("runs"):
        return (
            "No estimate of the DAG's time: config/costs.yaml has no costs for a host of "
            "this kind (its `cpu` section is read on a host without a GPU, `cuda` on one "
            "with; tools/calibrate_costs.py writes them from a finished DAG)."
        )
    where = section["measured_on"]["host"]
    gpu_word = f"{gpus} GPU(s)" if gpus else "no GPU scheduled" if gpus is None else "no GPU"
    top = sorted(jobs, key=lambda j: -est.seconds[j.jobid])[:longest]
    counts = {b: sum(1 for v in est.basis.values() if v == b) for b in set(est.basis.values())}
    lines = [
        f"Estimated time for these {len(jobs)} jobs here: about {duration(est.wall_s)} "
        f"(an estimate, not a measurement: each job's time as measured on {where}, "
        "config/costs.yaml, scaled to this config's samples, epochs and seeds, packed onto "
        f"{cores} core(s) and {gpu_word} in Snakemake's order).",
        "  longest: " + ", ".join(f"{j.name} ~{duration(est.seconds[j.jobid])}" for j in top),
    ]
    if counts.get("similar"):
        lines.append(
            f"  {counts['similar']} run(s) not measured there take the costs of the "
            "runs most like them (device, launcher, processes, step)."
        )
    if est.changed:
        studies = "; ".join(f"{name} ({', '.join(keys)})" for name, keys in est.changed.items())
        lines.append(f"  set otherwise than when measured, taken at the measured time: {studies}")
    if counts.get("none"):
        unknown = sorted({j.name for j in jobs if est.basis[j.jobid] == "none"})
        lines.append(f"  no cost known (counted as 0 s): {', '.join(unknown)}")
    return "\n".join(lines)


def write_estimate(
    path: Path, jobs: list[Job], est: Estimate, cores: int, gpus: int | None
) -> None:
    """The estimate as JSON beside the DAG's logs, for bench/dag_table.py to set against what
    each job and the whole DAG took."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "job": j.name,
            "rule": j.rule,
            "seconds": round(est.seconds[j.jobid], 1),
            "basis": est.basis[j.jobid],
        }
        for j in jobs
    ]
    body = {"wall_s": round(est.wall_s, 1), "cores": cores, "gpus": gpus, "jobs": rows}
    path.write_text(json.dumps(body, indent=1) + "\n")
