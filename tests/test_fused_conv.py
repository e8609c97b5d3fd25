"""C: the benchmark of conv implementations, as far as a CPU host can run it."""

import csv

import pytest
import torch

from dmls.data import datasets
from dmls.special import fused_conv

CFG = {"dataset": "synthetic_cifar", "depths": [2, 10], "channels": 4, "fc_hidden": 8,
       "modes": ["cudnn", "fused", "no_cudnn", "cpu"], "epochs": 1, "batch_size": 16,
       "lr": 0.001, "warmup_steps": 1, "train_samples": 64, "test_samples": 32, "tf32": False,
       "seed": 0}  # fmt: skip


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
        assert 0 <= cpu["test_accuracy"] <= 1
        if not torch.cuda.is_available():
            for mode in ("cudnn", "fused", "no_cudnn"):
                assert rows[(depth, mode)]["status"] == "skipped"
                assert "needs a CUDA GPU" in rows[(depth, mode)]["reason"]
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert result["data"]["n_train"] == 64 and result["data"]["n_test"] == 32
    assert (tmp_path / "times.png").stat().st_size > 0


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
