"""dmls.record: the run record's schema, and the seeds combined in one place."""

import copy
import subprocess
import sys

import pytest

from conftest import ROOT
from dmls import record, versions
from dmls.files import write_json
from fake_runs import fake_metrics

MIB = 2**20


def seed(value: float, time_s: float, epochs: int = 2, early: int | None = None) -> dict:
    history = [
        {"epoch": e + 1, "train_loss": value + e, "train_accuracy": value, "test_loss": value,
         "test_accuracy": value, "train_time_s": time_s, "eval_time_s": 0.1, "lr": 0.01}
        for e in range(epochs)
    ]  # fmt: skip
    return {
        "seed": 0, "status": "ok", "reason": None, "kept": False, "history": history,
        "final": {"train_loss": value, "train_accuracy": value, "test_loss": value,
                  "test_accuracy": value, "best_test_accuracy": value, "epochs_completed": epochs,
                  "stopped_early_epoch": early, "diverged_epoch": None},
        "timing": {"setup_s": 0.5, "train_time_s": time_s * epochs, "eval_time_s": 0.1 * epochs,
                   "checkpoint_time_s": 0.0, "fit_s": (time_s + 0.1) * epochs,
                   "first_epoch_s": time_s, "steady_epoch_s": time_s,
                   "samples_per_s": 100 / time_s},
        "peak_gpu_mem_allocated_bytes": None, "peak_gpu_mem_reserved_bytes": None,
        "effective_precision": "fp32", "fp8_linear_layers": 0, "parameters": 10,
        "step": {"requested": "eager", "mode": "eager", "compiled": False, "eager_reason": None},
        "data": {"name": "tabular", "synthetic": True},
    }  # fmt: skip


def job(seeds: list[dict]) -> dict:
    """A job's result (record.new_job) of `seeds`."""
    timing = dict(setup_s=1.0, process_group_s=0.1, fit_s=2.0, teardown_s=0.1, wall_time_s=3.1)
    energy = dict(measured=False, reason="CPU", counts="", update_period_s=None)
    return {"seeds": seeds, "timing": timing, "world_size": 1, "ranks": [], "energy": energy}


def test_combine_gives_means_intervals_and_the_mean_curve_over_the_seeds_that_trained_it():
    result = record.combine(job([seed(0.5, 1.0), seed(0.7, 3.0, epochs=3, early=3)]))
    summary = result["summary"]
    accuracy = summary["test_accuracy"]
    assert accuracy["mean"] == pytest.approx(0.6) and accuracy["n"] == 2
    # Student t with 1 degree of freedom: t(0.975, 1) = 12.7062; s = 0.1414, s/√2 = 0.1.
    assert accuracy["ci95"] == pytest.approx(12.7062 * 0.1, rel=1e-4)
    # A CPU run: no GPU memory.
    assert record.value(result, "peak_gpu_mem_allocated_bytes") == (None, None)
    assert result["final"]["test_accuracy"] == pytest.approx(0.6)
    assert result["final"]["stopped_early_epochs"] == [None, 3]
    # Epoch 3 only the second seed trained: its mean is that seed's, without an interval.
    third = result["history"][2]
    assert third["n_seeds"] == 1 and third["train_loss"] == pytest.approx(2.7)
    assert third["train_loss_ci95"] is None
    assert result["history"][0]["n_seeds"] == 2
    assert result["history"][0]["train_loss"] == pytest.approx(0.6)


def test_one_seed_has_its_values_and_no_interval():
    result = record.combine(job([seed(0.5, 2.0)]))
    assert result["summary"]["test_accuracy"] == {
        "mean": 0.5, "n": 1, "std": None, "ci95_low": None, "ci95_high": None, "ci95": None,
    }  # fmt: skip
    assert result["history"][1]["train_loss"] == 1.5


def gpu_seed(k: int, peak_mib: float, per_gpu_mib: list[float], kept: bool = False) -> dict:
    out = seed(0.5, 1.0) | {"seed": k, "kept": kept}
    out["peak_gpu_mem_allocated_bytes"] = int(peak_mib * MIB)
    out["peak_gpu_mem_reserved_bytes"] = int(2 * peak_mib * MIB)
    out["peak_gpu_mem_allocated_per_gpu_bytes"] = [int(m * MIB) for m in per_gpu_mib]
    return out


