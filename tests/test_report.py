"""dmls.report: study tables, observations computed from numbers, figures and the HTML page."""

import copy
import html
import re
from pathlib import Path
from types import SimpleNamespace

import jinja2
import numpy as np
import pandas as pd
import pytest
import scipy.stats
import yaml
from matplotlib.container import ErrorbarContainer

from conftest import ROOT, alike, make_spec
from dmls import record, summary
from dmls.config.studies import run_labels, varying_settings
from dmls.files import write_json
from dmls.report import captions, figures, observations, overfitting, page, section, special
from dmls.report.aggregate import read_all, runs_table, seeds_table, summarize
from dmls.report.cells import MIB, cell, epoch_seconds
from dmls.report.study import ReportError, Study
from dmls.special.catalog import STUDIES


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


def test_varying_settings_are_the_spec_keys_that_differ():
    specs = [
        make_spec(run="a", batch_size=16).to_dict(),
        make_spec(run="b", batch_size=32).to_dict(),
    ]
    assert varying_settings(specs) == ["batch_size"]
    assert a1_study().varying == ["launcher", "nproc_per_node"]
    assert run_labels({"a": specs[0], "b": specs[1]}) == {
        "a": {"run": "a", "batch_size": "16"},
        "b": {"run": "b", "batch_size": "32"},
    }


def test_a_baseline_that_is_not_a_run_names_the_key():
    with pytest.raises(ReportError, match=r"studies\.parallelism\.baseline: 'gpu1' is not one of"):
        a1_study(baseline="gpu1")


def test_results_table_shows_numbers_for_ok_runs_and_only_the_reason_otherwise():
    table = a1_study().results_table()
    rows = {row["run"]: row for row in table["rows"]}
    assert rows["dataparallel_2gpu"]["status"] == "skipped"
    assert "no CUDA GPU" in rows["dataparallel_2gpu"]["reason"]
    assert all(cell == "" for cell in rows["dataparallel_2gpu"]["cells"])
    ddp = dict(zip(table["columns"], rows["ddp_2gpu"]["cells"], strict=True))
    assert ddp["Test acc. (%)"] == "79.60"
    assert ddp["Peak GPU mem. per GPU (MiB)"] == "310.0 / 310.0"  # one value per rank's GPU
    assert ddp["Global batch"] == "64"


def test_observations_are_computed_from_the_numbers():
    study = a1_study()
    lines = observations.versus_baseline(study)
    assert lines == [
        "ddp_2gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(2 vs 1), global batch (64 vs 32: 0.5× the steps per epoch)): "
        "samples/s over the steady epochs 1,620 vs 1,000 (geometric "
        "means): 1.62×, too few seeds to tell; test accuracy 79.60% vs 80.00%, −0.4 points, too "
        "few seeds to tell; peak GPU memory (max over GPUs) 310.0 vs 300.0 MiB, 1.03×, too few "
        "seeds to tell."
    ]
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.62×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 81%."
    ]
    summary = observations.status_summary(study)
    assert summary == [
        "2 of 3 runs finished; no numbers for dataparallel_2gpu (skipped): the reasons are in "
        "the results table."
    ]


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


def test_results_table_shows_each_mean_with_its_interval_and_one_seed_alone():
    """single_gpu's seeds: test accuracy 72, 80, 88%; steady epochs 9, 10, 11 s: the 95%
    Student-t half-width is t(0.975, 2) · s / √3 = 4.303 · 8 / √3 = 19.87 points, 2.48 s."""
    study = seeds_study()
    table = study.results_table()
    rows = {row["run"]: dict(zip(table["columns"], row["cells"], strict=True))
            for row in table["rows"]}  # fmt: skip
    single = rows["single_gpu"]
    assert single["Test acc. (%)"] == "80.00 ± 19.87"
    assert single["First epoch (s)"] == "15.0 ± 3.73"  # 13.5, 15, 16.5 s: warm-up included
    assert single["Steady epoch (s)"] == "10.0 ± 2.48"
    assert single["Samples/s (steady epoch)"] == "1,007 ± 251"  # 1000 / 0.9, 1000, 1000 / 1.1
    # Memory is over the seeds of a warm process (record.counted_seeds): 300 and 330 MiB.
    assert single["Peak GPU mem., max GPU (MiB)"] == "315.0 ± 190.6"
    assert single["Epochs"] == "3"  # a count, no interval
    assert single["Peak RSS, max rank (MiB)"] == "2000.0"  # the job's, not per seed
    one = rows["dataparallel_2gpu"]
    assert one["Test acc. (%)"] == "79.60" and one["Steady epoch (s)"] == "10.0"
    frame = study.results_frame().set_index("run")
    assert frame.at["single_gpu", "n_seeds"] == 3
    assert frame.at["single_gpu", "test_accuracy_ci95"] == pytest.approx(0.198731, abs=1e-6)
    assert frame.at["single_gpu", "steady_epoch_s_ci95"] == pytest.approx(2.484138, abs=1e-6)
    assert pd.isna(frame.at["dataparallel_2gpu", "test_accuracy_ci95"])


def test_comparisons_are_made_over_the_seeds_and_say_when_they_are_within_noise():
    """Each seed 0.99, 1.00, 1.01 times its run's numbers: ddp_4gpu's 1.01× throughput and
    ddp_2gpu's −0.4 points lie within the seeds' noise; Welch's intervals (checked against
    scipy's ttest_ind, on logs for ratios)."""
    spread = (0.99, 1.0, 1.01)
    metrics = [
        fake_metrics("single_gpu", launcher="single", epochs=3, spread=spread),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0,
                     epochs=3, test_accuracy=0.796, gpu_mib=310.0, spread=spread),
        fake_metrics("ddp_4gpu", launcher="torchrun", nproc_per_node=4, samples_per_s=1010.0,
                     epochs=3, test_accuracy=0.70, spread=spread),
    ]  # fmt: skip
    study = alike("parallelism", {}, metrics)
    assert observations.versus_baseline(study) == [
        "ddp_2gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(2 vs 1), global batch (64 vs 32: 0.5× the steps per epoch)): "
        "samples/s over the steady epochs 1,620 vs 1,000 (geometric "
        "means): 1.62× (95% interval 1.58–1.66×), faster; test accuracy 79.60% vs 80.00%, −0.4 "
        "points (95% interval −2.2 to +1.4), within seed noise; peak GPU memory (max over GPUs) "
        "311.6 vs 301.5 MiB, 1.033× (95% interval 1.003–1.065×), heavier.",
        "ddp_4gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(4 vs 1), global batch (128 vs 32: 0.25× the steps per epoch)): "
        "samples/s over the steady epochs 1,010 vs 1,000 (geometric "
        "means): 1.01× (95% interval 0.99–1.03×), within seed noise; test accuracy 70.00% vs "
        "80.00%, −10.0 points (95% interval −11.7 to −8.3), less accurate; peak GPU memory (max "
        "over GPUs) 301.5 vs 301.5 MiB, 1.00× (the same in every seed), identical in every seed "
        "compared.",
    ]
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.62× (95% interval "
        "1.58–1.66×), faster; ideal 2×, parallel efficiency 81% (95% interval 79–83%).",
        "ddp_4gpu (4 workers): speed-up over single_gpu (1 worker) 1.01× (95% interval "
        "0.99–1.03×), within seed noise; ideal 4×, parallel efficiency 25% (95% interval "
        "25–26%).",
    ]
    assert observations.seed_note(study) == []


def test_a_study_of_one_seed_says_once_that_it_has_no_intervals():
    lines = observations.all_observations(a1_study())
    note = (
        "This study ran with one seed, so its numbers have no intervals and no difference "
        "between its runs can be told apart from seed noise."
    )
    assert lines[0] == note and lines.count(note) == 1
    assert not any("interval" in line for line in lines[1:])
    assert observations.warm_process(a1_study()) == []  # no later seeds
    assert observations.seed_note(seeds_study()) == [
        "One seed only, so no interval for their numbers or comparisons: dataparallel_2gpu."
    ]


