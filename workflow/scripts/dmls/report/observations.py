"""Sentences computed from a study's numbers: every figure in them comes from the run files."""

from __future__ import annotations

import re
from typing import cast

import numpy as np
import pandas as pd

from dmls.report import quantities, targets
from dmls.report.causes import cause
from dmls.report.cells import MIB, joules
from dmls.report.communication import communication
from dmls.report.comparisons import METRICS, NotMeasured, also_differ, fit
from dmls.report.study import OK, Study, device_kind
from dmls.report.wording import in_s, points_text, ratio_text

# The verdict's words (dmls.stats.verdict) for more and less of what a sentence compares.
WORDS = {
    "samples_per_s": (METRICS["samples_per_s"].more, METRICS["samples_per_s"].less),
    "memory": (METRICS["step_gpu_mem_bytes"].more, METRICS["step_gpu_mem_bytes"].less),
    "energy": ("more energy", "less energy"),
}


def status_summary(study: Study) -> list[str]:
    """How the runs ended, with the reason of every run that has no numbers."""
    runs = study.runs
    line = f"{(runs['status'] == OK).sum()} of {len(runs)} runs finished"
    others = runs[runs["status"] != OK]
    if others.empty:
        return [line + "."]
    listed = ", ".join(f"{run} ({row['status']})" for run, row in others.iterrows())
    return [f"{line}; no numbers for {listed}: the reasons are in the results table."]


def seed_note(study: Study) -> list[str]:
    """Once per study: the finished runs that trained one seed, whose numbers (and comparisons
    with them) have no interval, so no difference can be told from seed noise."""
    single = study.single_seed_runs
    if not single:
        return []
    if len(single) == len(study.ok):
        return [
            "This study ran with one seed, so its numbers have no intervals and no difference "
            "between its runs can be told apart from seed noise."
        ]
    return [f"One seed only, so no interval for their numbers or comparisons: {', '.join(single)}."]


def versus_baseline(study: Study) -> list[str]:
    """Throughput, accuracy and memory of every finished run against the study's baseline, each
    compared over the seeds (a ratio or a difference with its 95% interval), naming every
    setting the two differ in (the step each took included): a pair that changes more than one
    thing says so."""
    base_name = study.baseline
    base = study.runs.loc[base_name]
    if base["status"] != OK:
        return [
            f"The baseline {base_name} has no numbers ({base['status']}), so no run is "
            "compared with it."
        ]
    lines = []
    for run, (throughput, accuracy) in baseline_comparisons(study).items():
        row = study.runs.loc[run]
        means = " vs ".join(
            f"{quantities.mean(study, r, 'samples_per_s'):,.0f}" for r in (run, base_name)
        )
        parts = [
            f"samples/s over the steady epochs {means} (geometric means): "
            f"{ratio_text(throughput, *WORDS['samples_per_s'])}",
            f"test accuracy {_percent(row['test_accuracy'])} vs "
            f"{_percent(base['test_accuracy'])}, {points_text(accuracy)}",
        ]
        memory = study.memory
        if memory:
            column, what = memory
            # (a memory column every finished run has)
            ratio = cast(quantities.Comparison, quantities.compare(study, run, base_name, column))
            mib = f"{row[column] / MIB:.1f} vs {base[column] / MIB:.1f} MiB"
            said = ratio_text(ratio, *WORDS["memory"], quantities.noise_unit(column))
            parts.append(f"{what} {mib}, {said}")
        differ = also_differ(
            quantities.ran(study.metrics[run]), quantities.ran(study.metrics[base_name]), ()
        )
        pair = f"{run} vs {base_name}" + (f" (they differ in {differ})" if differ else "")
        lines.append(f"{pair}: " + "; ".join(parts) + ".")
    return lines


def baseline_comparisons(
    study: Study,
) -> dict[str, tuple[quantities.Comparison, quantities.Comparison]]:
    """Each finished run but the baseline against the baseline, over the seeds: (throughput
    ratio, test-accuracy difference). Empty when the baseline did not finish."""
    base = study.baseline
    if study.runs.at[base, "status"] != OK:
        return {}
    # (finished runs: each side has both values)
    return {
        run: (
            cast(quantities.Comparison, quantities.compare(study, run, base, "samples_per_s")),
            cast(quantities.Comparison, quantities.compare(study, run, base, "test_accuracy")),
        )
        for run in study.ok.index
        if run != base
    }


