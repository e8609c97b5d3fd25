"""Each study's answer to its question: at most three sentences whose every figure comes from
this results folder, with its interval and a verdict.

The words are templates in report/studies.yaml (`answer:` of a section); this module fills them.
A sentence names its comparisons, each a run against a reference over their seeds:

    - say: "Against one GPU's samples per second, DDP on 2 GPUs: {ddp}."
      compare:
        ddp: {run: ddp_2gpu_dataloader, vs: single_gpu_dataloader, metric: samples_per_s}

`{ddp}` becomes "1.64× (1.58–1.70×; 812 vs 495 samples/s), faster": the ratio, its 95%
interval, both (geometric) means and the verdict (or "slower",
"within seed noise", "too few seeds to tell", ...); `{ddp.figure}` leaves the verdict out and
`{ddp.label}` names the metric. The report shows each answer first without the means
("1.64× (1.58–1.70×), faster": `study_answers`), the whole sentence one click away, and a
sentence whose every pair also differs in the same keys says it once. One convention for every
ratio: the run's over the reference's, so > 1 means more of the metric (faster for throughput,
heavier for memory).
Two runs compared differ, by the study's design, only in its `factor` keys (a key, or a group
such as `optimizer`); a pair that differs in more says in what, the step a run took counting
rather than the one it asked for. A comparison whose runs did not finish, or are not in the
config, is "not measured (the run and why)", and shows no number. An entry with `facts:`
(A2) takes its numbers from a function of the study and has one template per case.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from string import Formatter
from typing import Any, cast

import numpy as np
import pandas as pd

from dmls.comm import calls_ms, ddp_buckets, setup_rows
from dmls.report import quantities
from dmls.report.causes import check_template
from dmls.report.cells import MIB, gpu_card
from dmls.report.communication import predictions
from dmls.report.comparisons import (
    METRICS,
    Compared,
    NotMeasured,
    _Fit,
    compare,
    fit,
    metric_label,
    require_finished,
)
from dmls.report.overfitting import held_out_loss, held_out_minimum
from dmls.report.study import OK, Study, step_taken
from dmls.report.wording import in_s, minus, signed


def overfitting(study: Study) -> tuple[str, dict[str, Any]]:
    """A2 from A1's curves: whether any run's held-out loss passed its minimum and rose again
    while its training loss kept falling (case "overfit"); none did, and every run could have
    shown it, its minimum before its last epoch ("no_rise"); none did among those that could,
    the others lowest at their last epoch ("some_at_last"); or every minimum sat at the last
    epoch, where a rise could not yet show ("still_falling"). A minimum at the last epoch says
    nothing either way, the less so where the schedule annealed the learning rate toward zero
    by then (`lr_end`: the last epoch's rate as a share of the run's peak, the highest over the
    runs), which shrinks the last epochs' steps; how much of their falling loss it accounts
    for, no run of A1 isolates (A4's `none`, with the same schedule and no augmentation or
    weight decay, is the control where it overfit), and the sentence says so. The loss
    is the validation split's where the runs have one, else the test set's."""
    histories = {run: h for run, h in study.histories.items() if len(h) >= 2}
    if not histories:
        raise NotMeasured("no run of it finished two epochs")
    column, loss = held_out_loss(histories)
    at_last, overfit, rises = 0, [], []
    for run in histories:
        best, last, overfits, _ = held_out_minimum(study, run, column)
        at_last += int(best["epoch"] == last["epoch"])
        if overfits:
            overfit.append(run)
            rises.append(100 * (last[column] / best[column] - 1))
    epochs = sorted({int(h.iloc[-1]["epoch"]) for h in histories.values()})
    lr_end = max(
        (h["lr"].iloc[-1] / h["lr"].max() for h in histories.values() if h["lr"].max() > 0),
        default=None,
    )
    facts = {
        "loss": loss,
        "n": len(histories),
        "n_at_last": at_last,
        "n_told": len(histories) - at_last,
        "n_overfit": len(overfit),
        "overfit_runs": ", ".join(overfit),
        "rise": "–".join(
            dict.fromkeys(f"{r:.0f}" for r in (min(rises, default=0), max(rises, default=0)))
        )
        + "%",
        "epochs": "/".join(map(str, epochs)),
        "schedule": (
            f"; their learning rate ended at {100 * lr_end:.2g}% of its peak, whose share in "
            "the last epochs' falling loss no run here isolates"
            if lr_end is not None and lr_end < 0.1
            else ""
        ),
    }
    if overfit:
        case = "overfit"
    elif at_last == len(histories):
        case = "still_falling"
    else:
        case = "some_at_last" if at_last else "no_rise"
    return case, facts


def regularization_setting(study: Study) -> tuple[str, dict[str, Any]]:
    """A4's setting, to read its techniques in: whether the bare baseline (`study.baseline`)
    overfit within its epochs (its held-out loss passed its minimum and rose while its training
    loss fell), or its held-out loss was still falling at its last epoch, where a regularizer
    can only slow the fit."""
    base = study.baseline
    history = study.histories.get(base)
    if history is None or len(history) < 2:
        raise NotMeasured(f"the baseline {base} did not finish two epochs")
    column, loss = held_out_loss({base: history})
    best, last, overfits, rose = held_out_minimum(study, base, column)
    case = "overfit" if overfits else "still_falling" if rose is None else "not_told"
    gap = 100 * (last["train_accuracy"] - last["test_accuracy"])
    return case, {
        "baseline": base,
        "loss": loss,
        "epochs": str(int(last["epoch"])),
        "best_epoch": str(int(best["epoch"])),
        "gap": minus(f"{gap:+.1f} points"),
        "gaps": "; ".join(_gap(study, run) for run in study.ok.index),
        "early": _early_stopping(study),
        "rise": _rise(rose),
        "underfit": _underfit(study),
    }


def _underfit(study: Study) -> str:
    """The runs that underfit: their train − test gap's interval holds 0 or lies below it (they
    fit their training data no better than the test set) while their test accuracy fell below
    the baseline's, a finding: "; augmentation and combined underfit in these epochs: ..."."""
    base, found = study.baseline, []
    for run in study.ok.index:
        if run == base:
            continue
        seeds = study.numbers[run].finals("test_accuracy")
        gap = quantities.interval([f["train_accuracy"] - f["test_accuracy"] for f in seeds])
        lost = quantities.compare(study, run, base, "test_accuracy")
        # (gap.has_interval: gap.low is a float)
        if (
            gap
            and gap.has_interval
            and cast(float, gap.low) <= 0
            and lost
            and lost.finding == quantities.LESS
        ):
            found.append(run)
    if not found:
        return ""
    return (
        f"; {' and '.join(found)} underfit in these epochs: a gap whose interval holds 0 or "
        f"lies below it, and less accurate than {base}"
    )


