"""C: the benchmark of conv implementations, as far as a CPU host can run it."""

import csv
import math
import statistics

import pytest
import torch

from dmls.data import datasets
from dmls.special.fused_conv import measure as fused_conv

CFG = {"dataset": "synthetic_cifar", "depths": [2, 10], "channels": 4, "fc_hidden": 8,
       "modes": ["cudnn", "fused", "no_cudnn", "cpu"], "epochs": 1, "batch_size": 16,
       "lr": 0.001, "warmup_steps": 1, "timed_steps": 3, "train_samples": 64,
       "test_samples": 32, "tf32": False, "seed": 0, "repeats": 2, "accuracy_seeds": 2,
       "accuracy_modes": ["cudnn", "fused", "cpu"]}  # fmt: skip


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    datasets.prepare("synthetic_cifar", {"n_train": 64, "n_test": 32, "seed": 0}, out)
    return out


def test_networks_have_distinct_layers_of_the_asked_depth():
    for depth in (2, 10):
        net = fused_conv.build_cnn(depth, CFG, (1, 28, 28), 10)
        convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
        assert len(convs) == depth and len({id(c.weight) for c in convs}) == depth


def test_cpu_row_trains_and_is_timed_gpu_rows_say_why_not(tmp_path, image_dir):
    """Speed: warm-up plus timed steps per repeat, times per step; accuracy: one full training
    per seed, whose mean and interval are the row's."""
    result = fused_conv.run(CFG, tmp_path, data_dir=image_dir, threads=1)
    rows = {(r["depth"], r["mode"]): r for r in result["rows"]}
    assert len(rows) == 8
    for depth in (2, 10):
        cpu = rows[(depth, "cpu")]
        assert cpu["status"] == "ok"
        assert cpu["timed_steps"] == 3 and cpu["repeats"] == 2
        assert cpu["forward_ms"] > 0 and cpu["backward_ms"] > 0 and cpu["forward_ms_ci95"] >= 0
        assert cpu["steps"] == 4 and cpu["epochs"] == 1  # the accuracy's: 64 images / 16
        assert cpu["accuracy_seeds"] == 2 and 0 <= cpu["test_accuracy"] <= 1
        accuracy = result["verdicts"]["by_depth"][str(depth)]["test_accuracy_percent"]
        assert accuracy["cpu"]["mean"] == pytest.approx(100 * cpu["test_accuracy"])
        assert accuracy["cpu"]["n"] == 2
        if not torch.cuda.is_available():
            for mode in ("cudnn", "fused", "no_cudnn"):
                assert rows[(depth, mode)]["status"] == "skipped"
                assert "needs a CUDA GPU" in rows[(depth, mode)]["reason"]
                assert accuracy[mode] is None
            for part in ("forward", "backward"):
                speedup = result["verdicts"]["by_depth"][str(depth)]["vs_cudnn"]["fused"][part]
                assert "value" not in speedup and "needs a CUDA GPU" in speedup["reason"]
    with open(tmp_path / "results.csv") as f:
        reader = csv.DictReader(f)
        assert len(list(reader)) == 8
    assert {"forward_ms_ci95", "backward_ms_ci95", "accuracy_reason"} <= set(reader.fieldnames)
    with open(tmp_path / "repeats.csv") as f:
        repeats = list(csv.DictReader(f))
    with open(tmp_path / "accuracy.csv") as f:
        trainings = list(csv.DictReader(f))
    for depth in (2, 10):
        mine = [r for r in repeats if (int(r["depth"]), r["mode"]) == (depth, "cpu")]
        assert [int(r["repeat"]) for r in mine] == [0, 1]
        assert {int(r["timed_steps"]) for r in mine} == {3}
        mean = statistics.fmean(float(r["forward_ms"]) for r in mine)
        assert rows[(depth, "cpu")]["forward_ms"] == pytest.approx(mean)
        seeds = [r for r in trainings if (int(r["depth"]), r["mode"]) == (depth, "cpu")]
        assert [int(r["seed"]) for r in seeds] == [0, 1]
        mean = statistics.fmean(float(r["test_accuracy"]) for r in seeds)
        assert rows[(depth, "cpu")]["test_accuracy"] == pytest.approx(mean)
    assert result["data"]["n_train"] == 64 and result["data"]["n_test"] == 32
    assert result["accuracy_seeds"] == 2
    assert (tmp_path / "times.png").stat().st_size > 0


def test_a_mode_outside_accuracy_modes_is_timed_only_and_says_so(tmp_path, image_dir):
    """cuDNN off and the CPU take most of C's time when trained to the end (issue #41): by
    default they are timed only, and their rows say so instead of an accuracy."""
    cfg = CFG | {"depths": [2], "modes": ["cpu"], "accuracy_modes": ["cudnn", "fused"]}
    result = fused_conv.run(cfg, tmp_path, data_dir=image_dir, threads=1)
    (cpu,) = result["rows"]
    assert cpu["status"] == "ok" and cpu["forward_ms"] > 0
    assert cpu.get("test_accuracy") is None and cpu["accuracy_reason"] == fused_conv.TIMED_ONLY
    assert len((tmp_path / "accuracy.csv").read_text().splitlines()) == 1  # the header alone


