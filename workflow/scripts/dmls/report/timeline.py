"""The DAG's timeline and where each job's time went, from the runs' metrics.json and the
special studies' summary.json (the report's "DAG timeline" section and bench/dag_table.py).

For each training run: its start and end stamps, the GPUs and cores it held (its reservation,
under `isolation: host|devices`) and how long it waited for them, and its seconds split into
the launcher's share (torchrun's agent, rendezvous, spawning and reaping the ranks), rank 0's
imports, setup (joining the process group, NCCL's init included; data, model, optimizer),
training, evaluation, checkpoints and teardown. Special studies have their start and wall time.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from dmls import record
from dmls.files import new_figure
from dmls.report.cells import gpu_card
from dmls.summary import read as read_summary

SPLIT = ("launcher_s", "import_s", "setup_s", "train_s", "eval_s", "ckpt_s", "teardown_s")
COLUMNS = {
    "job": "job",
    "status": "status",
    "start_s": "start (s)",
    "end_s": "end (s)",
    "gpus": "GPUs",
    "cores": "cores",
    "waited_s": "waited for a slot (s)",
    "launcher_s": "launcher (s)",
    "import_s": "imports (s)",
    "setup_s": "setup (s)",
    "train_s": "training (s)",
    "eval_s": "evaluation (s)",
    "ckpt_s": "checkpoints (s)",
    "teardown_s": "teardown (s)",
}


def run_row(m: dict[str, Any], benchmarks: Path | None = None) -> dict[str, Any]:
    """One training run's row (its metrics.json `m`); `benchmarks` is the results folder's
    benchmarks/train, whose Snakemake benchmark gives the whole job's seconds."""
    timing, launch = m.get("timing") or {}, m.get("launch") or {}
    seconds = launch.get("seconds")
    inside = (timing.get("import_s") or 0) + (timing.get("wall_time_s") or 0)
    reserved = m.get("reserved") or {}
    bench = benchmarks / m["study"] / f"{m['run']}.tsv" if benchmarks else None
    job = pd.read_csv(bench, sep="\t")["s"].iloc[0] if bench and bench.exists() else None
    return {
        "job": f"{m['study']}/{m['run']}",
        "status": m["status"],
        "machine": machine(m.get("host") or {}),
        "step": (m.get("step") or {}).get("mode", ""),
        "start": _stamp(m.get("started_at")),
        "end": _stamp(m.get("finished_at")),
        "gpu_ids": [str(g) for g in reserved.get("gpus", [])],
        "gpus": len(reserved.get("gpus", [])),
        "cores": len(reserved.get("cores", [])),
        "waited_s": reserved.get("waited_s"),
        # The whole job (Snakemake's benchmark) and the part from starting the launcher to its
        # exit; the difference is the supervisor's (imports, probing the host).
        "job_s": job,
        "seconds": seconds,
        # The launcher's own share, around what rank 0 timed itself.
        "launcher_s": seconds - inside if seconds and inside else None,
        "import_s": timing.get("import_s"),
        "setup_s": timing.get("setup_s"),
        "pg_s": timing.get("process_group_s"),
        "train_s": timing.get("train_time_s"),
        "eval_s": timing.get("eval_time_s"),
        "ckpt_s": timing.get("checkpoint_time_s"),
        "teardown_s": timing.get("teardown_s"),
        "epochs": len(m.get("history") or []),
    }


def study_row(s: dict[str, Any]) -> dict[str, Any]:
    """One special study's row (its summary.json `s`): the GPUs and cores it held where it
    reserved them (a timed study under isolation), else its threads as cores and no GPUs
    known."""
    start = _stamp(s.get("started_at"))
    seconds = s.get("wall_time_s")
    end = start + pd.Timedelta(seconds=seconds) if start is not None and seconds else None
    reserved = s.get("reserved") or {}
    return {
        "job": f"study {s['study']}",
        "status": s["status"],
        "start": start,
        "end": end,
        "machine": machine(s.get("host") or {}),
        "gpu_ids": [str(g) for g in reserved.get("gpus", [])],
        "gpus": len(reserved.get("gpus", [])),
        "cores": len(reserved["cores"]) if reserved else s.get("threads"),
        "waited_s": reserved.get("waited_s"),
        "seconds": seconds,
    }