def test_the_warm_process_compares_later_seeds_steady_epochs_with_the_first_seeds():
    """warm's first seed runs its epochs 2..4 1.2 times as long as the later seeds: 0.83×,
    beyond noise (Welch on the logs of 6 epochs against 3: 0.77–0.90×); same's seeds match;
    short has two epochs, so its first seed one steady epoch and no interval."""
    times = [15, 10.0, 10.4, 9.6]
    metrics = [
        fake_metrics("warm", epochs=4, history=epochs(times), spread=(1.2, 1.0, 1.0)),
        fake_metrics("same", epochs=4, history=epochs(times), spread=(1.0, 1.0, 1.0)),
        fake_metrics("short", epochs=2, spread=(1.0, 1.0)),
        fake_metrics("failed", "failed", epochs=4),
    ]
    study = alike("parallelism", {}, metrics)
    assert observations.warm_process(study) == [
        "Warm process, later seeds' steady epochs against the first seed's: warm 0.83× (95% "
        "interval 0.77–0.90×), faster; same 1.00× (95% interval 0.92–1.08×), within epoch "
        "noise; short 1.00×, too few epochs to tell. The later seeds match the first within the "
        "epochs' noise in same, and are faster beyond the epochs' noise in warm. No interval "
        "for short: the first seed has one steady epoch."
    ]
    assert observations.warm_process(study)[0] in observations.all_observations(study)


def test_epochs_under_a_second_keep_three_significant_digits_in_the_tables():
    """A GPU epoch of 0.048 s ± 0.0015 read '0.05 ± 0.00'; from 1 s up, as before."""
    assert cell(0.04798, epoch_seconds, ci95=0.001530) == "0.048 ± 0.00153"
    assert cell(2.4836, epoch_seconds, ci95=0.25) == "2.48 ± 0.25"
    assert epoch_seconds(15.04) == "15.0"
    # Never in exponent form (a tiny CPU run's interval read "4e-05" in the .test report).
    assert cell(0.2, epoch_seconds, ci95=4e-5) == "0.2 ± 0.00004"


def test_peak_memory_is_the_warm_processs_and_says_what_the_first_seed_paid():
    """graph's first seed peaks at 1.2 × 300 MiB, its later ones at 300 (cuDNN's autotuning,
    paid once per process): the run's peak is the warm process's seeds', 300 MiB, with an
    interval of zero width (both agree), and the observation names the first seed's 60 MiB
    more; flat's seeds agree, so it is not named. A kept seed (the first of an earlier
    process) is left out too, and the excess is over every seed left out (one definition,
    record.first_seed_excess): kept's seeds 0 (360, kept) and 1 (300, the first of this
    process) against its warm seed 2 (300), 30 MiB."""
    metrics = [
        fake_metrics("flat", launcher="single", epochs=3, spread=(1.0, 1.0, 1.0)),
        fake_metrics("graph", epochs=3, spread=(1.2, 1.0, 1.0)),
        fake_metrics("kept", epochs=3, spread=(1.2, 1.0, 1.0)),
    ]
    metrics[2]["seeds"][0]["kept"] = True
    metrics[2] |= record.combine(metrics[2])
    study = alike("parallelism", {"baseline": "flat"}, metrics)
    frame = study.results_frame().set_index("run")
    assert frame.at["graph", "peak_gpu_mem_allocated_bytes"] == pytest.approx(300 * MIB)
    assert frame.at["graph", "peak_gpu_mem_allocated_bytes_ci95"] == 0  # seeds 1, 2 agree
    row = summarize(metrics[1])  # runs.csv's row
    assert row["peak_gpu_mem_reserved_bytes"] == pytest.approx(600 * MIB)
    assert row["peak_gpu_mem_reserved_bytes_ci95"] == 0
    # metrics.json holds no second, one-seed figure beside runs.csv's; seed 0 peaked 60 MiB
    # above the warm seeds' mean.
    assert "memory" not in metrics[1]
    excess = record.first_seed_excess(metrics[1]["seeds"], "peak_gpu_mem_allocated_bytes")
    assert excess == pytest.approx(60 * MIB)
    assert "peak_gpu_mem_allocated_bytes" not in metrics[1]["summary"]
    warm = study.seed_values("graph", "peak_gpu_mem_allocated_bytes")
    assert warm == [pytest.approx(300 * MIB)] * 2
    assert observations.memory_per_job(study) == [
        "GPU memory is each run's mean over the seeds of a warm process (each job's seeds after "
        "its first), with its interval over them. The first seed of a job peaked higher, by "
        "graph 60.0 MiB, kept 30.0 MiB, with graph or compiled steps, where cuDNN's "
        "autotuning (cudnn.benchmark) is on: it tries several algorithms per new shape, each "
        "with its workspace, and bench/seed_memory.py reproduced such an excess with "
        "autotuning on, none with it off, on another host; for these runs it was not "
        "isolated. A job of one seed needs that much more."
    ]
    # An eager run's first-seed excess is named, not put down to autotuning (it is off there).
    eager = [fake_metrics("eager", epochs=3, spread=(1.01, 1.0, 1.0), step="eager"), metrics[0]]
    line = observations.memory_per_job(alike("parallelism", {"baseline": "flat"}, eager))[0]
    assert line.endswith("With eager steps the first seed also peaked higher, by eager 3.0 "
                         "MiB; that was not measured further.")  # fmt: skip
    assert observations.memory_per_job(study)[0] in observations.all_observations(study)
    assert observations.memory_per_job(a1_study()) == []  # one seed: nothing to say


def test_figures_draw_the_seeds_intervals(tmp_path, monkeypatch):
    """Error bars of the overview and the speed-up, bands of the curves, at the intervals of
    the seeds' numbers (single_gpu's samples/s 1000 / 0.9, 1000 / 1.0, 1000 / 1.1)."""
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.stem, fig))
    study = seeds_study()
    figures.overview(study, tmp_path / "overview.png")
    (time_bars,) = [c for c in drawn["overview"].axes[0].containers
                    if isinstance(c, ErrorbarContainer)]  # fmt: skip
    time_bars = time_bars.lines[2][0].get_segments()
    speeds = [1000 / f for f in (0.9, 1.0, 1.1)]
    half = scipy.stats.t.ppf(0.975, 2) * np.std(speeds, ddof=1) / np.sqrt(3)
    mean = np.mean(speeds)
    assert time_bars[0][:, 0] == pytest.approx([mean - half, mean + half], abs=1e-3)
    assert np.isnan(time_bars[2]).all()  # one seed: no whisker, no cap
    assert drawn["overview"].axes[0].get_xscale() == "linear"  # (runs within tenfold)

    figures.overlay(study, tmp_path / "curves.png")
    accuracy = drawn["curves"].axes[1]
    band = accuracy.collections[0].get_paths()[0].vertices  # single_gpu's test accuracy
    at_last_epoch = sorted(band[band[:, 0] == 3][:, 1])
    assert at_last_epoch[0] == pytest.approx(80 - 19.873, abs=1e-3)
    assert at_last_epoch[-1] == pytest.approx(80 + 19.873, abs=1e-3)
    assert len(accuracy.collections) == 2  # the test bands of the two runs with seeds

    figures.speedup(study, tmp_path / "speedup.png")
    bars = {c.get_label(): c for c in drawn["speedup"].axes[0].containers}
    (segment,) = bars["ddp_2gpu: 1.62×"].lines[2][0].get_segments()
    logs = [np.log(rate / np.array(spread)) for rate, spread in
            ((1620.0, (0.95, 1.0, 1.05)), (1000.0, (0.9, 1.0, 1.1)))]  # fmt: skip
    ci = scipy.stats.ttest_ind(*logs, equal_var=False).confidence_interval(0.95)
    assert segment[:, 1] == pytest.approx(np.exp([ci.low, ci.high]))

    figures.run_curves(study, "single_gpu", tmp_path / "single_gpu.png")
    assert len(drawn["single_gpu"].axes[0].collections) == 2  # train and test loss bands