def _rise(rose: quantities.Comparison | None) -> str:
    """A held-out loss's rise over the seeds with its interval ('+0.022 (−0.051 to +0.095)');
    with one seed, its value alone."""
    if rose is None:
        return ""
    if not rose.has_interval:
        return minus(f"{rose.value:+.3f} (one seed)")
    return minus(f"{rose.value:+.3f} ({rose.low:+.3f} to {rose.high:+.3f})")


def _gap(study: Study, run: str) -> str:
    """A run's train − test accuracy gap at its end, in points: the mean over its seeds with
    the 95% interval, and the training accuracy it comes from."""
    seeds = study.numbers[run].finals("test_accuracy")
    gap = quantities.interval([100 * (f["train_accuracy"] - f["test_accuracy"]) for f in seeds])
    assert gap is not None  # a finished run's seeds: finite accuracies
    train = np.mean([100 * f["train_accuracy"] for f in seeds])
    low, high = cast(float, gap.low), cast(float, gap.high)  # read only with an interval
    interval = (
        " (one seed)"
        if not gap.has_interval
        else " (no spread in the seeds)"
        if gap.low == gap.high
        else f" ({signed(low)} to {signed(high)})"
    )
    return f"{run} {signed(gap.mean)}{interval}, train {train:.1f}%"


