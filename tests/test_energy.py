"""GPU energy per run (training/energy.py): NVML's counters read around each epoch, summed over
the ranks, combined over the seeds, shown in the study tables and figures; none on a CPU."""

import sys
import types

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from conftest import alike, make_spec
from dmls import record
from dmls.report import figures, observations
from dmls.report.aggregate import summarize
from dmls.report.study import Study
from dmls.training import energy, results
from fake_runs import epochs, fake_metrics


class FakeNVML(types.ModuleType):
    """pynvml with one counter per UUID, in millijoules, that moves only when told."""

    class NVMLError(Exception):
        pass

    def __init__(self, counters: dict[str, int], unsupported: set[str] = frozenset()):
        super().__init__("pynvml")
        self.counters, self.unsupported, self.initialised = counters, unsupported, False

    def nvmlInit(self):
        self.initialised = True

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.counters:
            raise self.NVMLError(f"no GPU {uuid}")
        return uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle in self.unsupported:
            raise self.NVMLError("Not Supported")
        return self.counters[handle]


@pytest.fixture
def two_gpus(monkeypatch):
    """CUDA devices 0 and 1 are NVML's GPU-a and GPU-b (torch spells UUIDs without 'GPU-')."""
    import torch

    uuids = {0: "a", 1: "b"}
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=uuids[i])
    )


def test_a_meter_sums_its_gpus_counters_in_joules(monkeypatch, two_gpus):
    nvml = FakeNVML({"GPU-a": 5_000, "GPU-b": 7_500})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    meter, reason = energy.EnergyMeter.open([0, 1])
    assert reason is None and nvml.initialised
    before = meter.joules()
    assert before == pytest.approx(12.5)
    nvml.counters["GPU-a"] += 250_000  # 250 J on one GPU, 1 J on the other
    nvml.counters["GPU-b"] += 1_000
    assert meter.joules() - before == pytest.approx(251.0)


def test_without_nvml_or_its_counter_the_reason_is_kept_and_nothing_is_measured(
    monkeypatch, two_gpus
):
    assert energy.EnergyMeter.open([]) == (None, "a CPU run: NVML counts GPU energy only")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert energy.EnergyMeter.open([0]) == (None, "nvidia-ml-py (pynvml) is not installed")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML({"GPU-a": 0}, unsupported={"GPU-a"}))
    meter, reason = energy.EnergyMeter.open([0])
    assert meter is None and reason == "NVML has no energy counter here: Not Supported"


def test_a_run_measures_only_when_every_rank_does():
    meter = object()
    assert energy.agree(meter, [None, None]) == (meter, None)
    assert energy.agree(None, ["a CPU run", "a CPU run"]) == (None, "a CPU run")
    assert energy.agree(meter, [None, "old GPU"]) == (
        None, "not every rank's GPUs report energy: old GPU"
    )  # fmt: skip


def test_a_seeds_energy_is_its_epochs_sum_and_its_steady_epoch_the_mean_after_the_first():
    history = [
        {"train_energy_j": 50.0, "eval_energy_j": 2.0, "train_time_s": 6.0},
        {"train_energy_j": 30.0, "eval_energy_j": 1.0, "train_time_s": 2.0},
        {"train_energy_j": 34.0, "eval_energy_j": 1.0, "train_time_s": 2.0},
        {"train_energy_j": 32.0, "eval_energy_j": 1.0, "train_time_s": 2.0},
    ]
    assert results.energy_summary(history, update_period_s=0.1) == {
        "train_energy_j": 146.0, "eval_energy_j": 5.0, "steady_epoch_energy_j": 32.0,
        "steady_epoch_energy_reason": None,
    }  # fmt: skip
    # One epoch: no steady one.
    assert results.energy_summary(history[:1])["steady_epoch_energy_j"] is None
    # An epoch without its joules (resumed on a host without the counter): no number at all.
    assert results.energy_summary([*history, {}]) is None
    assert results.energy_summary([]) is None