def test_a_study_with_seeds_builds_every_figure(tmp_path):
    metrics = [
        fake_metrics(f"b{b}", study="batch_size", batch_size=b, gpu_mib=100 + 2.5 * b, epochs=2,
                     spread=(0.95, 1.0, 1.05))
        for b in (16, 32, 64)
    ]  # fmt: skip
    study = alike("batch_size", {}, metrics)
    built = section.build(study, None, tmp_path, tmp_path / "curves", tmp_path / "figures")
    assert [f["name"] for f in built["figures"]] == ["overview", "curves", "sweep",
                                                     "generalization"]  # fmt: skip
    for item in built["figures"] + built["curves"]:
        assert (tmp_path / item["file"]).read_bytes()[:4] == b"\x89PNG"
    csv = pd.read_csv(tmp_path / "results.csv")
    assert list(csv["n_seeds"]) == [3, 3, 3] and csv["test_accuracy_ci95"].gt(0).all()


def test_a_run_scales_against_the_single_worker_run_that_stepped_as_it_did():
    """Before: A1's DataParallel, which asks for a CUDA graph and steps eagerly, scaled
    against the graph-replayed single_gpu (0.05×, parallel efficiency 3%): the step changed
    with the launcher, unsaid. It scales against the eager single-GPU run."""
    why = "DataParallel copies the model to its GPUs from Python in every step"
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single", samples_per_s=10000.0),
            fake_metrics("single_gpu_eager", launcher="single", step="eager",
                         samples_per_s=1000.0),
            fake_metrics("dp", launcher="dp", nproc_per_node=2, eager_reason=why,
                         samples_per_s=1200.0),
        ],
    )  # fmt: skip
    assert study.scaling_reference("dp") == "single_gpu_eager"
    assert observations.scaling(study) == [
        "dp (2 workers): speed-up over single_gpu_eager (1 worker) 1.20×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 60%."
    ]


def test_runs_that_could_not_use_a_cuda_graph_are_named_with_the_reason():
    dp_reason = "DataParallel copies the model to its GPUs from Python in every step"
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single"),
            fake_metrics("single_gpu_dataloader", launcher="single", loader="torch", step="eager"),
            fake_metrics("dp_a", launcher="dp", nproc_per_node=2, eager_reason=dp_reason),
            fake_metrics("dp_b", launcher="dp", nproc_per_node=2, eager_reason=dp_reason),
        ],
    )
    # Only GPU runs that asked for a graph and didn't get one; eager by request is silent.
    assert observations.step_check(study) == [
        f"Trained eagerly, not from a CUDA graph ({dp_reason}): dp_a, dp_b."
    ]
    assert study.runs.loc["single_gpu", "step_mode"] == "cuda_graph"


def _on_cpu(metrics: dict, kernels: dict | None, flags: list[str] | None) -> dict:
    metrics["derived"]["device"] = "cpu"
    metrics["host"]["cpu_half_precision"] = {"onednn_kernels": kernels, "flags": flags}
    return metrics


def test_half_precision_a_cpu_computes_slowly_is_named_with_its_cause():
    def study(kernels, flags):
        runs = [_on_cpu(fake_metrics(p, study="precision", precision=p), kernels, flags)
                for p in ("fp32", "bf16", "fp16")]  # fmt: skip
        return alike("precision", {}, runs)

    # The development machine: AVX-512 without bf16 or fp16 instructions.
    lines = observations.cpu_half_precision(study({"bf16": True, "fp16": False}, []))
    assert len(lines) == 2
    assert lines[0].startswith("fp16: the oneDNN probe of this host found no fp16 kernel for this")
    assert "(convolutions: aten::_slow_conv2d_forward and _backward, as bench" in lines[0]
    assert lines[1].startswith("bf16: the CPU flags of this host show no bf16 instructions")
    # A CPU with AMX for both computes both natively: nothing to explain.
    assert not observations.cpu_half_precision(
        study({"bf16": True, "fp16": True}, ["avx512_bf16", "amx_bf16", "amx_fp16"])
    )
    # The lent H200 hosts' Xeon: oneDNN has fp16 kernels, but its weight gradient without
    # AMX-FP16 is oneDNN's reference code (bench/cpu_autocast.py, ONEDNN_VERBOSE).
    [line] = observations.cpu_half_precision(
        study({"bf16": True, "fp16": True}, ["avx512_bf16", "avx512_fp16", "amx_bf16"])
    )
    assert line.startswith("fp16: this CPU has oneDNN fp16 kernels but no AMX-FP16")
    assert "(ref:any in ONEDNN_VERBOSE)" in line
    # A record older than these facts says nothing it doesn't know.
    old = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in old:
        m["derived"]["device"] = "cpu"
    assert not observations.cpu_half_precision(alike("precision", {}, old))
    # GPU runs are not the CPU's business.
    gpu = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in gpu:
        m["host"]["cpu_half_precision"] = {"onednn_kernels": {"bf16": True, "fp16": False},
                                           "flags": []}  # fmt: skip
    assert not observations.cpu_half_precision(alike("precision", {}, gpu))


@pytest.mark.parametrize("storage", ["python", "pyarrow"])
def test_half_precision_note_on_a_study_of_gpu_runs_whatever_backs_pandas_strings(storage):
    """A study whose runs all trained on GPUs of a host whose CPU has bf16 instructions: no
    CPU line, with pandas' strings backed by Python or by Arrow (pyarrow installed, as on the
    lent GPU hosts, where masks mapped from an empty string column stayed strings and `&`
    raised in report_study: 2x H200, pandas 3.0.6, pyarrow 25.0.1)."""
    gpu = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in gpu:
        m["host"]["cpu_half_precision"] = {"onednn_kernels": {"bf16": True, "fp16": True},
                                           "flags": ["avx512_bf16", "amx_bf16"]}  # fmt: skip
    with pd.option_context("mode.string_storage", storage):
        study = alike("precision", {}, gpu)
        assert study.ok["cpu_half_flags"].dtype.storage == storage
        assert observations.cpu_half_precision(study) == []


def test_each_data_path_scales_against_its_own_single_worker_run(tmp_path):
    course = {"loader": "torch", "step": "eager"}
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single", samples_per_s=10000.0),
            fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=18000.0),
            fake_metrics(
                "single_gpu_dataloader", launcher="single", samples_per_s=1000.0, **course
            ),
            fake_metrics(
                "ddp_2gpu_dataloader", launcher="torchrun", nproc_per_node=2,
                samples_per_s=1500.0, **course,
            ),
        ],
    )  # fmt: skip
    assert study.scales_workers
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.80×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 90%.",
        "ddp_2gpu_dataloader (2 workers): speed-up over single_gpu_dataloader (1 worker) 1.50×, "
        "too few seeds to tell; ideal 2×, parallel efficiency 75%.",
    ]
    # The throughput comparison still shows what the data path itself is worth.
    assert observations.versus_baseline(study)[1].startswith(
        "single_gpu_dataloader vs single_gpu (they differ in loader (torch vs device), step (eager "
        "vs CUDA graph)): samples/s over the steady epochs 1,000 vs 10,000 "
        "(geometric means): 0.10×, too few seeds to tell;"
    )
    figures.speedup(study, tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_a_cpu_runs_memory_is_one_value_per_job_and_its_verdict_says_so():
    """Before: a CPU run's peak host RSS (one value per job) read "too few seeds to tell" in
    the observations and "too few jobs to tell" in the answer."""
    runs = [fake_metrics("single_gpu", launcher="single", gpu_mib=None, spread=(1.0, 1.1)),
            fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, gpu_mib=None,
                         spread=(1.0, 1.1))]  # fmt: skip
    for m in runs:
        m["derived"]["device"] = "cpu"
    [line] = observations.versus_baseline(alike("parallelism", {}, runs))
    assert line.endswith("peak host RSS (max over ranks) 2000.0 vs 2000.0 MiB, 1.00×, too few "
                         "jobs to tell.")  # fmt: skip


def test_a_skipped_baseline_gives_no_comparison():
    lines = observations.versus_baseline(a1_study(baseline="dataparallel_2gpu"))
    assert lines == [
        "The baseline dataparallel_2gpu has no numbers (skipped), so no run is compared with it."
    ]


