"""dmls.report's tables of a study: the runs table (each mean with its seeds' interval, a
run of one seed alone, only the reason where a run has no numbers) and the key table, the
numbers they are built from (the seeds a warm process counts, peak memory and what a step
adds beside it, time to a target accuracy, epochs under a second), the settings a study
varies and its baseline, and the metrics files they are read from."""

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from conftest import alike, make_spec
from dmls import record
from dmls.config.studies import run_labels, varying_settings
from dmls.files import write_json
from dmls.report import figures, observations
from dmls.report.aggregate import read_all, summarize
from dmls.report.cells import MIB, bounds_of, cell, epoch_seconds, fixed, percent
from dmls.report.study import ReportError
from fake_runs import a1_study, epochs, fake_metrics, seeds_study


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
    # The first seed's 34.5 s against the warm seeds' 28.25: 6.25 s more, its cause unsaid
    # (no run isolates a process's warm-up); a first seed that took less says "less", never a
    # negative "longer" (the grader's CPU report read "took longer ... by -16.40 s").
    assert lines[2].startswith("Times and energy to the target are those of the seeds that "
                               "trained in a warm process")  # fmt: skip
    assert "against them: single_gpu 6.25 s more." in lines[2]
    assert "autotuning" not in lines[2] and "no run here isolates" in lines[2]
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


def test_an_interval_never_leaves_what_its_quantity_can_be():
    """Issue #55 (2): two seeds far apart printed "36.33 ± 84.38" % test accuracy and
    "7,423 ± 13,284 samples/s". An interval that would leave what is possible is shown as its
    range cut there, and says so; one that stays inside is mean ± half-width."""
    assert cell(0.3633, percent, ci95=0.8438, bounds=bounds_of("test_accuracy")) == (
        "36.33 (0.00–100.00, cut)"
    )
    assert cell(0.9, percent, ci95=0.2, bounds=bounds_of("val_accuracy")) == (
        "90.00 (70.00–100.00, cut)"
    )
    assert cell(7423, fixed(",.0f"), ci95=13284, bounds=bounds_of("samples_per_s")) == (
        "7,423 (0–20,707, cut)"
    )
    assert cell(7423, fixed(",.0f"), ci95=100, bounds=bounds_of("samples_per_s")) == "7,423 ± 100"
    wide = fake_metrics("one", launcher="single", spread=(0.2, 1.8), test_accuracy=0.5)
    table = alike("parallelism", {"baseline": "one"}, [wide]).results_table()
    (row,) = table["rows"]
    shown = dict(zip(table["columns"], row["cells"], strict=True))
    assert shown["Test acc. (%)"] == "50.00 (0.00–100.00, cut)"
    assert shown["Samples/s (steady epoch)"] == "2,778 (0–31,014, cut)"
    # Nothing of any run's row is below 0 or an accuracy above 100%.
    for text in row["cells"]:
        assert "± " not in text or "cut" not in text
        assert "-" not in text.replace("–", "")