def _early_stopping(study: Study) -> str:
    """Where early stopping fired, per run that used it (a sentence of its own, or nothing
    where no run used it): each seed's epoch, the learning rate
    then as a share of the run's peak (a schedule that had not yet annealed), and which weights
    the final numbers come from (the best epoch's, restored, or the last epoch's)."""
    said = []
    for run in study.ok.index:
        metrics = study.metrics[run]
        if not metrics["spec"].get("early_stopping_patience"):
            continue
        stops, rates, restored = [], [], []
        for seed in metrics["seeds"]:
            final, history = seed["final"], seed["history"]
            if not final.get("stopped_early_epoch"):
                continue
            epoch = final["stopped_early_epoch"]
            peak = max(row["lr"] for row in history) or 1.0
            stops.append(str(epoch))
            rates.append(history[epoch - 1]["lr"] / peak)
            restored.append(final.get("restored_best_epoch"))
        if not stops:
            spec = metrics["spec"]
            said.append(
                f"early stopping never fired in {run} (patience "
                f"{spec['early_stopping_patience']}, {spec['epochs']} epochs)"
            )
            continue
        share = "–".join(dict.fromkeys(f"{r:.0%}" for r in (min(rates), max(rates))))
        if all(restored):
            kept = f"the weights of its best epoch ({'/'.join(map(str, restored))}), restored"
        elif not any(restored):
            kept = "its last weights"
        else:
            kept = " / ".join(
                f"epoch {r}'s weights, restored" if r else "its last weights" for r in restored
            )
        said.append(
            f"{run} stopped at epoch {'/'.join(stops)} of {metrics['spec']['epochs']}, its "
            f"learning rate still {share} of its peak, and reports {kept}"
        )
    return "".join(f"; {text}" for text in said)


def one_host_cause(study: Study, sweep: pd.DataFrame | None) -> tuple[str, dict[str, Any]]:
    """B1: why two processes on one host (`n1xp2`) step slower than one (`n1xp1`). Each run's
    time per optimizer step comes from its steady throughput. Two measured suspects:
    `n1xp2_passive`, the same two processes with OpenMP's idle threads asleep instead of
    spinning (they spin on the cores gloo's threads need while a rank waits on a collective;
    each rank's involuntary context switches show it), and the gradient's all-reduce as the
    collectives sweep of this folder times it (DDP's buckets, the run's backend and device, 2
    processes). Case "spin": the sleeping threads made the step faster beyond seed noise;
    "other": they did not (or were not measured); "faster": two processes were not slower."""
    one, two, passive = "n1xp1", "n1xp2", "n1xp2_passive"
    for run in (one, two):
        require_finished(study, run)
    lost = _step_ms(study, two) - _step_ms(study, one)
    reduce_text, reduce_ms = _all_reduce(study.metrics[two], sweep, lost)
    facts: dict[str, Any] = {
        "step_one": f"{_step_ms(study, one):.3g} ms",
        "step_two": f"{_step_ms(study, two):.3g} ms",
        "threads": _threads_per_process(study.metrics[two]),
        "switches_one": _switches(study.metrics[one]),
        "switches_two": _switches(study.metrics[two]),
        "all_reduce": reduce_text,
    }
    # What no measurement here accounts for: the time lost less the all-reduce's share (the
    # sweep's) and the spinning threads' (n1xp2_passive's, where it is a finding).
    accounted = [reduce_ms or 0.0]
    try:
        facts["passive"] = compare(study, passive, two, "samples_per_s", ["omp_wait_policy"])
    except NotMeasured as e:
        facts["passive"] = Compared.not_measured(e)
        facts["unexplained"] = _left(lost, accounted)
        return ("faster" if lost <= 0 else "other"), facts
    regained = _step_ms(study, two) - _step_ms(study, passive)
    spin = facts["passive"].finding == quantities.MORE
    if spin:
        accounted.append(min(regained, lost))
    facts |= {
        "step_passive": f"{_step_ms(study, passive):.3g} ms",
        "spin_share": f"{min(regained / lost, 1):.0%}" if lost > 0 else "",
        "switches_passive": _switches(study.metrics[passive]),
        "unexplained": _left(lost, accounted),
    }
    if lost <= 0:
        return "faster", facts
    return ("spin" if spin else "other"), facts