def test_the_runs_peak_and_each_gpus_peak_are_counted_over_the_same_seeds():
    """One rule for a run's memory, the largest GPU's and each GPU's: the mean over the seeds of
    a warm process (the example's table once gave the warm seeds' mean beside one seed's)."""
    seeds = [gpu_seed(0, 250.2, [250.2, 250.0]), gpu_seed(1, 205.7, [205.7, 205.1]),
             gpu_seed(2, 206.0, [206.0, 205.9])]  # fmt: skip
    result = record.combine(job(seeds))
    assert "memory" not in result  # no second, one-seed definition in the record
    peak, _ = record.value(result, "peak_gpu_mem_allocated_bytes")
    assert peak == pytest.approx((int(205.7 * MIB) + int(206.0 * MIB)) / 2)
    assert record.per_gpu_peaks(result) == pytest.approx(
        [(int(205.7 * MIB) + int(206.0 * MIB)) / 2, (int(205.1 * MIB) + int(205.9 * MIB)) / 2]
    )
    # The first seed paid cuDNN's autotuning: its excess over the warm seeds' mean.
    warm = (int(205.7 * MIB) + int(206.0 * MIB)) / 2
    excess = record.first_seed_excess(seeds, "peak_gpu_mem_allocated_bytes")
    assert excess == pytest.approx(int(250.2 * MIB) - warm)


def test_a_kept_seed_is_not_the_first_seed_of_this_process():
    seeds = [gpu_seed(0, 300, [300], kept=True), gpu_seed(1, 280, [280]), gpu_seed(2, 250, [250])]
    # Seeds 0 (kept: the first of an earlier process) and 1 (the first of this one) started a
    # process; seed 2 is warm. One definition, the record's and the report's.
    metric = "peak_gpu_mem_allocated_bytes"
    assert record.first_seed_excess(seeds, metric) == int(290 * MIB) - int(250 * MIB)
    from dmls.report.run_numbers import RunNumbers

    assert RunNumbers({"seeds": seeds}).first_seed_excess(metric) == int(290 * MIB) - int(250 * MIB)
    assert record.warm_seeds({"seeds": seeds}) == [2]
    assert record.timed_seeds({"seeds": seeds[:2]}) == [0, 1]  # no warm seed: every seed


def test_value_gives_the_mean_with_its_interval_over_the_seeds_it_counts():
    """Accuracy over every finished seed; GPU memory over the seeds of a warm process (the
    first seed of a process also holds cuDNN's autotuning workspace): seeds 1 and 2."""
    metrics = fake_metrics("a", spread=(0.9, 1.0, 1.1))
    mean, half = record.value(metrics, "test_accuracy")
    assert mean == pytest.approx(metrics["summary"]["test_accuracy"]["mean"]) and half > 0
    assert record.counted_seeds(metrics, "peak_gpu_mem_allocated_bytes") == [1, 2]
    peak, half = record.value(metrics, "peak_gpu_mem_allocated_bytes")
    assert peak == pytest.approx(315 * MIB) and half > 0


def test_a_valid_record_is_written_and_read_back(tmp_path):
    metrics = fake_metrics("a", spread=(0.9, 1.0))
    record.write(tmp_path / "metrics.json", metrics)
    assert record.read(tmp_path / "metrics.json")["run"] == "a"
    skipped = fake_metrics("b", "skipped")
    record.write(tmp_path / "skipped.json", skipped)
    assert record.read(tmp_path / "skipped.json")["reason"].startswith("b could not run")


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda m: m.pop("seeds"), "(top): 'seeds' is a required property"),
        (lambda m: m.update(status="weird"), "status: 'weird' is not one of"),
        (lambda m: m["seeds"][0]["final"].update(test_accuracy="99%"),
         "seeds/0/final/test_accuracy: '99%' is not of type 'number', 'null'"),
        (lambda m: m["seeds"][0]["history"].__setitem__(0, "epoch 1"),
         "seeds/0/history/0: 'epoch 1' is not of type 'object'"),
        (lambda m: m["seeds"][0]["history"][0].update(test_accuracy=1.5),
         "seeds/0/history/0/test_accuracy: 1.5 is greater than the maximum of 1"),
        (lambda m: m.update(metrics_version=2), "metrics version 2, this pipeline reads 4"),
        # The schema is closed, at the top and in a seed: a key it doesn't declare is an error.
        (lambda m: m.update(note="hi"),
         "(top): Additional properties are not allowed ('note' was unexpected)"),
        (lambda m: m["seeds"][0].update(peak_mib=3),
         "seeds/0: Additional properties are not allowed ('peak_mib' was unexpected)"),
        # Impossible values of the right type.
        (lambda m: m["summary"]["test_accuracy"].update(mean=1.7),
         "summary/test_accuracy/mean: 1.7 is greater than the maximum of 1"),
        (lambda m: m["summary"].update(n_finished=5), "summary/n_finished: 5 of 2 seeds"),
        (lambda m: m["seeds"].append(copy.deepcopy(m["seeds"][0])),
         "seeds: 3 seeds, but the spec asks for 2"),
        (lambda m: m["launch"].update(isolation="shared"),
         "launch/isolation: 'shared' is not one of"),
        # The example's A6 at batch 128 under version 3: 48.1 + 157.9 MiB against 185.5 MiB.
        (lambda m: m["seeds"][1].update(peak_gpu_mem_allocated_bytes=194_510_848,
                                        gpu_mem_before_step_bytes=50_396_160,
                                        step_gpu_mem_bytes=165_543_936),
         "seeds/1/step_gpu_mem_bytes: 165543936 added to the 50396160 held before the step "
         "exceed the allocated peak, 194510848"),
    ],
)  # fmt: skip
def test_a_parseable_but_damaged_record_is_named_with_what_is_wrong(tmp_path, damage, named):
    metrics = copy.deepcopy(fake_metrics("a", spread=(0.9, 1.0)))
    damage(metrics)
    path = tmp_path / "metrics.json"
    write_json(path, metrics)
    with pytest.raises(record.RecordError) as err:
        record.read(path)
    assert str(err.value).startswith(f"{path}: ")
    assert named in str(err.value)
    assert str(err.value).endswith(f"rebuild that run: snakemake --forcerun {path}")