def test_sweep_fits_memory_against_the_swept_setting():
    metrics = [
        fake_metrics(
            f"b{b}",
            study="batch_size",
            batch_size=b,
            gpu_mib=100 + 2.5 * b,
            epochs=2,
            test_accuracy=0.9 - b / 1000,
        )
        for b in (16, 32, 64, 128)
    ]
    study = alike("batch_size", {"baseline": "b32"}, metrics)
    assert study.sweep_key == "batch_size"
    lines = observations.sweep(study)
    # The answer's fit (comparisons.fit), so that the section gives one line, not two.
    assert lines[0].startswith(
        "peak GPU memory vs batch_size: grows along a line within noise, 2.500 MiB per unit of "
        "batch_size"
    )
    assert "plus 100.0 MiB" in lines[0] and "R² = 1.000" in lines[0]
    assert lines[1] == (
        "From batch_size 16 to 128: samples/s over the steady epochs 1,000 → 1,000 (geometric "
        "means), 1.00×, too few seeds to tell; test accuracy 88.40% → 77.20%, −11.2 points, too "
        "few seeds to tell; the means are falling at every step."
    )


def test_each_section_says_whether_its_jobs_had_the_host_to_themselves():
    def shared(*launches):
        metrics = []
        for i, launch in enumerate(launches):
            m = fake_metrics(f"r{i}")
            m["launch"] = launch | {"seconds": 100.0}
            metrics.append(m)
        return alike("parallelism", {}, metrics).provenance()["isolation"]

    # What the config enforced (no other job of the DAG beside it), never that the host was
    # otherwise idle: what else ran there is the measured `load` (below).
    assert shared({"isolation": "host"}, {"isolation": "host"}) == (
        "no other job of this DAG beside it"
    )
    assert "CPU package" in shared({"isolation": "host"}, {"isolation": "devices"})
    assert "not comparable" in shared({"isolation": "devices"}, {"exclusive": False})


def test_a_cpu_run_on_a_gpu_host_says_it_ran_on_the_cpu():
    """The example's B sections said "4× NVIDIA H200" for runs that trained on CPUs."""
    gpu, cpu = fake_metrics("g"), fake_metrics("c")
    cpu["derived"]["device"] = "cpu"
    assert alike("parallelism", {}, [gpu]).provenance()["card"] == "1× NVIDIA H100"
    assert alike("parallelism", {}, [cpu]).provenance()["card"] == "CPU: Xeon"


def test_a_section_whose_runs_overlapped_no_other_job_says_it_ran_alone():
    """The example's B1 and B2 ran one run at a time after the DAG, under `isolation: devices`:
    their provenance said "beside other jobs"."""
    import pandas as pd

    from dmls.report import page
    from dmls.report.study import ALONE, SHARED

    def row(job: str, start: int, end: int, status: str = "ok") -> dict:
        t = pd.Timestamp("2026-11-28T16:00:00")
        return {"job": job, "status": status, "start": t + pd.Timedelta(seconds=start),
                "end": t + pd.Timedelta(seconds=end)}  # fmt: skip

    rows = [row("b1/one", 0, 10), row("b1/two", 10, 20), row("a1/x", 20, 30),
            row("study graphs", 25, 40), row("a1/skipped", 0, 40, "skipped")]  # fmt: skip
    assert page.ran_alone("b1", rows)  # touching ends and a skipped run's span don't overlap
    assert not page.ran_alone("a1", rows)  # beside the graphs study
    assert not page.ran_alone("b1", [*rows, row("b1/three", 15, 25)])  # beside its own run
    assert not page.ran_alone("c", rows)  # no finished run: nothing to say

    def item(key: str, isolation: str) -> dict:
        return {"kind": "runs", "section": {"key": key}, "provenance": {"isolation": isolation}}

    items = [item("b1", SHARED["devices"]), item("a1", SHARED["devices"]),
             item("h", SHARED["host"])]  # fmt: skip
    page.say_who_ran_alone(items, [*rows, row("h/r", 50, 60)])
    said = [i["provenance"]["isolation"] for i in items]
    assert said == [ALONE, SHARED["devices"], SHARED["host"]]


def test_generalization_flags_test_loss_rising_while_train_loss_falls():
    losses = [(2.0, 1.9), (1.5, 1.6), (1.0, 1.7), (0.5, 1.9)]  # train falls, test turns up
    history = [
        {
            "epoch": e,
            "train_loss": tr,
            "test_loss": te,
            "train_accuracy": 0.5 + 0.1 * e,
            "test_accuracy": 0.5,
            "train_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e, (tr, te) in enumerate(losses, start=1)
    ]
    metrics = [
        fake_metrics("steady", epochs=3),
        # Three seeds, each rising from epoch 2 (the rule: an interval over the seeds).
        fake_metrics("overfits", epochs=4, history=history, spread=(0.95, 1.0, 1.05)),
    ]
    result = overfitting.generalization(alike("parallelism", {}, metrics))
    rows = {row[0]: row for row in result["rows"]}
    assert rows["overfits"][3] == "2 of 4" and rows["overfits"][5] == "yes"
    assert rows["overfits"][1] == "40.0"  # train 90% vs test 50% at the end
    assert rows["steady"][5] == "no"
    assert "overfits" in result["summary"]


def test_grid_study_draws_a_heatmap_and_the_speedup(tmp_path):
    metrics = [
        fake_metrics(
            f"n{n}xp{p}",
            study="cluster_torchrun",
            nodes=n,
            nproc_per_node=p,
            launcher="torchrun",
            samples_per_s=1000.0 if n * p == 1 else 900.0 * n * p,
            gpu_mib=None,
            epochs=2,
        )
        for n in (1, 2)
        for p in (1, 2)
    ]
    study = alike("cluster_torchrun", {}, metrics)
    assert study.is_grid and study.scales_workers
    built = section.build(study, None, tmp_path, tmp_path / "curves", tmp_path / "figures")
    names = [f["name"] for f in built["figures"]]
    assert names == ["overview", "curves", "speedup", "grid", "generalization"]
    for item in built["figures"] + built["curves"]:
        assert (tmp_path / item["file"]).read_bytes()[:4] == b"\x89PNG"
    assert (
        "n2xp2 (4 workers): speed-up over n1xp1 (1 worker) 3.60×, too few seeds to tell; ideal "
        "4×, parallel efficiency 90%." in built["observations"]
    )
    # CSV: numbers only for ok runs; the memory is host RSS here (no GPU).
    csv = (tmp_path / "results.csv").read_text()
    assert csv.splitlines()[0].startswith("run,status,reason,spec.nodes,spec.nproc_per_node")


def test_a_study_where_nothing_ran_draws_its_reasons(tmp_path):
    metrics = [fake_metrics("fp8", "skipped", study="precision", epochs=2)]
    built = section.build(
        alike("precision", {}, metrics), None, tmp_path, tmp_path / "c", tmp_path / "f"
    )
    assert [f["name"] for f in built["figures"]] == ["no_results"]
    assert built["curves"][0]["file"] == "c/fp8.png"


def test_page_escapes_config_strings_and_embeds_everything(tmp_path):
    hostile = '<script>alert("x")</script>'
    study = a1_study(title=f"A1 {hostile}")
    section.build(
        study,
        None,
        tmp_path / "parallelism",
        tmp_path / "parallelism" / "curves",
        tmp_path / "parallelism" / "figures",
    )
    metrics_paths = []
    for m in study.metrics.values():
        path = tmp_path / "runs" / m["run"] / "metrics.json"
        write_json(path, m)
        metrics_paths.append(path)
    runs_csv, seeds_csv = tmp_path / "runs.csv", tmp_path / "seeds.csv"
    records = read_all(metrics_paths)
    runs_table(records).to_csv(runs_csv, index=False)
    seeds_table(records).to_csv(seeds_csv, index=False)
    manifest = tmp_path / "data.json"
    write_json(
        manifest,
        {
            "name": "synthetic_cifar",
            "status": "ok",
            "synthetic": True,
            "source": "synthetic, seed 0",
            "n_train": 10,
            "n_test": 5,
        },
    )
    config = {"studies": {"parallelism": {"title": f"A1 {hostile}"}},
              "special_studies": {"spark_lazy": {"enabled": False}}}  # fmt: skip
    rendered = page.render(
        template_dir=ROOT / "report",
        texts_path=ROOT / "report" / "studies.yaml",
        section_paths=[tmp_path / "parallelism" / "section.json"],
        special_paths=[],
        runs_csv=runs_csv,
        seeds_csv=seeds_csv,
        metrics_paths=metrics_paths,
        manifest_paths=[manifest],
        config=copy.deepcopy(config),
        workflow_dir=ROOT,
        studies=STUDIES,
    )
    assert hostile not in rendered and "&lt;script&gt;alert(" in rendered
    assert rendered.count("<script>") == 1  # only the all-runs table's script of the template
    # overview, curves, speedup, generalization; 3 runs' curves; A2's generalization again;
    # the DAG's timeline.
    assert len(re.findall(r'src="data:image/png;base64,', rendered)) == 4 + 3 + 1 + 1
    assert '<section id="timeline">' in rendered
    assert 'download="runs.csv"' in rendered and 'download="seeds.csv"' in rendered
    assert "SYNTHETIC" in rendered and "1 × NVIDIA H100" in rendered and "580.1" in rendered
    assert "Course reference (other students" in rendered  # labelled apart from our numbers
    assert "no CUDA GPU on this host" in rendered
    # A study of the report's text this folder did not run is listed with why, never missing.
    assert ("Not run: this folder&#39;s config turns it off (special_studies.spark_lazy.enabled: "
            "false).") in rendered  # fmt: skip
    assert "Not run: this folder&#39;s config has no study precision." in rendered
    assert '<section id="spark_lazy" class="study">' in rendered
    # No number from the skipped run anywhere in its row of the results table.
    row = re.search(r"<tr class=\"not-ok\"><td>dataparallel_2gpu</td>.*?</tr>", rendered, re.S)
    assert row and not re.search(r">\s*\d", row.group(0).split("colspan")[0])


def test_every_study_of_the_config_has_its_text():
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    runs = {e.get("from") or e["study"] for e in texts["sections"] if "special" not in e}
    assert set(config["studies"]) <= runs
    assert {e["study"] for e in texts["sections"] if "from" in e} == {"overfitting"}
    specials = {e["special"] for e in texts["sections"] if "special" in e}
    assert specials == set(config["special_studies"])


def test_rst_captions_of_the_rules_exist():
    rules = (ROOT / "rules" / "report.smk").read_text()
    for caption in re.findall(r'caption="\.\./(report/[\w.]+)"', rules):
        assert Path(ROOT / caption).is_file(), caption


def test_both_reports_caption_each_figure_kind_with_the_same_words():
    """report/captions.yaml is the one source: the HTML report escapes the study's names,
    report/figure.rst (rendered as Snakemake renders captions) shows them as literals."""
    texts = captions.load(ROOT / "report" / "captions.yaml")
    kinds = {
        "overview",
        "curves",
        "speedup",
        "grid",
        "sweep",
        "generalization",
        "comparison",
        "time_to_accuracy",
        "energy",
    }
    assert set(texts["figures"]) == kinds | {"no_results"}
    rst = captions.for_snakemake_report(texts, baseline="b<1>", compare_with="c")
    figure_rst = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        (ROOT / "report" / "figure.rst").read_text()
    )
    for kind in texts["figures"]:
        shown = captions.for_html(texts, kind, {"baseline": "b<1>", "compare_with": "c"})
        assert html.unescape(shown) == rst[kind].replace("``", "")
        job = SimpleNamespace(
            wildcards=SimpleNamespace(figure=kind), params=SimpleNamespace(captions=rst)
        )
        assert figure_rst.render(snakemake=job).strip() == rst[kind]
    assert "b&lt;1&gt;" in captions.for_html(
        texts, "speedup", {"baseline": "b<1>", "compare_with": None}
    )
    assert "comparison" not in captions.for_snakemake_report(texts, baseline="b", compare_with=None)