def test_the_timed_steps_run_past_an_epoch_when_the_data_is_short(tmp_path, image_dir):
    """64 images of batch 16 are 4 steps an epoch; 1 warm-up + 9 timed steps take 3 epochs."""
    cfg = CFG | {"depths": [2], "modes": ["cpu"], "timed_steps": 9, "accuracy_modes": []}
    result = fused_conv.run(cfg, tmp_path, data_dir=image_dir, threads=1)
    with open(tmp_path / "repeats.csv") as f:
        assert {int(r["timed_steps"]) for r in csv.DictReader(f)} == {9}
    assert result["rows"][0]["timed_steps"] == 9


def gmean_ratio(a, b):
    """The ratio of the geometric means of a and b, recomputed here."""
    return math.exp(statistics.fmean(map(math.log, a)) - statistics.fmean(map(math.log, b)))


def test_repeats_take_turns_and_the_verdicts_follow_from_them(tmp_path, image_dir, monkeypatch):
    """The GPU modes as CPU baselines, so that a host without CUDA runs the whole path: modes
    interleaved per repeat, repeats.csv, and the cudnn / fused ratios with their intervals."""
    for name in ("cudnn", "fused"):
        mode = fused_conv.Mode("cpu", fused=False, cudnn=True, title=name)
        monkeypatch.setitem(fused_conv.MODES, name, mode)
    cfg = CFG | {"modes": ["cudnn", "fused", "cpu"], "repeats": 3}
    result = fused_conv.run(cfg, tmp_path, data_dir=image_dir, threads=1)
    assert result["repeats"] == 3
    assert all(r["status"] == "ok" and r["repeats"] == 3 for r in result["rows"])
    with open(tmp_path / "repeats.csv") as f:
        repeats = list(csv.DictReader(f))
    assert len(repeats) == 2 * 3 * 3  # depths × modes × repeats

    def values(depth, mode, key):
        return [float(r[key]) for r in repeats if (int(r["depth"]), r["mode"]) == (depth, mode)]

    with open(tmp_path / "accuracy.csv") as f:
        trainings = list(csv.DictReader(f))

    def seeds(depth, mode):
        return [float(r["test_accuracy"]) for r in trainings
                if (int(r["depth"]), r["mode"]) == (depth, mode)]  # fmt: skip

    verdicts = result["verdicts"]
    assert "> 1 means the mode is faster than cuDNN" in verdicts["convention"]
    for depth in (2, 10):
        mine = [r for r in repeats if int(r["depth"]) == depth]
        for repeat in range(3):  # each repeat runs every mode once, the first turn rotating
            turns = sorted((int(r["order"]), r["mode"]) for r in mine if int(r["repeat"]) == repeat)
            assert [m for _, m in turns] == (cfg["modes"] * 2)[repeat : repeat + 3]
        block = verdicts["by_depth"][str(depth)]
        for part in ("forward", "backward"):
            speedup = block["vs_cudnn"]["fused"][part]
            cudnn, fused = (values(depth, m, f"{part}_ms") for m in ("cudnn", "fused"))
            assert len(cudnn) == len(fused) == 3 == speedup["n"]
            # Repeat by repeat (the modes took turns in each): the geometric mean of the
            # per-repeat ratios, which is the ratio of the geometric means.
            assert speedup["value"] == pytest.approx(gmean_ratio(cudnn, fused), rel=1e-9)
            assert speedup["low"] <= speedup["value"] <= speedup["high"]
            assert speedup["within_noise"] == (speedup["low"] <= 1 <= speedup["high"])
            assert set(block["vs_cudnn"]) == set(cfg["modes"]) - {"cudnn"}
        for mode in cfg["modes"]:
            accuracy = block["test_accuracy_percent"][mode]
            per_seed = [100 * a for a in seeds(depth, mode)]
            assert accuracy["mean"] == pytest.approx(statistics.fmean(per_seed))
            assert accuracy["low"] <= accuracy["mean"] <= accuracy["high"]
            assert accuracy["n"] == 2
        # Fused − cuDNN in points over the seeds (Welch), as the answer's verdict reads it.
        points = block["fused_minus_cudnn_points"]
        fused, cudnn = ([100 * a for a in seeds(depth, m)] for m in ("fused", "cudnn"))
        assert points["value"] == pytest.approx(statistics.fmean(fused) - statistics.fmean(cudnn))
        assert points["n_fused"] == points["n_cudnn"] == 2
        # Every mode trains from each seed's weights on its batches: the CPU baselines here
        # compute the same, so each seed's accuracy is the same in every mode.
        assert seeds(depth, "cudnn") == seeds(depth, "fused") == seeds(depth, "cpu")


def test_every_row_is_skipped_with_the_reason_when_the_data_is_missing(tmp_path):
    datasets.prepare("fashion_mnist", {"debian_dir": str(tmp_path / "none"), "download": False},
                 tmp_path)  # fmt: skip
    result = fused_conv.run(CFG | {"dataset": "fashion_mnist"}, tmp_path, data_dir=tmp_path,
                                threads=1)  # fmt: skip
    assert {r["status"] for r in result["rows"]} == {"skipped"}
    assert all("fashion_mnist unavailable" in r["reason"] for r in result["rows"])


def test_cpu_timer_sums_only_timed_spans():
    timer = fused_conv.StepTimer(torch.device("cpu"))
    with timer.span("forward", timed=False):
        sum(range(10_000))
    assert timer.totals()["forward"] == 0.0
    with timer.span("forward", timed=True):
        sum(range(10_000))
    assert timer.totals()["forward"] > 0.0