def _left(lost: float, accounted: list[float]) -> str:
    """The share of `lost` (ms per step) that `accounted` (ms each measurement puts on its
    cause) leaves, as a percentage; all of it where nothing was lost to explain."""
    if lost <= 0:
        return "none"
    return f"{max(0.0, 1 - sum(accounted) / lost):.0%}"


def _step_ms(study: Study, run: str) -> float:
    """ms per optimizer step of `run`, each process stepping its own batch, from the geometric
    mean of its seeds' steady throughput."""
    m = study.metrics[run]
    samples = m["spec"]["batch_size"] * m["derived"]["processes"]
    return 1000 * samples / quantities.mean(study, run, "samples_per_s")


def _threads_per_process(metrics: dict[str, Any]) -> str:
    """The intra-op threads each rank had (OMP_NUM_THREADS as launched)."""
    env = (metrics.get("launch") or {}).get("env") or [{}]
    n = env[0].get("OMP_NUM_THREADS")
    return f"{n} thread{'s' if str(n) != '1' else ''}" if n else "an unrecorded number of threads"


def _switches(metrics: dict[str, Any]) -> str:
    """Involuntary context switches per rank over the job (the mean of its ranks)."""
    counts = [r.get("involuntary_context_switches") for r in metrics.get("ranks") or []]
    if not counts or None in counts:
        return "not recorded"
    return f"{np.mean(counts):,.0f}"


def _all_reduce(
    metrics: dict[str, Any], sweep: pd.DataFrame | None, lost: float
) -> tuple[str, float | None]:
    """What the collectives sweep puts one step's gradient all-reduce at, and its share of the
    time `lost` per step, or why it can't say; and those ms (None where not measured)."""
    params = metrics.get("parameters")
    if sweep is None:
        return "not measured (the sweep did not run)", None
    if not params:
        return f"not measured ({metrics['run']}'s record has no parameter count)", None
    device = "cuda" if str(metrics["ranks"][0]["device"]).startswith("cuda") else "cpu"
    backend, world = metrics["spec"]["backend"], metrics["derived"]["processes"]
    rows = setup_rows(sweep.to_dict("records"), backend, device, world)
    ms = calls_ms(rows, [("all_reduce", b) for b in ddp_buckets(4 * params)])
    if ms is None:
        return (
            f"not measured (the sweep did not time {backend} on {device}, {world} processes)",
            None,
        )
    share = f", {min(ms / lost, 9.99):.0%} of the time lost" if lost > 0 else ""
    return f"{ms:.3g} ms for the {4 * params / 1024:,.0f} KiB gradient ({backend}){share}", ms