def test_special_study_rows_without_numbers_keep_only_their_reason(tmp_path):
    folder = tmp_path / "fused_conv"
    folder.mkdir()
    rows = [
        {"device": "cuda", "depth": 2, "mode": "fused", "status": "skipped",
         "reason": "'fused' needs a CUDA GPU"},
        {"device": "cpu", "depth": 2, "mode": "cpu", "status": "ok", "reason": None},
    ]  # fmt: skip
    verdicts = {"convention": "cudnn / fused", "by_depth": {}}
    result = {"rows": rows, "data": None, "cudnn_version": None, "repeats": 1,
              "accuracy_seeds": 1, "verdicts": verdicts}  # fmt: skip
    summary.write(
        folder / "summary.json",
        summary.new(
            "fused_conv", "C. FusedConvReLU", result, config={"title": "C. FusedConvReLU"},
            host={"hostname": "h", "gpus": [], "torch": "2.14"}, threads=1,
            started_at="2026-01-01T00:00:00+00:00", wall_time_s=1.0,
        ),
    )  # fmt: skip
    (folder / "results.csv").write_text(
        "depth,title,status,reason,device_name,fused_layers,epochs,forward_ms,"
        "backward_ms,test_accuracy\n"
        "2,FusedConvReLU kernel,skipped,'fused' needs a CUDA GPU,,,,,,\n"
        '2,"baseline, CPU",ok,,cpu,0,1,0.06531,0.0693,0.9012\n'
    )
    section = special.load(folder / "summary.json", STUDIES)
    table = section["tables"][0]
    skipped, ok = table["rows"]
    assert skipped["reason"] == "'fused' needs a CUDA GPU"
    assert skipped["cells"] == ["2", "FusedConvReLU kernel"] + [""] * 6
    assert ok["cells"][-4:] == ["0.06531", "0.0693", "1", "0.9012"]
    assert section["skipped"] == ["cuda 2 fused: skipped — 'fused' needs a CUDA GPU"]


def test_a_damaged_metrics_file_is_named_with_how_to_rebuild_it(tmp_path):
    """Before: a truncated metrics.json failed the aggregation with a bare JSONDecodeError
    naming none of the files."""
    good = tmp_path / "a" / "metrics.json"
    write_json(good, fake_metrics("a"))
    cut = tmp_path / "b" / "metrics.json"
    cut.parent.mkdir()
    cut.write_text(good.read_text()[:200])
    with pytest.raises(record.RecordError) as err:
        read_all([good, cut])
    assert str(err.value).startswith(f"{cut} is not valid JSON (")
    assert str(err.value).endswith(
        f"cut short or changed; rebuild that run: snakemake --forcerun {cut}"
    )
    cut.write_text("{}")
    with pytest.raises(record.RecordError, match=r"version None, this pipeline reads 4; rebuild"):
        read_all([cut])


def test_a5_predicts_each_backends_all_reduce_from_the_collectives_sweep():
    """The course CNN's 620,586 parameters: a 2.37 MiB gradient, all-reduced by DDP in a 1 MiB
    bucket and a 1.37 MiB one; 50,000 images at 32 per rank on 2 ranks: 782 steps per epoch.
    The sweep's latencies grow as size^0.5 (NCCL: 50 µs at 1 MiB, 100 at 4 MiB) and size^1
    (Gloo: 500 and 2000 µs): 0.1085 and 1.1837 ms per step, 0.0848 and 0.926 s per epoch."""

    def run(name: str, backend: str, epoch_s: float) -> dict:
        metrics = fake_metrics(name, study="backend", launcher="torchrun", nproc_per_node=2,
                               backend=backend, epochs=3, history=epochs([2 * epoch_s, epoch_s,
                               epoch_s]), spread=(0.9, 1.0, 1.1))  # fmt: skip
        metrics |= {"parameters": 620586}
        metrics["data"]["n_train"] = 50000
        for rank in metrics["ranks"]:
            rank["device"] = f"cuda:{rank['rank']}"
        return metrics

    study = alike("backend", {}, [run("nccl_b32", "nccl", 0.44), run("gloo_b32", "gloo", 4.1)])
    sweep = pd.DataFrame(
        [{"backend": b, "device": "cuda", "op": "all_reduce", "processes": 2, "status": "ok",
          "size_bytes": size, "latency_us": us}
         for b, points in (("nccl", ((MIB, 50.0), (4 * MIB, 100.0))),
                           ("gloo", ((MIB, 500.0), (4 * MIB, 2000.0))))
         for size, us in points]
    )  # fmt: skip
    nccl, gloo, pair = observations.communication(study, sweep)
    assert "2.37 MiB gradient (nccl, cuda tensors, 2 processes" in nccl
    assert "at 0.108 ms; its 782 steps per epoch make 0.08 s" in nccl
    assert "at 1.18 ms; its 782 steps per epoch make 0.93 s" in gloo
    # Measured: 4.1 vs 0.44 s (seeds ×0.9, 1, 1.1); predicted 0.841 s of the 3.66 s gap.
    assert pair.startswith("gloo_b32 vs nccl_b32: their steady epochs differ by 3.66 s")
    assert pair.endswith("the sweep puts 23% of the gap on the all-reduce; 77% of it stays "
                         "unexplained here.")  # fmt: skip
    assert observations.communication(study, None) == []
    # Gloo's epoch at 1.3 s: a 0.86 s gap (95% interval 0.57 to 1.15 s) holds the 0.84 s.
    study = alike("backend", {}, [run("nccl_b32", "nccl", 0.44), run("gloo_b32", "gloo", 1.3)])
    *_, pair = observations.communication(study, sweep)
    assert pair.endswith("98% of the gap on the all-reduce, and the prediction lies inside the "
                         "measured interval.")  # fmt: skip