def from_results(results: Path) -> list[dict[str, Any]]:
    """Every run's and special study's row of a results folder, each file read through its
    owner (record.read, dmls.summary.read: a damaged one is named, with how to rebuild it)."""
    benchmarks = results / "benchmarks" / "train"
    rows = [
        run_row(record.read(p), benchmarks) for p in sorted(results.glob("runs/*/*/metrics.json"))
    ]
    studies = sorted(results.glob("studies/*/summary.json"))
    return rows + [study_row(read_summary(p)) for p in studies]


def machine(host: dict[str, Any]) -> str:
    """A host in words that tell two machines of one hostname apart (lent GPU hosts are all
    "vm"): "host vm (64 cores of Intel Xeon; 4× NVIDIA H200)", "host vm (2 cores of …; no
    GPU)"."""
    cpu = host.get("cpu_model") or "an unnamed CPU"
    if cores := host.get("cpu_count"):
        cpu = f"{cores} cores of {cpu}"
    return f"host {host.get('hostname', '?')} ({cpu}; {gpu_card(host) or 'no GPU'})"


def _stamp(text: str | None) -> pd.Timestamp | None:
    return pd.Timestamp(datetime.fromisoformat(text)) if text else None


def with_offsets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that have start and end stamps, each with its start and end in seconds since
    the first start, in start order."""
    timed = [r for r in rows if r.get("start") is not None and r.get("end") is not None]
    if not timed:
        return []
    zero = min(r["start"] for r in timed)
    out = [
        r
        | {
            "start_s": (r["start"] - zero).total_seconds(),
            "end_s": (r["end"] - zero).total_seconds(),
        }
        for r in timed
    ]
    return sorted(out, key=lambda r: r["start_s"])


def lanes(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(lane, row) bars: a job holding GPUs on each of its GPUs' lanes; every other job on the
    first CPU lane free at its start (so jobs side by side stack)."""
    bars: list[tuple[str, dict[str, Any]]] = []
    cpu_free: list[float] = []  # each CPU lane's end so far
    for r in rows:
        if r.get("gpu_ids"):
            bars += [(f"GPU {g}", r) for g in r["gpu_ids"]]
            continue
        lane = next((i for i, end in enumerate(cpu_free) if end <= r["start_s"]), None)
        if lane is None:
            cpu_free.append(r["end_s"])
            lane = len(cpu_free) - 1
        cpu_free[lane] = r["end_s"]
        bars.append((f"CPU {lane + 1}", r))
    return bars


# An idle gap this long between jobs splits a folder's jobs into sittings (a DAG, then runs
# added to its folder later): the header gives each sitting's wall time and the figure draws
# each on an axis of its own, without the idle hours between them. A job that starts on a
# machine the sitting has not used, after a shorter idle gap, starts one too (a study trained
# again on another host, its records merged into the folder).
SITTING_GAP_S = 600.0
NEW_MACHINE_GAP_S = 30.0