def backend_sweep(study: Study, sweep: pd.DataFrame | None) -> tuple[str, dict[str, Any]]:
    """A5: what the collectives sweep predicts of Gloo's extra time per steady epoch over
    NCCL's (communication.predictions: the all-reduces alone, none hidden behind the backward),
    beside the gap measured, at each batch size both backends ran. Case "predicted", or
    "unpredicted" where the sweep did not run, timed neither backend or a run did not finish."""
    predicted = predictions(study, sweep)
    facts: dict[str, Any] = {}
    for batch in (32, 128):
        gloo, nccl = f"gloo_b{batch}", f"nccl_b{batch}"
        if not all("seconds" in predicted.get(r, {}) for r in (gloo, nccl)):
            return "unpredicted", {}
        gap = quantities.compare(study, gloo, nccl, "steady_epoch_s")
        if gap is None:  # a side without a steady epoch's time in any seed
            return "unpredicted", {}
        low, high = cast(float, gap.low), cast(float, gap.high)  # read only with an interval
        facts[f"predicted_b{batch}"] = in_s(predicted[gloo]["seconds"] - predicted[nccl]["seconds"])
        facts[f"measured_b{batch}"] = (
            f"{in_s(gap.value)} ({in_s(low)} to {in_s(high)})"
            if gap.has_interval
            else in_s(gap.value)
        )
    return "predicted", facts


# Facts an `answer:` entry names with `facts:`: a function of the study (and the collectives
# sweep, where it ran) giving (case, facts); the entry's `say` has one template per case.
FACTS: dict[str, Callable[..., tuple[str, dict[str, Any]]]] = {
    "overfitting": overfitting,
    "regularization_setting": regularization_setting,
    "one_host_cause": one_host_cause,
    "backend_sweep": backend_sweep,
}
# The facts functions that read the collectives sweep.
WITH_SWEEP = {"one_host_cause", "backend_sweep"}


def sentence(
    entry: dict[str, Any],
    study: Study,
    factor: Sequence[str] = (),
    other: Study | None = None,
    sweep: pd.DataFrame | None = None,
    said: set[str] | None = None,
) -> tuple[str, str]:
    """One `answer:` entry of report/studies.yaml filled from `study`'s runs (`said`: the
    reasons of runs that did not finish, given in full earlier in the answer), or a sentence
    saying why it can't be; and the same sentence as the report shows it first (each figure
    with its interval and verdict, without the means and why a first seed is left out)."""
    filled: dict[str, Any] = device_words(study)
    say = entry["say"]
    if "facts" in entry:
        try:
            name = entry["facts"]
            args = (study, sweep) if name in WITH_SWEEP else (study,)
            case, facts = FACTS[name](*args)
        except NotMeasured as e:
            topic = entry.get("topic", entry["facts"])
            why = f"{topic[:1].upper()}{topic[1:]}: not measured here, as {e}."
            return why, why
        filled |= facts
        say = say[case]
    for name, c in (entry.get("compare") or {}).items():
        try:
            filled[name] = compare(study, c["run"], c["vs"], c["metric"], factor, other)
        except NotMeasured as e:
            filled[name] = Compared.not_measured(e, metric_label(study, c["metric"]))
    for name, f in (entry.get("fit") or {}).items():
        try:
            filled[name] = _Fit(fit(study, f["metric"], f["against"]))
        except NotMeasured as e:
            filled[name] = Compared.not_measured(e, metric_label(study, f["metric"]))
    if course := entry.get("course"):
        filled["course"] = against_course(filled, course)
    filled = _as_above(filled, say, set() if said is None else said)
    filled, shared = said_once_for_all(filled)
    brief = {k: v.briefly() if isinstance(v, Compared | _Fit) else v for k, v in filled.items()}
    texts = say.format(**filled), say.format(**brief)
    if not shared:
        return texts
    full, short = (f"{text.removesuffix('.')}; {shared}." for text in texts)
    return full, short


# What the course found, per comparison of an answer's `course:` (its reference), in the rule's
# terms: a finding one way or the other, or none.
COURSE_FINDINGS = {"more": quantities.MORE, "less": quantities.LESS, "none": quantities.NO_EFFECT}


