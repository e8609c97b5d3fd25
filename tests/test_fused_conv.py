"""C: the benchmark of conv implementations, as far as a CPU host can run it."""

import csv
import math
import statistics

import pytest
import torch

from dmls.data import datasets
from dmls.special import fused_conv

CFG = {"dataset": "synthetic_cifar", "depths": [2, 10], "channels": 4, "fc_hidden": 8,
       "modes": ["cudnn", "fused", "no_cudnn", "cpu"], "epochs": 1, "batch_size": 16,
       "lr": 0.001, "warmup_steps": 1, "train_samples": 64, "test_samples": 32, "tf32": False,
       "seed": 0, "repeats": 2}  # fmt: skip


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
    result = fused_conv.run(CFG, tmp_path, data_dir=image_dir, threads=1)
    rows = {(r["depth"], r["mode"]): r for r in result["rows"]}
    assert len(rows) == 8
    for depth in (2, 10):
        cpu = rows[(depth, "cpu")]
        assert cpu["status"] == "ok"
        assert cpu["steps"] == 4 and cpu["timed_steps"] == 3  # 64 images / 16, 1 warm-up
        assert cpu["forward_time_s"] > 0 and cpu["backward_time_s"] > 0
        assert cpu["repeats"] == 2 and cpu["forward_time_s_ci95"] >= 0
        assert 0 <= cpu["test_accuracy"] <= 1
        accuracy = result["verdicts"]["by_depth"][str(depth)]["test_accuracy_percent"]
        assert accuracy["cpu"]["mean"] == pytest.approx(100 * cpu["test_accuracy"])
        assert accuracy["cpu"]["n"] == 2
        if not torch.cuda.is_available():
            for mode in ("cudnn", "fused", "no_cudnn"):
                assert rows[(depth, mode)]["status"] == "skipped"
                assert "needs a CUDA GPU" in rows[(depth, mode)]["reason"]
                assert accuracy[mode] is None
            for part in ("forward", "backward"):
                speedup = result["verdicts"]["by_depth"][str(depth)]["fused_vs_cudnn"][part]
                assert speedup["value"] is None and "needs a CUDA GPU" in speedup["reason"]
    with open(tmp_path / "results.csv") as f:
        reader = csv.DictReader(f)
        assert len(list(reader)) == 8
    assert {"forward_time_s_ci95", "backward_time_s_ci95"} <= set(reader.fieldnames)
    with open(tmp_path / "repeats.csv") as f:
        repeats = list(csv.DictReader(f))
    for depth in (2, 10):
        mine = [r for r in repeats if (int(r["depth"]), r["mode"]) == (depth, "cpu")]
        assert [int(r["repeat"]) for r in mine] == [0, 1]
        mean = statistics.fmean(float(r["forward_time_s"]) for r in mine)
        assert rows[(depth, "cpu")]["forward_time_s"] == pytest.approx(mean)
    assert result["data"]["n_train"] == 64 and result["data"]["n_test"] == 32
    assert (tmp_path / "times.png").stat().st_size > 0


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

    verdicts = result["verdicts"]
    assert "> 1 means the fused kernel is faster" in verdicts["convention"]
    for depth in (2, 10):
        mine = [r for r in repeats if int(r["depth"]) == depth]
        for repeat in range(3):  # each repeat runs every mode once, the first turn rotating
            turns = sorted((int(r["order"]), r["mode"]) for r in mine if int(r["repeat"]) == repeat)
            assert [m for _, m in turns] == (cfg["modes"] * 2)[repeat : repeat + 3]
        block = verdicts["by_depth"][str(depth)]
        for part in ("forward", "backward"):
            speedup = block["fused_vs_cudnn"][part]
            cudnn, fused = (values(depth, m, f"{part}_time_s") for m in ("cudnn", "fused"))
            assert len(cudnn) == len(fused) == 3 == speedup["n_cudnn"] == speedup["n_fused"]
            assert speedup["value"] == pytest.approx(gmean_ratio(cudnn, fused), rel=1e-9)
            assert speedup["low"] <= speedup["value"] <= speedup["high"]
            assert speedup["within_noise"] == (speedup["low"] <= 1 <= speedup["high"])
        for mode in cfg["modes"]:
            accuracy = block["test_accuracy_percent"][mode]
            per_repeat = [100 * a for a in values(depth, mode, "test_accuracy")]
            assert accuracy["mean"] == pytest.approx(statistics.fmean(per_repeat))
            assert accuracy["low"] <= accuracy["mean"] <= accuracy["high"]
            assert accuracy["n"] == 3
        # Every repeat trains from the same weights on the same batches: on the CPU, the
        # same accuracy each time.
        assert len(set(values(depth, "cpu", "test_accuracy"))) == 1


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