def verdict(comparison: quantities.Comparison) -> str:
    """A throughput ratio's verdict (compare.html): the one rule, dmls.stats.verdict."""
    return comparison.verdict(*WORDS["samples_per_s"])


def between_jobs(study: Study) -> list[str]:
    """Once per study that compares speeds: every run is its own job, and jobs differ by more
    than their seeds (the machine's state, what ran beside them); a speed between two runs is a
    finding only beyond what the results folder's A/A jobs differed by on that kind of device
    (quantities.job_noise), and has no verdict where no such jobs ran."""
    if len(study.ok) - len(study.single_seed_runs) < 2:  # (no two runs with intervals)
        return []
    kinds = sorted({device_kind(study.metrics[run]) for run in study.ok.index})
    lines = []
    for kind in kinds:
        where = {"cuda": "on GPUs", "cpu": "on CPUs"}[kind]
        noise = study.job_noise.get(kind)
        if noise is None:
            lines.append(
                f"Speeds between runs {where} have no verdict: each run is its own job, and no "
                "two jobs of identical settings finished here to measure how much jobs differ "
                "beyond their seeds."
            )
            continue
        pairs = "; ".join(" and ".join(group) for group in noise.labels)
        lines.append(
            f"A speed between two runs {where} (each its own job) is a finding only where its "
            "interval lies beyond job noise, what two jobs of identical settings differed by: "
            f"{100 * (noise.largest - 1):.1f}% at most, among {pairs}."
        )
    return lines


def scaling(study: Study) -> list[str]:
    """Speed-up over the baseline against the ideal (linear in workers) and its efficiency,
    both with the 95% interval of the seeds' throughput ratio (Study.speedup)."""
    base = study.runs.loc[study.baseline]
    if base["status"] != OK or not study.scales_workers:
        return []
    lines = []
    for run, row in study.ok.iterrows():
        speedup = study.speedup(run)
        if speedup is None:
            continue
        reference, ratio = speedup
        ref = study.runs.loc[reference]
        ideal = row["replicas"] / ref["replicas"]
        lines.append(
            f"{run} ({_workers(row['replicas'])}): speed-up over {reference} "
            f"({_workers(ref['replicas'])}) {ratio_text(ratio, *WORDS['samples_per_s'])}; "
            f"ideal {ideal:.0f}×, parallel efficiency {_efficiency(ratio, ideal)}."
        )
    cores = {m["host"]["cpu_count"] for m in study.metrics.values() if m["status"] == OK}
    if study.ok["nodes_emulated"].any():
        lines.append(
            "Nodes were emulated on one host: all processes share its "
            f"{'/'.join(map(str, sorted(cores)))} cores and talk over loopback, so these "
            "numbers measure the launcher and the collectives' overhead, not a network."
        )
    return lines


def sweep(study: Study) -> list[str]:
    """Trends along the one swept setting (batch size, accumulation steps): a line through the
    memory means, and the last setting against the first over the seeds."""
    key = study.sweep_key
    ok = study.ok
    if key is None or len(ok) < 2:
        return []
    ok = ok.sort_values(f"spec.{key}")
    x = ok[f"spec.{key}"].to_numpy(dtype=float)
    lines = []
    # The answer's line (comparisons.fit: through the runs' means, with the slope's interval),
    # so that the section gives one fit.
    try:
        line = fit(study, "memory", key)
        lines.append(
            f"{line['label']} vs {key}: {line['verdict']}, {line['slope']} plus "
            f"{line['intercept']} ({line['r2']}; {line['points']})."
        )
    except NotMeasured:
        pass  # fewer than three settings finished
    first, last = ok.index[0], ok.index[-1]
    # (finished runs: each side has both values)
    speed = cast(quantities.Comparison, quantities.compare(study, last, first, "samples_per_s"))
    accuracy = cast(quantities.Comparison, quantities.compare(study, last, first, "test_accuracy"))
    means = [quantities.mean(study, r, "samples_per_s") for r in (first, last)]
    lines.append(
        f"From {key} {_fmt(x[0])} to {_fmt(x[-1])}: samples/s over the steady epochs "
        f"{means[0]:,.0f} → {means[1]:,.0f} (geometric means), "
        f"{ratio_text(speed, *WORDS['samples_per_s'])}; "
        f"test accuracy {_percent(ok.at[first, 'test_accuracy'])} → "
        f"{_percent(ok.at[last, 'test_accuracy'])}, {points_text(accuracy)}; the means are "
        f"{_trend(ok['test_accuracy'])}."
    )
    return lines