def test_time_to_target_accuracy_per_run_with_its_interval_and_against_the_baseline(tmp_path):
    """single_gpu's seeds (×0.9, 1, 1.1 of 15/10/10 s epochs, 1 s of evaluation each; test
    accuracy 80% × epoch/3 × factor) reach 50% at epoch 3, 2, 2: after 34.5, 27 and 29.5 s.
    The time is the warm process's, seeds 1 and 2 (record.timed_seeds); the epochs every
    seed's."""
    metrics = [
        fake_metrics("single_gpu", launcher="single", epochs=3, history=epochs([15, 10, 10]),
                     spread=(0.9, 1.0, 1.1)),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0,
                     epochs=3, history=epochs([15, 10, 10]), spread=(0.45, 0.5, 0.55)),
    ]  # fmt: skip
    study = alike("parallelism", {"target_accuracy": 0.5}, metrics)
    row = study.runs.loc["single_gpu"]
    assert row["time_to_target_s"] == pytest.approx((27 + 29.5) / 2)
    assert row["epochs_to_target"] == pytest.approx(7 / 3)
    assert row["seeds_to_target"] == "3 of 3" and row["seeds_timed_to_target"] == 2
    half_width = scipy.stats.t.ppf(0.975, 1) * np.std([27, 29.5], ddof=1) / np.sqrt(2)
    assert row["time_to_target_s_ci95"] == pytest.approx(half_width)
    assert study.seconds_to_target("single_gpu") == [27, 29.5]
    table = study.results_table()
    assert table["columns"][-3:] == ["Time to 50% test acc. (s)", "Epochs to 50%",
                                     "Seeds that reached it"]  # fmt: skip
    # ddp_2gpu's seeds (×0.45, 0.5, 0.55) never reach 50%: no time, and the report says so.
    ddp = study.runs.loc["ddp_2gpu"]
    assert ddp["seeds_to_target"] == "0 of 3" and pd.isna(ddp["time_to_target_s"])
    lines = observations.time_to_accuracy(study)
    assert lines[0].startswith("single_gpu reaches 50% test accuracy in 28.2 s")
    assert lines[1] == "ddp_2gpu: 0 of 3 seeds reached 50% test accuracy within 3 epochs: no " \
                       "time to it is given."  # fmt: skip
    # The first seed's 34.5 s against the warm seeds' 28.25: 6.25 s of the process's warm-up.
    assert lines[2].startswith("Times and energy to the target are those of the seeds that "
                               "trained in a warm process")  # fmt: skip
    assert "took longer to the target by single_gpu 6.25 s." in lines[2]
    assert len(lines) == 3
    names = [name for name, _ in figures.study_figures(study, None, tmp_path)]
    assert "time_to_accuracy" in names
    assert "time_to_target_s_ci95" in study.results_frame().columns
    # Without a target: none of it.
    plain = alike("parallelism", {}, metrics)
    assert observations.time_to_accuracy(plain) == [] and len(plain.result_columns) == 17


def test_seeds_of_a_warm_process_are_each_seed_after_the_first_of_its_process():
    """A job killed during seed 2 and run again: seeds 0 and 1 were kept from the first
    process (0 cold, 1 warm), seed 2 is the new process's first (cold), seed 3 warm. A job of
    one seed, or of cold seeds only, times every seed; a diverged seed is never counted."""
    from dmls.record import counted_seeds, timed_seeds, warm_seeds

    def job(*kept, diverged=()):
        return {"seeds": [{"kept": k, "status": "diverged" if i in diverged else "ok"}
                          for i, k in enumerate(kept)]}  # fmt: skip

    assert warm_seeds(job(True, True, False, False)) == [1, 3]
    assert warm_seeds(job(False, False, False)) == [1, 2]
    assert timed_seeds(job(False)) == [0]
    assert timed_seeds(job(True, False)) == [0, 1]
    assert counted_seeds(job(False, False, False, diverged=[2]), "step_gpu_mem_bytes") == [1]
    assert counted_seeds(job(False, False, False, diverged=[2]), "test_accuracy") == [0, 1]


def test_the_timeline_puts_gpu_jobs_on_their_gpus_and_stacks_cpu_jobs_side_by_side():
    from dmls.report import timeline

    def run(name, start, end, gpus=(), status="ok"):
        stamp = "2026-11-27T10:00:{:02d}+00:00"
        return {"job": name, "status": status, "gpu_ids": list(gpus), "gpus": len(gpus),
                "start": pd.Timestamp(stamp.format(start)), "end": pd.Timestamp(stamp.format(end)),
                "train_s": 1.25}  # fmt: skip

    rows = timeline.with_offsets([
        run("a/ddp", 5, 20, gpus=("0", "1")), run("a/cpu1", 0, 10), run("a/cpu2", 2, 8),
        run("a/cpu3", 12, 30, status="failed"), run("b/single", 21, 25, gpus=("1",)),
        {"job": "study x", "status": "ok", "start": None, "end": None},  # never started
    ])  # fmt: skip
    assert [r["job"] for r in rows] == ["a/cpu1", "a/cpu2", "a/ddp", "a/cpu3", "b/single"]
    bars = [(lane, r["job"]) for lane, r in timeline.lanes(rows)]
    assert bars == [("CPU 1", "a/cpu1"), ("CPU 2", "a/cpu2"), ("GPU 0", "a/ddp"),
                    ("GPU 1", "a/ddp"), ("CPU 1", "a/cpu3"), ("GPU 1", "b/single")]  # fmt: skip
    table = timeline.table(rows)
    assert table["columns"][:4] == ["job", "status", "start (s)", "end (s)"]
    assert table["rows"][0][:4] == ["a/cpu1", "ok", "0.0", "10.0"]
    assert table["rows"][0][table["columns"].index("training (s)")] == "1.2"
    assert timeline.summary(rows) == (
        "5 jobs over 30 s; their own times add up to 53 s (1.8 jobs at a time on average)."
    )
    timeline.figure(rows)  # draws
    # A short idle gap inside a DAG is no second sitting (runs added later: below).
    pause = timeline.with_offsets([run("a/cpu1", 0, 10), run("b/next", 50, 55)])
    assert timeline.summary(pause) == (
        "2 jobs over 55 s; their own times add up to 15 s (0.3 jobs at a time on average)."
    )


def test_the_header_gives_each_sittings_wall_time_when_runs_were_added_later():
    from dmls.report import timeline
    from dmls.report.page import wall_time

    def m(start: str, end: str) -> dict:
        return timeline.run_row({"study": "s", "run": start, "status": "ok",
                "started_at": f"2026-11-28T{start}+00:00", "finished_at": f"2026-11-28T{end}+00:00",
                "launch": {"seconds": 60.0}})  # fmt: skip

    dag = [m("13:00:00", "13:10:00"), m("13:05:00", "13:22:00")]
    assert wall_time(dag)["sittings_s"] == [1320.0] and wall_time(dag)["span_s"] == 1320.0
    later = wall_time([*dag, m("16:13:00", "16:14:00"), m("16:14:10", "16:18:00")])
    assert later["sittings_s"] == [1320.0, 300.0] and later["runs_s"] == 240.0
    # The timeline draws each sitting on an axis of its own, without the idle hours between,
    # and its summary does not count them as the DAG's.
    rows = timeline.with_offsets([*dag, m("16:13:00", "16:14:00"), m("16:14:10", "16:18:00")])
    assert timeline.sittings(rows) == [(0.0, 1320.0), (11580.0, 11880.0)]
    assert timeline.summary(rows) == (
        "4 jobs over 11880 s, 10260 s of it between 2 sittings with none running (runs added "
        "later); their own times add up to 1910 s (1.2 jobs at a time within the sittings)."
    )
    axes = timeline.figure(rows).axes
    assert [a.get_title() for a in axes] == ["sitting 1", "sitting 2"]
    assert axes[1].get_xlim()[0] > 11000 and axes[0].get_xlim()[1] < 1400