def sittings(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The (start_s, end_s) spans of the rows' sittings, in time order."""
    spans: list[list[float]] = []
    machines: set[Any] = set()  # the current sitting's
    for r in sorted(rows, key=lambda r: r["start_s"]):
        gap = r["start_s"] - spans[-1][1] if spans else math.inf
        elsewhere = r.get("machine") not in machines and gap >= NEW_MACHINE_GAP_S
        if gap >= SITTING_GAP_S or elsewhere:
            spans.append([r["start_s"], r["end_s"]])
            machines = set()
        spans[-1][1] = max(spans[-1][1], r["end_s"])
        machines.add(r.get("machine"))
    return [(start, end) for start, end in spans]


def figure(rows: list[dict[str, Any]]):
    """The timeline: one bar per job and GPU it held (CPU jobs on stacked CPU lanes), training
    runs in blue, special studies in orange, runs that did not finish hatched; a sitting after
    an idle gap on an axis of its own."""
    bars = lanes(rows)
    names = sorted({lane for lane, _ in bars}, key=lambda n: (n.split()[0], int(n.split()[1])))
    spans = sittings(rows)
    hosts = {r.get("machine") for r in rows}
    fig = new_figure(11, max(2.5, 0.32 * len(names) + 1.2))
    widths = [max(end - start, 1.0) for start, end in spans]
    axes = fig.subplots(1, len(spans), sharey=True, squeeze=False, width_ratios=widths)[0]
    for k, (ax, (start, end)) in enumerate(zip(axes, spans, strict=True)):
        for lane, r in bars:
            study = r["job"].startswith("study ")
            ax.barh(
                names.index(lane),
                r["end_s"] - r["start_s"],
                left=r["start_s"],
                height=0.7,
                color="C1" if study else "C0",
                edgecolor="white",
                linewidth=0.5,
                hatch=None if r["status"] == "ok" else "//",
            )
        pad = 0.02 * (end - start) + 1.0
        ax.set_xlim(start - pad, end + pad)
        ax.grid(axis="x", alpha=0.3)
        if len(spans) > 1:
            on = {r.get("machine") for r in rows if start <= r["start_s"] <= end}
            where = f"\n{on.pop()}" if len(on) == 1 and len(hosts) > 1 else ""
            ax.set_title(f"sitting {k + 1}{where}", fontsize=8)
    axes[0].set_yticks(range(len(names)), names)
    axes[0].invert_yaxis()
    fig.supxlabel("seconds since the first job started", fontsize=10)
    fig.suptitle("The DAG's jobs over time", fontsize=11)
    return fig


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-job split as text cells (blank where a job has no such part)."""

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return ""
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    return {
        "columns": list(COLUMNS.values()),
        "rows": [[cell(r.get(k)) for k in COLUMNS] for r in rows],
    }


def summary(rows: list[dict[str, Any]]) -> str:
    """The jobs' seconds against the DAG's span: how much ran side by side."""
    if not rows:
        return ""
    span = max(r["end_s"] for r in rows)
    busy = sum(r["end_s"] - r["start_s"] for r in rows)
    if not span:
        return ""
    spans = sittings(rows)
    if len(spans) == 1:
        return (
            f"{len(rows)} jobs over {span:.0f} s; their own times add up to {busy:.0f} s "
            f"({busy / span:.1f} jobs at a time on average)."
        )
    within = sum(end - start for start, end in spans)
    return (
        f"{len(rows)} jobs over {span:.0f} s, {span - within:.0f} s of it between "
        f"{len(spans)} sittings with none running (runs added later); their own times add up "
        f"to {busy:.0f} s ({busy / within:.1f} jobs at a time within the sittings)."
    )


def beside(job: str, rows: list[dict[str, Any]]) -> str | None:
    """What else of the DAG ran while `job` did, from the recorded stamps: "no other job of
    this DAG ran meanwhile", or "beside 3 other jobs of this DAG for 42% of its time" (the
    share of its span that at least one other job overlapped); None without its stamps. A
    skipped job did no work and counts for nothing."""
    mine = next((r for r in rows if r["job"] == job), None)
    if mine is None or mine.get("start") is None or mine.get("end") is None:
        return None
    start, end = mine["start"], mine["end"]
    others = [
        (max(o["start"], start), min(o["end"], end))
        for o in rows
        if o is not mine
        and o.get("start") is not None
        and o.get("end") is not None
        and o["status"] != "skipped"
        and o["start"] < end
        and start < o["end"]
    ]
    if not others:
        return "no other job of this DAG ran meanwhile"
    covered, reach = pd.Timedelta(0), start
    for a, b in sorted(others):  # (the union of the overlaps)
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    share = covered / (end - start) if end > start else 1.0
    jobs = f"{len(others)} other job{'s' if len(others) > 1 else ''}"
    return f"beside {jobs} of this DAG for {share:.0%} of its time"