def warm_process(study: Study) -> list[str]:
    """Whether the seeds after the first, which train in a process already warm (imports,
    process group, cuDNN and compile caches), run their steady epochs as fast as the first
    seed: each seed's epochs 2..E, every epoch a sample, later seeds' against the first's. If
    they match, every seed measures the same steady speed and the seeds' spread is fair."""
    parts: list[str] = []
    verdicts: dict[str, list[str]] = {
        quantities.NO_EFFECT: [], quantities.LESS: [], quantities.MORE: [], quantities.TOO_FEW: []
    }  # fmt: skip
    for run in study.ok.index:
        ratio = quantities.warm_against_first(study, run)
        if ratio is None:  # one fresh seed, or one epoch: no steady epochs
            continue
        # (times: a ratio above 1 is slower)
        parts.append(f"{run} {ratio_text(ratio, 'slower', 'faster', 'epoch')}")
        verdicts[ratio.finding].append(run)
    if not parts:
        return []
    said = {
        quantities.NO_EFFECT: "match the first within the epochs' noise",
        quantities.LESS: "are faster beyond the epochs' noise",
        quantities.MORE: "are slower beyond the epochs' noise",
    }
    found = [f"{said[k]} in {', '.join(verdicts[k])}" for k in said if verdicts[k]]
    line = f"Warm process, later seeds' steady epochs against the first seed's: {'; '.join(parts)}."
    if found:
        line += f" The later seeds {', and '.join(found)}."
    if len(verdicts[quantities.TOO_FEW]) == len(parts):
        line += " No intervals: each first seed has one steady epoch (that takes 3 epochs)."
    elif verdicts[quantities.TOO_FEW]:
        line += (
            f" No interval for {', '.join(verdicts[quantities.TOO_FEW])}: the first seed has one "
            "steady epoch."
        )
    return [line]


def memory_per_job(study: Study) -> list[str]:
    """What a run's GPU memory is (record.counted_seeds: a warm process's seeds), and by how
    much each job's first seed peaked above its later ones: in graph and compiled
    steps (cudnn.benchmark on) the first seed of a process pays cuDNN's autotuning, the later
    ones reuse its plans; in eager steps the cause was not measured, and the line says so."""
    column = "peak_gpu_mem_allocated_bytes"
    if study.ok.empty or not study.ok[column].notna().all():
        return []
    if not any(quantities.seed_count(study, run) > 1 for run in study.ok.index):
        return []
    tuned: list[str]
    other: list[str]
    tuned, other = [], []
    for run, row in study.ok.iterrows():
        excess = study.numbers[run].first_seed_excess(column)
        if excess >= 0.05 * MIB:
            text = f"{run} {excess / MIB:.1f} MiB"
            (tuned if str(row["step_mode"]).startswith("cuda_graph") else other).append(text)
    line = (
        "GPU memory is each run's mean over the seeds of a warm process (each job's seeds "
        "after its first), with its interval over them."
    )
    if tuned:
        line += (
            f" The first seed of a job peaked higher, by {', '.join(tuned)}, with graph or "
            "compiled steps, where cuDNN's autotuning (cudnn.benchmark) is on: it tries several "
            "algorithms per new shape, each with its workspace, and bench/seed_memory.py "
            "reproduced such an excess with autotuning on, none with it off, on another host; "
            "for these runs it was not isolated. A job of one seed needs that much more."
        )
    if other:
        line += (
            f" With eager steps the first seed also peaked higher, by {', '.join(other)}; "
            "that was not measured further."
        )
    return [line]