def test_a_study_trained_again_on_another_machine_is_a_sitting_and_a_host_of_its_own():
    """Before: the example's A4, trained again on a 2-GPU host minutes after the DAG on a
    4-GPU one (both named "vm"), merged into one 29.9-minute "DAG wall time", and the hardware
    table counted all runs on one host "vm" with the 4-GPU host's GPUs."""
    from dmls.report import page, timeline

    def m(start: str, end: str, gpus: int) -> dict:
        host = {"hostname": "vm", "cpu_model": "Xeon", "cpu_count": 16 * gpus,
                "gpus": ["NVIDIA H200"] * gpus, "python": "3.12", "torch": "2.11",
                "accelerate": "1.15", "platform": "Linux"}  # fmt: skip
        return {"study": "s", "run": start, "status": "ok", "host": host,
                "started_at": f"2026-11-28T{start}+00:00", "finished_at": f"2026-11-28T{end}+00:00",
                "launch": {"seconds": 60.0}}  # fmt: skip

    dag = [m("13:00:00", "13:10:00", 4), m("13:05:00", "13:20:00", 4)]
    again = [m("13:24:00", "13:25:00", 2), m("13:25:05", "13:26:00", 2)]
    rows = timeline.with_offsets([timeline.run_row(r) for r in dag + again])
    assert timeline.sittings(rows) == [(0.0, 1200.0), (1440.0, 1560.0)]
    assert [a.get_title() for a in timeline.figure(rows).axes] == [
        "sitting 1\nhost vm (64 cores of Xeon; 4× NVIDIA H200)",
        "sitting 2\nhost vm (32 cores of Xeon; 2× NVIDIA H200)",
    ]
    # The same machine after a short pause stays one sitting (a DAG's jobs, then B alone).
    same = timeline.with_offsets(
        [timeline.run_row(r) for r in [*dag, m("13:24:00", "13:25:00", 4)]]
    )
    assert len(timeline.sittings(same)) == 1
    table = page.hosts(dag + again)
    assert [(h["hostname"], h["runs"], h["gpus"]) for h in table] == [
        ("vm", 2, "4 × NVIDIA H200"), ("vm", 2, "2 × NVIDIA H200")]  # fmt: skip


def test_memory_compares_the_peak_with_what_a_step_adds_beside_it():
    """One definition first, the course's: runs are compared, and a sweep fitted, on the peak
    allocated GPU memory; what a step adds (ours) is shown beside it, never in its place."""
    metrics = []
    for batch, step_mib in ((16, 20.0), (32, 40.0), (64, 80.0), (128, 160.0)):
        m = fake_metrics(f"b{batch}", study="batch_size", batch_size=batch, spread=(1.0, 1.0))
        for seed in m["seeds"]:
            seed["gpu_mem_before_step_bytes"] = int(200 * MIB)
            seed["step_gpu_mem_bytes"] = int(step_mib * MIB)
            seed["peak_gpu_mem_allocated_bytes"] = int((210 + step_mib) * MIB)
        metrics.append(m | record.combine(m))
    study = alike("batch_size", {}, metrics)
    assert study.memory == ("peak_gpu_mem_allocated_bytes", "peak GPU memory (max over GPUs)")
    assert study.step_memory
    table = study.results_table()
    row = dict(zip(table["columns"], table["rows"][2]["cells"], strict=True))
    assert row["GPU mem. a step adds, allocated (MiB)"] == "80.0"
    assert row["Peak GPU mem., max GPU (MiB)"] == "290.0"
    key = [c for c, _ in study.key_columns]
    assert key[2:] == ["peak_gpu_mem_allocated_bytes", "step_gpu_mem_bytes"]
    (fit,) = [line for line in observations.sweep(study) if "per unit of batch_size" in line]
    assert fit.startswith(
        "peak GPU memory vs batch_size: grows along a line within noise, 1.250 MiB"
    ), fit
    assert "R² = 1.000" in fit


def test_the_terminal_summary_counts_each_studys_runs_and_says_each_reason_once(tmp_path):
    from dmls.report import outcome

    paths = []
    for m in [fake_metrics("single_gpu"), fake_metrics("dp", "skipped"),
              fake_metrics("dp2", "skipped")]:  # fmt: skip
        paths.append(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json")
        write_json(paths[-1], m)
    paths.append(tmp_path / "runs" / "parallelism" / "never" / "metrics.json")
    text = outcome.summary(paths, tmp_path / "report.html")
    assert text.splitlines() == [
        "Runs by study:",
        "  parallelism: 1 ok, 2 skipped, 1 not run",
        "  1 run(s) — dp could not run: no CUDA GPU on this host: parallelism/dp",
        "  1 run(s) — dp2 could not run: no CUDA GPU on this host: parallelism/dp2",
    ]


def test_the_terminal_summary_names_every_run_the_special_studies_and_what_a_stop_kept(tmp_path):
    """Before: "… and 8 more" in place of runs; no word of the special studies' skipped parts;
    a "Report:" line for a report an earlier invocation built; and a stopped DAG said nothing of
    what it kept or how to go on."""
    import os
    import time

    from dmls import summary as study_record
    from dmls.report import outcome

    paths = []
    for k in range(6):
        m = fake_metrics(f"dp{k}", "skipped")
        m["reason"] = "no CUDA GPU on this host"
        paths.append(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json")
        write_json(paths[-1], m)
    rows = [{"status": "ok", "reason": None, "device": "cpu"},
            {"status": "skipped", "reason": "no CUDA device", "device": "cuda"},
            {"status": "skipped", "reason": "no CUDA device", "device": "cuda"}]  # fmt: skip
    made = study_record.new("fake", "F", {"rows": rows}, config={"title": "F"},
                            host={"hostname": "h", "gpus": []}, threads=1,
                            started_at="2026-11-29T00:00:00+00:00", wall_time_s=1.0)  # fmt: skip
    study = tmp_path / "studies" / "fake" / "summary.json"
    study_record.write(study, made)
    report = tmp_path / "report.html"
    report.write_text("<html>")
    os.utime(report, (time.time() - 3600, time.time() - 3600))
    absent = tmp_path / "studies" / "graphs" / "summary.json"
    text = outcome.summary(paths, report, [study, absent], started=time.time(), stopped=True)
    lines = text.splitlines()
    assert lines[2] == "  6 run(s) — no CUDA GPU on this host: " + ", ".join(
        f"parallelism/dp{k}" for k in range(6)
    )
    assert lines[3:7] == [
        "Special studies:",
        "  fake: ok, 1 of 3 parts ran",
        "  graphs: not run",
        "  fake: 2 part(s) skipped — no CUDA device",
    ]
    assert lines[7].startswith("Report not built by this invocation; the last one (")
    assert lines[8] == outcome.STOPPED
    assert "Report: " in outcome.summary(paths, report, started=time.time() - 7200)


def test_provenance_names_the_data_the_course_used_where_ours_stands_in_and_emulated_nodes():
    """Before: A sections said "Ran on fashion_mnist" and never that it stands in for CIFAR-10;
    B's emulated nodes were said only in the header."""
    from dmls.report.cells import stand_in

    assert stand_in("fashion_mnist", "CIFAR-10") == " (real; a stand-in for the course's CIFAR-10)"
    assert stand_in("cifar10", "CIFAR-10") == ""
    assert stand_in("synthetic_cifar", "CIFAR-10") == " (a stand-in for the course's CIFAR-10)"
    grid = fake_metrics("n2xp1", launcher="torchrun", nodes=2, epochs=3)
    grid["derived"]["nodes_emulated"] = True
    p = alike("cluster_torchrun", {}, [grid]).provenance()
    assert p["nodes"].startswith("nodes emulated on one host") and p["data"] == "CIFAR-10"
    assert a1_study().provenance()["nodes"] == ""


def test_a_section_describes_the_model_as_it_ran():
    """Before: A1 never described the CNN; A3's background quoted the CIFAR model's shape."""
    study = a1_study()
    assert study.model_table() is None  # (records from before the layers were recorded)
    layers = [
        {"layer": "features.0", "kind": "Conv2d", "output_shape": [8, 28, 28], "parameters": 72},
        {"layer": "classifier.1", "kind": "Linear", "output_shape": [10], "parameters": 62730},
    ]
    study.metrics["single_gpu"]["layers"] = layers
    table = study.model_table()
    assert table["run"] == "single_gpu" and table["rows"][0] == [
        "features.0",
        "Conv2d",
        "8 × 28 × 28",
        "72",
    ]
    assert table["total"] == "62,802 parameters, 0.24 MiB of fp32 gradient"


def test_a_runs_numbers_are_built_once_and_name_the_seeds_they_count():
    """The numbers layer (report/run_numbers.py): values over the seeds record.counted_seeds
    counts, their estimate, how the text names them, and what the first seed measured more."""
    metrics = fake_metrics("graph", epochs=3, spread=(1.2, 1.0, 1.0))
    study = alike("parallelism", {}, [metrics])
    numbers = study.numbers["graph"]
    memory = "peak_gpu_mem_allocated_bytes"
    assert numbers.counted(memory) == [1, 2] and numbers.seeds_said(memory) == "warm seeds 1 and 2"
    assert numbers.estimate(memory).mean == pytest.approx(300 * MIB)
    assert numbers.first_seed_excess(memory) == pytest.approx(60 * MIB)
    assert numbers.seeds_said("test_accuracy") == "seeds 0–2"
    assert numbers.first_seed_excess("test_accuracy") == 0.0  # every seed counts
    assert study.seed_values("graph", memory) == numbers.values(memory)


def test_a_panel_whose_runs_differ_more_than_tenfold_has_a_log_axis(tmp_path, monkeypatch):
    """Before: A1's overview on a linear axis, where DDP's graph-replayed 122,938 samples/s
    left the DataLoader runs the answer reads (3,848) as slivers."""
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.stem, fig))
    runs = [fake_metrics("graphs", samples_per_s=120_000.0),
            fake_metrics("dataloader", samples_per_s=3_800.0)]  # fmt: skip
    figures.overview(alike("parallelism", {}, runs), tmp_path / "overview.png")
    throughput, memory, accuracy = drawn["overview"].axes
    assert throughput.get_xscale() == "log" and "log scale" in throughput.get_xlabel()
    assert memory.get_xscale() == accuracy.get_xscale() == "linear"
    assert figures.wide([1.0, 10.5]) and not figures.wide([1.0, 10.0, float("nan")])