class Clock:
    """A perf_counter that moves 1 ms each time it is read: the meter's timing, without the
    host's load in it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def test_the_meter_measures_how_often_the_counter_moves(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(energy.time, "perf_counter", clock)
    # A counter that NVML updates every 20 ms (an H100's: every 100 ms).
    period = energy.update_period(lambda: int(clock.now / 0.02))
    assert period == pytest.approx(0.02, abs=0.0015)
    assert energy.update_period(lambda: 7, timeout_s=0.05) is None  # it never moved


def test_the_meter_measures_the_period_of_its_first_gpu_when_first_asked(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(energy.time, "perf_counter", clock)
    reads = []

    class FakeNVML:
        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(handle):
            reads.append(handle)
            return int(clock.now / 0.02)  # mJ, updated every 20 ms

    meter = energy.EnergyMeter(FakeNVML(), ["gpu0", "gpu1"])
    assert reads == []  # nothing measured until asked
    assert meter.update_period_s == pytest.approx(0.02, abs=0.0015)
    assert set(reads) == {"gpu0"}
    measured = len(reads)
    assert meter.update_period_s == pytest.approx(0.02, abs=0.005)
    assert len(reads) == measured  # once: a second ask reads nothing


def test_steady_epochs_too_short_for_the_counter_have_no_joules_and_say_why():
    history = [{"train_energy_j": j, "eval_energy_j": 1.0, "train_time_s": t}
               for j, t in ((50.0, 6.6), (30.0, 0.2), (34.0, 0.2))]  # fmt: skip
    short = results.energy_summary(history, update_period_s=0.1)
    assert short["steady_epoch_energy_j"] is None and short["train_energy_j"] == 114.0
    assert short["steady_epoch_energy_reason"] == (
        "epochs 2–3 trained for 0.40 s in all, fewer than 10 of the energy counter's updates "
        "(every 100 ms)"
    )
    # Together they span ten updates: their mean; an unknown period can't be judged.
    for row in history[1:]:
        row["train_time_s"] = 0.5
    assert results.energy_summary(history, update_period_s=0.1)["steady_epoch_energy_j"] == 32.0
    assert energy.resolution_reason(0.4, 3, None) is None


class StepMeter:
    """A counter that advances 10 J every time it is read, and whose update period is
    `period_s` (a nanosecond: any epoch spans enough of them)."""

    def __init__(self, period_s: float = 1e-9):
        self.total, self.period_s, self.period_asked = 0.0, period_s, 0

    def joules(self) -> float:
        self.total += 10.0
        return self.total

    @property
    def update_period_s(self) -> float:
        self.period_asked += 1
        return self.period_s


def test_the_engine_records_each_epochs_joules_and_the_seeds_totals(
    tmp_path, tabular_dir, monkeypatch
):
    from dmls.training import job as trainer

    spec = make_spec(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu",
                     epochs=3, batch_size=64, num_workers=0, seeds=2)  # fmt: skip
    meter = StepMeter()
    monkeypatch.setattr(energy.EnergyMeter, "open", classmethod(lambda c, g: (meter, None)))
    job = trainer.train(spec, tabular_dir, tmp_path, tmp_path / "job.pt")
    assert job["energy"]["measured"] and job["energy"]["reason"] is None
    # Asked for by the rank that writes the results, which records it.
    assert meter.period_asked > 0 and job["energy"]["update_period_s"] == 1e-9
    for seed in job["seeds"]:
        # Read before training, after it and after evaluation: 10 J apart each.
        assert [(h["train_energy_j"], h["eval_energy_j"]) for h in seed["history"]] == [
            (10.0, 10.0)
        ] * 3
        assert seed["energy"] == {
            "train_energy_j": 30.0, "eval_energy_j": 30.0, "steady_epoch_energy_j": 10.0,
            "steady_epoch_energy_reason": None,
        }  # fmt: skip
    combined = record.combine(job)
    assert combined["summary"]["train_energy_j"]["mean"] == 30.0
    assert combined["history"][0]["train_energy_j"] == 10.0


def test_the_engine_gives_no_steady_joules_for_epochs_too_short_for_the_period_and_says_why(
    tmp_path, tabular_dir, monkeypatch
):
    from dmls.training import job as trainer

    spec = make_spec(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu",
                     epochs=3, batch_size=64, num_workers=0)  # fmt: skip
    meter = StepMeter(period_s=10.0)  # ten updates: 100 s, longer than these epochs
    monkeypatch.setattr(energy.EnergyMeter, "open", classmethod(lambda c, g: (meter, None)))
    (seed,) = trainer.train(spec, tabular_dir, tmp_path, tmp_path / "job.pt")["seeds"]
    assert seed["energy"]["steady_epoch_energy_j"] is None
    reason = seed["energy"]["steady_epoch_energy_reason"]
    assert reason.startswith("epochs 2–3 trained for ")
    assert reason.endswith("fewer than 10 of the energy counter's updates (every 10000 ms)")


def test_a_cpu_run_records_why_it_has_no_energy(tmp_path, tabular_dir):
    from dmls.training import job as trainer

    spec = make_spec(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu",
                     epochs=2, batch_size=64, num_workers=0)  # fmt: skip
    job = trainer.train(spec, tabular_dir, tmp_path, tmp_path / "job.pt")
    assert job["energy"] == {
        "measured": False, "reason": "a CPU run: NVML counts GPU energy only",
        "counts": energy.COUNTS, "update_period_s": None,
    }  # fmt: skip
    assert job["seeds"][0]["energy"] is None
    assert not any("train_energy_j" in h for h in job["seeds"][0]["history"])


def with_energy(metrics: dict, train_w: float, eval_w: float, period_s: float | None = None):
    """A fake run whose GPUs drew `train_w` watts in training and `eval_w` in evaluation, read
    from a counter updated every `period_s`."""
    for seed in metrics["seeds"]:
        for h in seed["history"]:
            h |= {"train_energy_j": train_w * h["train_time_s"],
                  "eval_energy_j": eval_w * h["eval_time_s"]}  # fmt: skip
        seed["energy"] = results.energy_summary(seed["history"], period_s)
    metrics["energy"] = {"measured": True, "reason": None, "counts": energy.COUNTS,
                         "update_period_s": period_s}  # fmt: skip
    return metrics | record.combine(metrics)


def energy_study(target: float | None = 0.5, period_s: float | None = None) -> Study:
    """single_gpu: epochs of 15/10/10 s × 0.9, 1, 1.1 at 100 W (50 W in 1 s evaluations);
    ddp_2gpu: half as long at 300 W, so 1.5× the energy per epoch."""
    metrics = [
        with_energy(fake_metrics("single_gpu", launcher="single", epochs=3,
                                 history=epochs([15, 10, 10]), spread=(0.9, 1.0, 1.1)), 100, 50,
                    period_s),
        with_energy(fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, epochs=3,
                                 history=epochs([7.5, 5, 5]), spread=(0.9, 1.0, 1.1),
                                 samples_per_s=1900.0), 300, 50, period_s),
    ]  # fmt: skip
    settings = {} if target is None else {"target_accuracy": target}
    return alike("parallelism", settings, metrics)


def test_the_study_shows_energy_per_epoch_and_to_the_target_with_intervals(tmp_path):
    study = energy_study()
    single = study.runs.loc["single_gpu"]
    assert single["steady_epoch_energy_j"] == pytest.approx(1000.0)  # 100 W × 10 s × factor
    half_width = scipy.stats.t.ppf(0.975, 2) * np.std([900, 1000, 1100], ddof=1) / np.sqrt(3)
    assert single["steady_epoch_energy_j_ci95"] == pytest.approx(half_width)
    assert single["train_power_w"] == pytest.approx(100.0)
    # 50% test accuracy at epochs 3, 2, 2 (fake_runs' time-to-target seeds): the epochs'
    # training and evaluation joules up to there, in the seeds of a warm process (1 and 2).
    to_target = [100 * 25 + 50 * 2, 100 * 27.5 + 50 * 2]
    assert single["energy_to_target_j"] == pytest.approx(np.mean(to_target))
    headers = study.results_table()["columns"]
    assert {"Steady epoch energy, GPUs (J)", "GPU energy to 50% (J)"} <= set(headers)
    assert "steady_epoch_energy_j_ci95" in study.results_frame().columns
    lines = observations.energy_use(study)
    assert lines[0] == "single_gpu draws 1,000 J per steady epoch on its GPUs, 100 W on " \
                       "average in training."  # fmt: skip
    assert lines[1].startswith("ddp_2gpu draws 1,500 J per steady epoch on its GPUs, 300 W")
    assert "1.50× (95% interval" in lines[1]
    assert "energy" in [name for name, _ in figures.study_figures(study, None, tmp_path)]
    assert (tmp_path / "energy.png").exists()
    row = summarize(study.metrics["ddp_2gpu"])
    assert row["train_energy_j"] == pytest.approx(300 * 17.5) and row["energy_reason"] is None


def test_steady_epochs_too_short_for_the_counter_compare_the_training_s_joules_and_say_why(
    tmp_path,
):
    # ddp_2gpu's later epochs, 2 × 5 s (× 0.9 in one seed), span under 10 updates of a 1 s
    # counter in that seed: the run has no steady-epoch energy (a mean over the other seeds
    # would favour the slow ones).
    study = energy_study(period_s=1.0)
    assert study.energy_column == (
        "train_energy_warm_j",
        "over the training (seeds of a warm process)",
    )
    # 35 s × 100 W × (1.0, 1.1): seeds 1 and 2, Student t over the two.
    assert study.runs.at["single_gpu", "train_energy_warm_j"] == pytest.approx(3675.0)
    half = scipy.stats.t.ppf(0.975, 1) * np.std([3500, 3850], ddof=1) / np.sqrt(2)
    assert study.runs.at["single_gpu", "train_energy_warm_j_ci95"] == pytest.approx(half)
    assert pd.isna(study.runs.loc["ddp_2gpu", "steady_epoch_energy_j"])
    lines = observations.energy_use(study)
    assert lines[0].startswith("No steady-epoch energy for ddp_2gpu: epochs 2–3 trained for 9.00 s")
    # Over the training, the seeds of a warm process: 35 s × 100 W × (1.0, 1.1) (its first
    # seed, × 0.9, is the one that paid the process's warm-up in a real run).
    assert lines[1].startswith(
        "single_gpu draws 3,675 J over the training (seeds of a warm process) on its GPUs"
    )
    assert "energy" in [name for name, _ in figures.study_figures(study, None, tmp_path)]


def test_runs_without_energy_show_the_reason_and_no_energy_column(tmp_path):
    metrics = [fake_metrics(run, launcher="single", epochs=2, gpu_mib=None) for run in ("a", "b")]
    for m in metrics:
        m["energy"] = {"measured": False, "reason": "a CPU run: NVML counts GPU energy only"}
    study = alike("parallelism", {}, metrics)
    assert not study.energy_measured
    assert not any("energy" in header for header in study.results_table()["columns"])
    assert observations.energy_use(study) == [
        "No GPU energy for a, b: a CPU run: NVML counts GPU energy only."
    ]
    assert "energy" not in [name for name, _ in figures.study_figures(study, None, tmp_path)]
    assert pd.isna(study.runs.at["a", "train_energy_j"])