def earlier_versions(study: Study) -> list[str]:
    """Which runs' records an earlier pipeline wrote, what reading them now dropped and why
    (dmls/versions.py), so that a figure missing from the tables is said, not silently gone."""
    dropped: dict[tuple[str, ...], list[str]] = {}
    for run in study.ok.index:
        if earlier := study.metrics[run].get("earlier_version"):
            dropped.setdefault((earlier["why"], *earlier["dropped"]), []).append(run)
    return [
        f"Not shown for {', '.join(runs)}: {', '.join(keys)}, {why}; a run trained again with "
        "this pipeline records them."
        for (why, *keys), runs in dropped.items()
    ]


def compared_with(study: Study, other: Study) -> list[str]:
    """Runs of the same name in another study (B2 accelerate beside B1 torchrun)."""
    lines = []
    for run in study.ok.index:
        if run not in other.runs.index:
            continue
        theirs = other.runs.loc[run]
        if theirs["status"] != OK:
            lines.append(f"{run}: no {other.key} numbers to compare ({theirs['status']}).")
            continue
        # (finished on both sides: each has both values)
        speed = cast(quantities.Comparison, quantities.between(study, run, other, "samples_per_s"))
        accuracy = cast(
            quantities.Comparison, quantities.between(study, run, other, "test_accuracy")
        )
        ours, others = (quantities.mean(s, run, "samples_per_s") for s in (study, other))
        lines.append(
            f"{run}: samples/s over the steady epochs {ours:,.0f} here vs "
            f"{others:,.0f} in {other.key} (geometric means), "
            f"{ratio_text(speed, *WORDS['samples_per_s'])}; test accuracy "
            f"{points_text(accuracy)}."
        )
    return lines


def precision_check(study: Study) -> list[str]:
    """Runs whose measured compute precision is not the one they asked for."""
    lines = []
    for run, row in study.ok.iterrows():
        asked = row["spec.precision"]
        measured = row["effective_precision"]
        # Ranks join what they measured with "/", layer kinds within a rank with "+".
        if asked != "fp32" and asked not in re.split(r"[/+]", str(measured)):
            lines.append(
                f"{run}: asked for {asked}, but the layers computed in {measured} "
                "(see the precision probe in dmls/training/precision.py)."
            )
    return lines


# The instruction sets with which a CPU computes bf16 itself (Linux's /proc/cpuinfo names, as
# the record's host.cpu_half_precision.flags lists them).
BF16_INSTRUCTIONS = frozenset({"avx512_bf16", "amx_bf16", "avx_ne_convert"})


