"""B4: the profiler attributes time and memory to the B model's own modules."""

import csv

import pytest
import torch

from dmls.special import profiler
from dmls.training.models import ClusterMLP

BATCH, BATCHES, HIDDEN, CLASSES = 16, 6, 32, 20


def model(activation="relu"):
    torch.manual_seed(0)
    return ClusterMLP(512, CLASSES, HIDDEN, batch_norm=True, activation=activation)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "gelu"])
def test_each_module_is_attributed_its_calls_and_its_output_memory(activation):
    batches = list(torch.randn(BATCHES * BATCH, 512).split(BATCH))
    rows = {r["label"]: r for r in profiler.profile_batches(model(activation), batches, 2)}
    kinds = {r["kind"] for r in rows.values()}
    assert kinds == {"Linear", "BatchNorm", "Activation", "Model"}
    assert all(r["calls"] == BATCHES for r in rows.values())
    # Each module allocates its float32 output, B × width × 4 bytes, per batch.
    width = {"net.0 Linear": HIDDEN, "net.1 BatchNorm1d": HIDDEN, "net.3 Linear": CLASSES}
    act_label = next(label for label, r in rows.items() if r["kind"] == "Activation")
    width[act_label.removeprefix(profiler.MODULE_PREFIX)] = HIDDEN
    for label, w in width.items():
        assert rows[profiler.MODULE_PREFIX + label]["cpu_memory_bytes"] == BATCHES * BATCH * w * 4
    # The modules' ranges are inside the batch's: their times add up to less than the whole.
    modules = [r for r in rows.values() if r["kind"] != "Model"]
    assert all(r["cpu_time_total_us"] > 0 for r in modules)
    assert sum(r["cpu_time_total_us"] for r in modules) <= rows["batch"]["cpu_time_total_us"]


def test_hooks_are_removed_after_labelling():
    net = model()
    with profiler.labelled_modules(net) as labels:
        assert len(labels) == 4
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_aggregate_sums_modules_of_a_kind_then_averages_repeats():
    def m(repeat, label, t):
        metrics = dict.fromkeys(profiler.METRICS, 0.0) | {"cpu_time_total_us": t}
        return {"device": "cpu", "activation": "relu", "repeat": repeat, "label": label,
                "kind": "Linear", "calls": 10, **metrics}  # fmt: skip

    table = profiler._aggregate([m(0, "a", 1.0), m(0, "b", 2.0), m(1, "a", 3.0), m(1, "b", 4.0)])
    (row,) = table
    assert (row["modules"], row["calls"], row["repeats"]) == (2, 20, 2)
    assert row["cpu_time_total_us_mean"] == 5.0  # (1 + 2 + 3 + 4) / 2
    assert row["cpu_time_total_us_std"] == pytest.approx(2**0.5 * 2)  # stdev(3, 7)


def test_run_writes_tables_traces_and_figure(tmp_path, tabular_dir):
    cfg = {"batches": 4, "batch_size": 8, "warmup_batches": 1, "repeats": 2,
           "activations": ["relu", "gelu"], "hidden": HIDDEN, "seed": 0}  # fmt: skip
    result = profiler.run(cfg, tmp_path, data_dir=tabular_dir, threads=1)
    cpu = [r for r in result["rows"] if r["device"] == "cpu"]
    assert [r["status"] for r in cpu] == ["ok", "ok"]
    assert set(cpu[0]["by_kind"]) == {"Linear", "BatchNorm", "Activation", "Model"}
    if not torch.cuda.is_available():
        gpu = [r for r in result["rows"] if r["device"] == "cuda"]
        assert len(gpu) == 2 and all(r["status"] == "skipped" and r["reason"] for r in gpu)
    with open(tmp_path / "modules.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 * 4  # activations × (3 kinds + whole model)
    assert all(float(r["cpu_time_total_us_std"]) >= 0 for r in table)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == ["cpu_gelu.json.gz", "cpu_relu.json.gz"]
    assert (tmp_path / "profile.png").stat().st_size > 0