def against_course(filled: dict[str, Any], course: dict[str, dict[str, str]]) -> str:
    """Where this folder agrees with the course and where it does not, comparison by
    comparison: `course` maps a comparison's name to what the course found (`found`: more,
    less or none, as COURSE_FINDINGS) and how the sentence names it (`where`); each is read
    off the comparison's finding by the one rule: "we agree at batch 128; we disagree at batch
    32 (a finding here: slower)"; a comparison without a verdict agrees with nothing."""
    agree, disagree, untold = [], [], []
    for name, said in course.items():
        compared: Any = filled.get(name)  # any fact; a compared one has a finding
        finding = getattr(compared, "finding", None)
        where = said.get("where", name)
        if finding in (None, quantities.TOO_FEW):
            untold.append(where)
        elif finding == COURSE_FINDINGS[said["found"]]:
            agree.append(where)
        else:
            way = compared.verdict if finding != quantities.NO_EFFECT else "no finding here"
            disagree.append(f"{where} ({way})")
    parts = [
        f"we agree {' and '.join(agree)}" if agree else "",
        f"we disagree {' and '.join(disagree)}" if disagree else "",
        f"no verdict to weigh {' and '.join(untold)}" if untold else "",
    ]
    return "; ".join(p for p in parts if p)


def _as_above(filled: dict[str, Any], say: str, said: set[str]) -> dict[str, Any]:
    """The runs that did not finish, each reason given in full once per answer: in the order
    the template names them, a reason `said` before reads "(nccl_b128 skipped, as above)"."""
    order = [name for _, name, _, _ in Formatter().parse(say) if name]
    for name in dict.fromkeys(n.split(".")[0] for n in order):
        value = filled.get(name)
        if isinstance(value, Compared) and value.why_not:
            if value.why_not in said:
                filled = filled | {name: replace(value, as_above=True)}
            said.add(value.why_not)
    return filled