def cpu_half_precision(study: Study) -> list[str]:
    """CPU runs whose half precision this CPU computes slowly, with why (the host's facts,
    supervisor/hardware.py): fp16 where PyTorch's oneDNN has no fp16 kernel for the CPU, so
    its layers fall back to ATen's reference kernels; bf16 where the CPU has no bf16
    instructions, so oneDNN's bf16 kernels convert to fp32 and back. bench/cpu_autocast.py
    profiles a step of each."""
    ok = study.ok
    if ok.empty or "onednn_fp16" not in ok.columns:
        return []
    cpu = ok[ok["device"].astype(str) == "cpu"]
    if cpu.empty:  # (under Arrow-backed strings a mask mapped from no rows stays a string)
        return []
    computed = cpu["effective_precision"].astype(str).str.split(r"[/+]", regex=True)
    fp16 = computed.map(lambda p: "fp16" in p)
    in_fp16 = fp16 & cpu["onednn_fp16"].eq(False)
    # The CPU's bf16/fp16 instruction sets; None where unknown (an older record says nothing).
    flags = cpu["cpu_half_flags"].map(lambda f: set(f.split()) if isinstance(f, str) else None)
    # (oneDNN's fp16 kernels without AMX-FP16: the weight gradient's is its reference code)
    no_amx_fp16 = flags.map(lambda f: f is not None and "amx_fp16" not in f)
    no_amx_fp16 &= fp16 & cpu["onednn_fp16"].eq(True)
    no_bf16 = flags.map(lambda f: f is not None and BF16_INSTRUCTIONS.isdisjoint(f))
    in_bf16 = computed.map(lambda p: "bf16" in p) & no_bf16
    lines = []
    probe = "the oneDNN probe of this host"  # (each record's host.cpu_half_precision)
    if in_fp16.any():
        lines.append(
            cause(
                f"{', '.join(cpu.index[in_fp16])}: {probe} found no fp16 kernel for this CPU (one "
                "needs AVX512-FP16, AMX-FP16 or AVX-NE-CONVERT), so PyTorch ran the fp16 layers on "
                "ATen's reference kernels (convolutions: aten::_slow_conv2d_forward and _backward, "
                "as bench/cpu_autocast.py profiled on another CPU): the time measures that "
                "fallback, not fp16 arithmetic.",
                probe,
            )
        )
    if no_amx_fp16.any():
        lines.append(
            f"{', '.join(cpu.index[no_amx_fp16])}: this CPU has oneDNN fp16 kernels but no "
            "AMX-FP16; on such a CPU (a Xeon with AVX512-FP16 and AMX-BF16) "
            "bench/cpu_autocast.py found oneDNN computing a convolution's fp16 weight gradient "
            "with its reference loops (ref:any in ONEDNN_VERBOSE); whether it did here was not "
            "profiled, so how much of fp16's time that is stays unexplained."
        )
    if in_bf16.any():
        lines.append(
            cause(
                f"{', '.join(cpu.index[in_bf16])}: the CPU flags of this host show no bf16 "
                "instructions (AVX512-BF16, AMX-BF16 or AVX-NE-CONVERT), so oneDNN's bf16 kernels "
                "convert to fp32 and back: bf16 saves no arithmetic here.",
                "the CPU flags of this host",
            )
        )
    return lines


def step_check(study: Study) -> list[str]:
    """GPU runs that asked for a CUDA-graph step but trained eagerly, one line per reason (on a
    CPU the reason goes without saying; runs.csv still records it)."""
    ok = study.ok
    if ok.empty:
        return []
    gpu = ok["device"].astype(str).str.startswith("cuda")
    eager = ok[gpu & (ok["spec.step"] != "eager") & (ok["step_mode"] == "eager")]
    return [
        f"Trained eagerly, not from a CUDA graph ({reason}): {', '.join(group.index)}."
        for reason, group in eager.groupby("step_eager_reason", sort=False)
    ]


def time_to_accuracy(study: Study) -> list[str]:
    """With a target accuracy: each finished run's time (and epochs) to reach it, against the
    baseline's as a ratio over the seeds; or how many of its seeds never did."""
    target = study.target_accuracy
    if target is None:
        return []
    level = f"{100 * target:g}% test accuracy"
    base = study.baseline
    lines = []
    for run, row in study.ok.iterrows():
        times = study.seconds_to_target(run)
        if times is None:
            lines.append(
                f"{run}: {row['seeds_to_target']} seeds reached {level} within "
                f"{_epochs(row)}: no time to it is given."
            )
            continue
        text = (
            f"{run} reaches {level} in {in_s(row['time_to_target_s'])} of training and "
            f"evaluation ({row['epochs_to_target']:.1f} epochs)"
        )
        time = quantities.time_to_target(study, run, base) if base in study.ok.index else None
        if run != base and time is not None:
            text += f"; its time over {base}'s {ratio_text(time, 'slower', 'faster')}"
        lines.append(text + ".")
    return lines + _cold_seeds_to_target(study)