def test_a_writer_that_breaks_the_schema_fails_before_the_file_is_written(tmp_path):
    metrics = fake_metrics("a")
    metrics["status"] = "finished"
    with pytest.raises(record.RecordError, match="breaks its schema: status: 'finished'"):
        record.write(tmp_path / "metrics.json", metrics)
    assert not (tmp_path / "metrics.json").exists()


def test_the_record_module_imports_neither_torch_nor_pandas():
    code = (
        "import sys; sys.path.insert(0, 'workflow/scripts'); import dmls.record; "
        "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_steps_memory_is_counted_over_the_runs_warm_seeds():
    seeds = [gpu_seed(0, 250.0, [250.0]), gpu_seed(1, 205.0, [205.0]), gpu_seed(2, 206.0, [206.0])]
    for s, step in zip(seeds, (100, 55, 56), strict=True):
        s |= {"gpu_mem_before_step_bytes": 150 * MIB, "step_gpu_mem_bytes": step * MIB}
    result = record.combine(job(seeds))
    assert record.value(result, "gpu_mem_before_step_bytes")[0] == 150 * MIB
    assert record.value(result, "step_gpu_mem_bytes")[0] == pytest.approx(55.5 * MIB)


def test_before_the_step_and_what_it_adds_come_from_one_gpu():
    """Two GPUs: the first held more before the step, the second's steps added more. Taking
    each largest apart (as version 3 did) could add up to more than any GPU's peak."""
    outcome = {"status": "ok", "reason": None, "history": seed(0.5, 1.0)["history"],
               "stopped_early_epoch": None, "diverged_epoch": None,
               "resumed_from_epoch": None, "checkpoint_time_s": 0.0}  # fmt: skip
    made = record.new_seed(
        0, outcome, n_train=100, setup_s=0.1, fit_s=1.0,
        peaks=[(200 * MIB, 300 * MIB), (190 * MIB, 300 * MIB)],
        step_memory=[(150 * MIB, 40 * MIB, 0), (100 * MIB, 90 * MIB, 7 * MIB)],
        energy=None, effective_precisions=["fp32"], fp8_linear_layers=0, parameters=10,
        step={"mode": "cuda_graph"}, data={},
    )  # fmt: skip
    assert made["gpu_mem_before_step_bytes"] == 100 * MIB
    assert made["step_gpu_mem_bytes"] == 90 * MIB
    assert made["graph_pool_reserved_bytes"] == 7 * MIB


def test_a_version_3_record_is_read_with_its_graph_steps_figures_dropped(tmp_path):
    """Version 3 added CUDA graphs' pools into what a step adds: read now, a graph-replayed
    seed's step figure is dropped and said so; an eager seed's (allocated only) is kept."""
    metrics = copy.deepcopy(fake_metrics("a", spread=(0.9, 1.0)))
    metrics["metrics_version"] = 3
    metrics["memory"] = {"seed": 1}
    for k, s in enumerate(metrics["seeds"]):
        s.pop("graph_pool_reserved_bytes", None)
        s |= {"gpu_mem_before_step_bytes": 48 * MIB, "step_gpu_mem_bytes": 158 * MIB}
        s["step"] = {"mode": "eager" if k == 0 else "cuda_graph", "compiled": False,
                     "eager_reason": None}  # fmt: skip
    write_json(tmp_path / "metrics.json", metrics)
    read = record.read(tmp_path / "metrics.json")
    assert read["metrics_version"] == record.VERSION == versions.TO_VERSION
    assert "memory" not in read
    assert [s["step_gpu_mem_bytes"] for s in read["seeds"]] == [158 * MIB, None]
    assert [s["graph_pool_reserved_bytes"] for s in read["seeds"]] == [None, None]
    assert read["earlier_version"] == {
        "metrics_version": 3,
        "dropped": ["gpu_mem_before_step_bytes", "step_gpu_mem_bytes"],
        "why": versions.V3_STEP_WHY,
    }


def test_a_diverged_seed_never_enters_a_mean():
    """With a NaN drill on seed 1, runs.csv gave test accuracy 0.380 ± 0.710: the diverged
    seed's 0.051 was in the mean."""
    diverged = seed(0.051, 1.0) | {"seed": 1, "status": "diverged", "reason": "non-finite loss"}
    combined = record.combine(job([seed(0.71, 1.0), diverged]))
    assert combined["summary"]["n_finished"] == 1
    assert combined["summary"]["test_accuracy"]["mean"] == pytest.approx(0.71)
    assert combined["summary"]["test_accuracy"]["ci95"] is None  # one seed: no interval
    assert combined["final"]["test_accuracy"] == pytest.approx(0.71)
    assert [row["n_seeds"] for row in combined["history"]] == [1, 1]
    everything_diverged = record.combine(job([diverged]))
    assert everything_diverged["summary"]["test_accuracy"] is None
    assert everything_diverged["history"] == []


def test_the_validation_curve_is_averaged_over_the_seeds_like_the_test_curve():
    seeds = [seed(0.5, 1.0), seed(0.7, 1.0) | {"seed": 1}]
    for s, value in zip(seeds, (0.4, 0.6), strict=True):
        for row in s["history"]:
            row |= {"val_loss": value + 1, "val_accuracy": value}
    first = record.combine(job(seeds))["history"][0]
    assert first["val_loss"] == pytest.approx(1.5) and first["val_accuracy"] == pytest.approx(0.5)
    # As for the test loss: t(0.975, 1) × s/√2 = 12.7062 × 0.1.
    for key in ("val_loss_ci95", "val_accuracy_ci95", "test_loss_ci95"):
        assert first[key] == pytest.approx(12.7062 * 0.1, rel=1e-4), key
    # Without a validation split the columns are there, empty.
    plain = record.combine(job([seed(0.5, 1.0)]))["history"][0]
    assert (plain["val_loss"], plain["val_accuracy"], plain["val_loss_ci95"]) == (None,) * 3


def test_a_record_with_a_validation_split_is_valid_and_its_fields_are_checked():
    metrics = copy.deepcopy(fake_metrics("a", spread=(0.9, 1.0)))
    for s in metrics["seeds"]:
        for row in s["history"]:
            row |= {"val_loss": 1.2, "val_accuracy": 0.4}
    metrics["data"]["n_validation"] = 5000
    metrics |= record.combine(metrics)
    assert record.problems(metrics) == []
    metrics["seeds"][0]["history"][0]["val_accuracy"] = 1.5
    metrics["data"]["n_validation"] = -1
    assert record.problems(metrics) == [
        "data/n_validation: -1 is less than the minimum of 0",
        "seeds/0/history/0/val_accuracy: 1.5 is greater than the maximum of 1",
    ]


def test_every_record_the_example_report_reads_keeps_the_step_under_the_peak():
    """The memory invariant (record.bounds) in every seed of every record the example's page
    was rendered from, read as the report reads them (version 3 upgraded): before the step plus
    what it adds is at most the allocated peak, wherever all three were recorded."""
    paths = sorted(ROOT.glob("docs/example-report/results/*/runs/*/*/metrics.json"))
    assert len(paths) >= 50
    checked = 0
    for path in paths:
        metrics = record.read(path)  # raises, naming the seed, where the invariant breaks
        for s in metrics.get("seeds") or []:
            mem = [s.get(k) for k in ("gpu_mem_before_step_bytes", "step_gpu_mem_bytes",
                                      "peak_gpu_mem_allocated_bytes")]  # fmt: skip
            if None not in mem:
                assert mem[0] + mem[1] <= mem[2], (path, s["seed"])
                checked += 1
    assert checked >= 30  # the eager runs' seeds (a graph step's version-3 figure is dropped)