def said_once_for_all(filled: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Where every measured comparison of a sentence (two or more) differs from its reference
    in the same keys beyond the study's factor (A1's 2-GPU runs: twice the global batch), the
    comparisons without that clause, and the clause once for the sentence ("each pair also
    differs in ..."); else `filled` as it was and no clause."""
    measured = {k: v for k, v in filled.items() if isinstance(v, Compared) and v.verdict}
    clauses = {c.also for c in measured.values()}
    if len(measured) < 2 or len(clauses) != 1 or not clauses.pop():
        return filled, ""
    shared = next(iter(measured.values())).also_for_each
    return filled | {k: c.without_also() for k, c in measured.items()}, shared


def background(texts: dict[str, Any], study: Study) -> list[str]:
    """A section's background (report/studies.yaml) as its runs ran: a paragraph may name
    {batch} (the batch per process the study's runs took), {steps} (how they stepped: their
    records' step) and the device words ({GPU}, {GPUs}, {on_the_GPU}), filled from the records,
    so that it never describes another setting than this folder's."""
    ok = [study.metrics[run] for run in study.ok.index]
    batches = sorted({m["spec"]["batch_size"] for m in ok})
    steps = sorted({step_taken(m) for m in ok} - {""})
    words = device_words(study)
    fields = words | {
        "batch": (
            "the batch per " + words["GPU"]
            if not batches
            else f"batch {batches[0]} per {words['GPU']}"
            if len(batches) == 1
            else f"batches {batches[0]}–{batches[-1]} per {words['GPU']}"
        ),
        "steps": (
            "as their records say"
            if not steps
            else f"“{steps[0]}”"
            if len(steps) == 1
            else " or ".join(f"“{step}”" for step in steps)
        ),
    }
    return [text.format(**fields) for text in texts.get("background") or []]


def device_words(study: Study) -> dict[str, str]:
    """The words an answer's template names its devices with ({GPU}, {GPUs}, {on_the_GPU}):
    the course's GPUs, or, where every run of the study that trained ran on a CPU (the CPU
    preset), its processes, so that a sentence says what ran."""
    devices = set(study.ok["device"].astype(str)) if not study.ok.empty else set()
    if devices == {"cpu"}:
        return {"GPU": "CPU process", "GPUs": "CPU processes", "on_the_GPU": "in memory"}
    return {"GPU": "GPU", "GPUs": "GPUs", "on_the_GPU": "on the GPU"}


def study_answers(
    texts: dict[str, Any],
    study: Study,
    other: Study | None = None,
    sweep: pd.DataFrame | None = None,
) -> tuple[list[str], list[str]]:
    """The answer of a report/studies.yaml section (`answer`, at most three sentences; the
    study's `factor`, what its runs may differ in) filled from `study`'s runs (and `other`'s,
    the study it is compared with; `sweep`, the collectives sweep's table, where it ran); and
    the same answer as the report shows it first (the Answers list, each section's first
    screen): each figure with its 95% interval (or why it has none), the seeds it is over
    where not every seed counts, what else the two runs differ in, and the verdict, the means
    and why a first seed is left out one click away."""
    factor = texts.get("factor") or []
    for i, entry in enumerate(texts.get("answer") or []):
        check_template(f"report/studies.yaml, {texts.get('study')} answer {i + 1}", entry)
    said: set[str] = set()
    filled = [sentence(e, study, factor, other, sweep, said) for e in texts.get("answer") or []]
    return [full for full, _ in filled], [brief for _, brief in filled]


def study_answer(
    texts: dict[str, Any],
    study: Study,
    other: Study | None = None,
    sweep: pd.DataFrame | None = None,
) -> list[str]:
    """`study_answers`' whole answer."""
    return study_answers(texts, study, other, sweep)[0]


def course_comparison(study: Study, table: dict[str, Any] | None) -> dict[str, Any] | None:
    """The course's reference figures beside this run's, one row per configuration (a
    report/studies.yaml `course_table`: the course's `setting` and, per `run`, its figures as
    written), with the settings in which the two differ: epochs, data, card. Our time is the
    whole training of the seeds of a warm process, as the course timed whole trainings."""
    if not table:
        return None
    course = table.get("setting") or {}
    rows = []
    for entry in table["rows"]:
        run = entry["run"]
        if run not in study.runs.index or study.runs.at[run, "status"] != OK:
            status = study.runs.at[run, "status"] if run in study.runs.index else "not in config"
            rows.append([run, entry["course"], f"no numbers ({status})", ""])
            continue
        metrics = study.metrics[run]
        times = quantities.train_times(study, run)
        row = study.runs.loc[run]
        ours = [f"{np.mean(times):,.1f} s", f"{100 * row['test_accuracy']:.1f}% test"]
        # Like beside like: the course gives a run's whole peak of GPU memory, so ours is that
        # peak too (the GPU's allocated bytes at their highest, everything held at once), never
        # the part a step adds, nor a CPU run's process memory, which is not GPU memory.
        column = "peak_gpu_mem_allocated_bytes"
        if column in row and pd.notna(row[column]):
            ours.insert(1, f"{row[column] / MIB:,.1f} MiB ({METRICS[column].label})")
        elif str(row.get("device")) == "cpu":
            ours.insert(1, "no GPU memory (it trained on the CPU)")
        else:
            ours.insert(1, "no GPU memory recorded")
        data = metrics.get("data") or {}
        host = metrics["host"]
        here = {
            "epochs": str(metrics["spec"]["epochs"]),
            "data": (
                f"{'SYNTHETIC ' if data.get('synthetic') else ''}{data.get('name', '?')}"
                f" ({data.get('n_train', '?'):,} training samples)"
                if isinstance(data.get("n_train"), int)
                else str(data.get("name", "?"))
            ),
            "card": gpu_card(host) or "CPU",
        }
        differ = [
            f"{key}: {course[key]} vs {value}"
            for key, value in here.items()
            if key in course and str(course[key]) != value
        ]
        rows.append([run, entry["course"], ", ".join(ours), "; ".join(differ) or "nothing"])
    return {
        "columns": ["configuration", "course", "this run", "differs in (course vs this run)"],
        "rows": rows,
    }