def test_the_start_says_which_finished_runs_changed_settings_will_replace(tmp_path):
    """Before: `--config seeds=1` on a finished folder retrained every run, replacing its
    results, without a word first."""
    from dmls.report import outcome

    kept, changed = fake_metrics("kept"), fake_metrics("changed")
    for m in (kept, changed):
        write_json(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json", m)
    planned = {f"parallelism/{m['run']}": dict(m["spec"]) for m in (kept, changed)}
    planned["parallelism/changed"]["seeds"] = changed["spec"]["seeds"] + 1
    planned["parallelism/new"] = dict(kept["spec"])  # (no results yet: nothing to replace)
    said = outcome.replaced(planned, tmp_path)
    old = changed["spec"]["seeds"]
    assert said.startswith(
        f"1 run(s) with results in {tmp_path} will train again and replace them: their "
        f"settings changed since (seeds {old} → {old + 1} (1 run(s)))."
    )
    del planned["parallelism/changed"]
    assert outcome.replaced(planned, tmp_path) == ""


def test_figures_an_earlier_version_dropped_are_said_where_the_tables_omit_them():
    """A version-3 record read now loses a graph step's step figure (dmls/versions.py): the
    section says which runs, what and why, instead of a column that silently goes."""
    from dmls import versions

    metrics = [fake_metrics(f"b{b}", study="batch_size", batch_size=b, spread=(1.0, 1.0))
               for b in (16, 32)]  # fmt: skip
    metrics[1]["earlier_version"] = {
        "metrics_version": 3, "dropped": ["step_gpu_mem_bytes"], "why": versions.V3_STEP_WHY
    }  # fmt: skip
    study = alike("batch_size", {}, metrics)
    assert observations.earlier_versions(study) == [
        f"Not shown for b32: step_gpu_mem_bytes, {versions.V3_STEP_WHY}; a run trained again "
        "with this pipeline records them."
    ]


def test_what_shared_the_host_is_said_from_what_was_measured():
    """On a CPU host shared with other work, every provenance line said "each job had the host
    to itself" while one seed's epochs of identical work ranged 1.56–18.56 s."""
    m = fake_metrics("r0", epochs=3)
    m["launch"] = {"isolation": "host", "seconds": 100.0, "load_average_before": [3.2, 2.0, 1.0]}
    for seed in m["seeds"]:
        seed["history"][1]["train_time_s"], seed["history"][2]["train_time_s"] = 1.56, 18.56
    p = alike("parallelism", {}, [m]).provenance()
    cores = m["host"]["cpu_count"]
    assert p["load"] == f"load 3.2/{cores} cores; epochs ≤11.90× apart"


def test_overfitting_is_a_rise_beyond_seed_noise_not_a_share_of_the_mean():
    """A rise was once called overfitting when the mean curve ended 1% above its minimum, a
    threshold with no seeds in it. Now each seed's rise from the minimum's epoch to the last
    is compared with 0 over the seeds: rises that disagree in sign are seed noise, however
    large the mean's; one seed tells none."""

    def run(name, seeds):
        m = fake_metrics(name, epochs=3, spread=(1.0,) * len(seeds))
        for seed, (mid, last) in zip(m["seeds"], seeds, strict=True):
            for row, loss in zip(seed["history"], (2.0, mid, last), strict=True):
                row["test_loss"], row["train_loss"] = loss, 3.0 / row["epoch"]
        return m | record.combine(m)

    study = alike("parallelism", {}, [
        run("rises", [(1.0, 1.10), (1.0, 1.12), (1.0, 1.11)]),
        run("noise", [(1.0, 1.30), (1.0, 0.98), (1.0, 0.99)]),
        run("one", [(1.0, 1.5)]),
    ])  # fmt: skip
    flags = {r[0]: r[5] for r in overfitting.generalization(study)["rows"]}
    assert flags == {"rises": "yes", "noise": "no", "one": "no"}


def test_a_special_study_says_what_else_of_the_dag_ran_while_it_did():
    """Before: a special study's line never said it ran beside other jobs. From the stamps."""
    import pandas as pd

    from dmls.report import timeline

    t = pd.Timestamp("2026-12-06 10:00:00")
    rows = [
        {"job": "study profiler", "status": "ok", "start": t, "end": t + pd.Timedelta(seconds=100)},
        {"job": "a/x", "status": "ok", "start": t - pd.Timedelta(seconds=10),
         "end": t + pd.Timedelta(seconds=20)},
        {"job": "a/y", "status": "ok", "start": t + pd.Timedelta(seconds=10),
         "end": t + pd.Timedelta(seconds=30)},
        {"job": "a/z", "status": "skipped", "start": t, "end": t + pd.Timedelta(seconds=100)},
        {"job": "study graphs", "status": "ok", "start": t + pd.Timedelta(seconds=200),
         "end": t + pd.Timedelta(seconds=300)},
    ]  # fmt: skip
    assert timeline.beside("study profiler", rows) == (
        "beside 2 other jobs of this DAG for 30% of its time"
    )
    assert timeline.beside("study graphs", rows) == "no other job of this DAG ran meanwhile"
    assert timeline.beside("study none", rows) is None