def _cold_seeds_to_target(study: Study) -> list[str]:
    """Which seeds the times to the target come from (record.timed_seeds), and how much more
    (or less) each job's first seed took to get there, its cause left unsaid: no run isolates
    a process's one-time warm-up."""
    assert study.target_accuracy is not None  # (from time_to_accuracy: a study with a target)
    extra, cold_only = [], []
    for run in study.ok.index:
        metrics = study.metrics[run]
        if None in targets.seeds_to_target(metrics, study.target_accuracy):
            continue
        excess = targets.cold_excess_to_target(metrics, study.target_accuracy)
        if excess is None:
            cold_only.append(run)
        else:
            extra.append(f"{run} {in_s(abs(excess))} {'more' if excess >= 0 else 'less'}")
    lines = []
    if extra:
        lines.append(
            "Times and energy to the target are those of the seeds that trained in a warm "
            "process, each job's seeds after its first; each job's first seed took, to the "
            f"target, against them: {', '.join(extra)}. How much of that is what a process "
            "does once (warm-up) no run here isolates; a job of one seed has only a first seed."
        )
    if cold_only and extra:
        lines.append(
            f"{', '.join(cold_only)}: no seed trained in a warm process, so its times to the "
            "target include the process's warm-up and compare with the others' only roughly."
        )
    return lines


def energy_use(study: Study) -> list[str]:
    """The GPUs' energy (NVML) of every finished run against the baseline's: per steady epoch
    and, with a target accuracy, to reach it, as ratios over the seeds; the reason wherever
    finished runs have no energy."""
    lines = [
        f"No GPU energy for {', '.join(runs)}: {reason}."
        for reason, runs in study.no_energy_reasons.items()
    ]
    if not study.energy_measured:
        return lines
    base = study.baseline
    measured = study.ok[study.ok["train_energy_j"].notna()]
    column, per = study.energy_column
    no_steady: dict[str, list[str]] = {}
    for run in measured.index:
        if reason := study.steady_energy_reason(run):
            no_steady.setdefault(reason, []).append(run)
    lines += [f"No steady-epoch energy for {', '.join(r)}: {why}." for why, r in no_steady.items()]
    for run, row in measured.iterrows():
        text = (
            f"{run} draws {joules(row[column])} J {per} on its GPUs, "
            f"{row['train_power_w']:.0f} W on average in training"
        )
        if run != base and base in measured.index:
            # (measured runs: each has energy in `column`)
            ratio = cast(quantities.Comparison, quantities.compare(study, run, base, column))
            text += f"; its energy over {base}'s {ratio_text(ratio, *WORDS['energy'])}"
            to_j = study.target_accuracy and quantities.energy_to_target(study, run, base)
            if to_j:
                text += f"; to the target, {ratio_text(to_j, *WORDS['energy'])}"
        lines.append(text + ".")
    return lines


def all_observations(
    study: Study, other: Study | None = None, collectives: pd.DataFrame | None = None
) -> list[str]:
    lines = seed_note(study) + between_jobs(study) + versus_baseline(study) + scaling(study)
    lines += sweep(study)
    lines += communication(study, collectives)
    lines += time_to_accuracy(study) + energy_use(study)
    lines += warm_process(study) + memory_per_job(study) + earlier_versions(study)
    lines += precision_check(study)
    lines += cpu_half_precision(study)
    lines += step_check(study)
    if other is not None:
        lines += compared_with(study, other)
    return lines


def _efficiency(speedup: quantities.Comparison, ideal: float) -> str:
    """Speed-up over the ideal as a percentage, its interval the speed-up's scaled alike."""
    text = f"{100 * speedup.value / ideal:.0f}%"
    if not speedup.has_interval:
        return text
    assert speedup.low is not None and speedup.high is not None  # has_interval
    way = speedup.against(ideal).finding
    words = {
        quantities.NO_EFFECT: " (linear within seed noise)",
        quantities.MORE: " (above linear)",
    }
    linear = words.get(way, "")
    return (
        f"{text} (95% interval {100 * speedup.low / ideal:.0f}–"
        f"{100 * speedup.high / ideal:.0f}%){linear}"
    )


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2f}%"


def _epochs(row: pd.Series) -> str:
    n = int(row["epochs_completed"])
    return f"{n} epoch{'s' if n != 1 else ''}"


def _workers(n: int) -> str:
    return f"{int(n)} worker{'s' if n != 1 else ''}"


def _fmt(value: float) -> str:
    return f"{value:g}"


def _trend(values: pd.Series) -> str:
    diffs = np.diff(values.to_numpy(dtype=float))
    if (diffs <= 0).all():
        return "falling at every step"
    if (diffs >= 0).all():
        return "rising at every step"
    return "not monotonic"
