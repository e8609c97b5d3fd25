"""B4: the profiler attributes time and memory to the B model's own modules."""

import csv
import math
import statistics

import pytest
import torch

from dmls import stats
from dmls.special.profiler import measure as profiler
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
                "kind": "Linear", "calls": 10, "position": 0, "started_s": float(repeat),
                **metrics}  # fmt: skip

    per_repeat = profiler._per_repeat(
        [m(0, "a", 1000.0), m(0, "b", 2000.0), m(1, "a", 3000.0), m(1, "b", 4000.0)]
    )
    assert [r["cpu_time_ms"] for r in per_repeat] == [3.0, 7.0]  # µs summed per repeat, in ms
    assert all((r["modules"], r["calls"]) == (2, 20) for r in per_repeat)
    (row,) = profiler._aggregate(per_repeat)
    assert (row["modules"], row["calls"], row["repeats"]) == (2, 20, 2)
    assert row["cpu_time_ms_mean"] == 5.0  # (1 + 2 + 3 + 4) ms / 2
    # Student t with 1 degree of freedom: 12.706 × stdev(3, 7) / √2.
    assert row["cpu_time_ms_ci95"] == pytest.approx(12.7062 * 2**0.5 * 2 / 2**0.5, rel=1e-4)


def gmean_ratio(a, b):
    """The ratio of the geometric means of a and b, recomputed here."""
    return math.exp(statistics.fmean(map(math.log, a)) - statistics.fmean(map(math.log, b)))


def test_verdicts_name_the_largest_mean_and_its_ratio_to_the_next():
    times = {  # per repeat, ms: Linear about twice BatchNorm, Activation far below
        ("relu", "Linear"): [10.0, 11.0, 9.5], ("relu", "BatchNorm"): [5.0, 5.5, 5.2],
        ("relu", "Activation"): [1.0, 1.1, 0.9], ("gelu", "Activation"): [4.0, 4.4, 3.9],
        ("gelu", "Linear"): [10.0, 10.5, 9.8], ("gelu", "BatchNorm"): [5.0, 5.1, 5.3],
    }  # fmt: skip
    modules = {"Linear": 2, "BatchNorm": 1, "Activation": 1}
    rows = [
        {"device": "cpu", "activation": a, "repeat": i, "kind": k, "cpu_time_ms": t,
         "cpu_memory_kib": {"Linear": 52.0, "BatchNorm": 32.0, "Activation": 32.0}[k],
         "modules": modules[k], "started_s": 10.0 * i + (a == "gelu")}
        for (a, k), ts in times.items()
        for i, t in enumerate(ts)
    ]  # fmt: skip
    v = profiler.verdicts(rows, ["relu", "gelu"])
    assert v["repeats"] == 3
    cpu = v["by_device"]["cpu"]
    assert cpu["activation"] == "relu" and cpu["time"] == cpu["by_activation"]["relu"]["time"]
    time = cpu["time"]
    assert (time["metric"], time["costliest"], time["second"]) == ("cpu_time_ms", "Linear",
                                                                     "BatchNorm")  # fmt: skip
    assert time["value"] == pytest.approx(gmean_ratio(times["relu", "Linear"],
                                                      times["relu", "BatchNorm"]))  # fmt: skip
    assert 1 < time["low"] < time["value"] < time["high"] and time["within_noise"] is False
    memory = cpu["memory"]  # the same bytes every repeat: a ratio without spread
    assert memory["costliest"] == "Linear" and memory["value"] == pytest.approx(52 / 32)
    assert memory["low"] == pytest.approx(memory["high"]) == pytest.approx(52 / 32)
    act = cpu["activations"]
    assert (act["slowest"], act["fastest"]) == ("gelu", "relu")
    assert act["value"] == pytest.approx(gmean_ratio(times["gelu", "Activation"],
                                                     times["relu", "Activation"]))  # fmt: skip
    assert act["vs_relu"]["gelu"]["value"] == pytest.approx(act["value"])
    # Per module, the two Linear modules' time is halved: 5.0 ms against BatchNorm's 5.2.
    per_layer = cpu["time_per_layer"]
    assert per_layer["modules"] == modules
    assert (per_layer["costliest"], per_layer["second"]) == ("BatchNorm", "Linear")
    # Each activation against its own pass's BatchNorm, repeat by repeat.
    ratios = [a / b for a, b in zip(times["gelu", "Activation"], times["gelu", "BatchNorm"],
                                    strict=True)]  # fmt: skip
    assert act["vs_batchnorm"]["gelu"]["value"] == pytest.approx(
        math.exp(statistics.fmean(map(math.log, ratios)))
    )
    # The control: the identical BatchNorm in gelu's model against relu's.
    assert act["control"]["reference"] == "relu"
    assert act["control"]["gelu"]["value"] == pytest.approx(
        gmean_ratio(times["gelu", "BatchNorm"], times["relu", "BatchNorm"])
    )
    drift = cpu["drift"]
    assert drift["passes"] == 6 and drift["seconds"] == 21.0
    assert drift["low"] < drift["over_study"] < drift["high"]


def test_each_repeat_measures_every_activation_once_in_an_order_drawn_afresh(tmp_path, tabular_dir):
    """B4 once profiled each activation's model in a block of its own, one after another: the
    identical BatchNorm took 1.82x longer in the ReLU block than in the sigmoid block (the
    example's CPU), and that drift read as an effect of the activation."""
    activations = ["relu", "tanh", "sigmoid", "gelu"]
    orders = stats.turns(activations, 8, seed=0)
    assert all(sorted(order) == sorted(activations) for order in orders)
    assert len({tuple(order) for order in orders}) > 1  # not one fixed order
    assert orders == stats.turns(activations, 8, seed=0)  # seeded: a rerun takes the same
    cfg = {"batches": 2, "batch_size": 8, "warmup_batches": 1, "repeats": 3,
           "activations": activations, "hidden": HIDDEN, "seed": 0}  # fmt: skip
    profiler.run(cfg, tmp_path, data_dir=tabular_dir, threads=1)
    with open(tmp_path / "repeats.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["device"] == "cpu" and r["kind"] == "Linear"]
    passes = sorted(rows, key=lambda r: float(r["started_s"]))
    # By start time: repeat 0's four passes, then repeat 1's, ...; each repeat in its turns.
    assert [int(r["repeat"]) for r in passes] == [k for k in range(3) for _ in activations]
    for k, order in enumerate(stats.turns(activations, 3, seed=0)):
        mine = [r for r in passes if int(r["repeat"]) == k]
        assert [r["activation"] for r in mine] == order
        assert [int(r["position"]) for r in mine] == [0, 1, 2, 3]


def test_run_writes_tables_traces_and_figure(tmp_path, tabular_dir):
    cfg = {"batches": 4, "batch_size": 8, "warmup_batches": 1, "repeats": 2,
           "activations": ["relu", "gelu"], "hidden": HIDDEN, "seed": 0}  # fmt: skip
    result = profiler.run(cfg, tmp_path, data_dir=tabular_dir, threads=1)
    cpu = [r for r in result["rows"] if r["device"] == "cpu"]
    assert [r["status"] for r in cpu] == ["ok", "ok"]
    assert set(cpu[0]["by_kind"]) == {"Linear", "BatchNorm", "Activation", "Model"}
    assert set(cpu[0]["by_kind"]["Linear"]) == {
        f"{v}_{s}" for v in profiler.VALUES for s in ("mean", "ci95")
    }
    if not torch.cuda.is_available():
        gpu = [r for r in result["rows"] if r["device"] == "cuda"]
        assert len(gpu) == 2 and all(r["status"] == "skipped" and r["reason"] for r in gpu)
    with open(tmp_path / "modules.csv") as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert tuple(reader.fieldnames) == profiler.TABLE_COLUMNS
    assert "cpu_time_ms_mean" in reader.fieldnames and "cpu_time_ms_ci95" in reader.fieldnames
    assert len(table) == 2 * 4  # activations × (3 kinds + whole model)
    assert all(float(r["cpu_time_ms_ci95"]) >= 0 for r in table)
    assert all(r["repeats"] == "2" for r in table)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == ["cpu_gelu.json.gz", "cpu_relu.json.gz"]
    assert (tmp_path / "profile.png").stat().st_size > 0


def test_run_keeps_every_repeat_and_its_verdicts_follow_from_them(tmp_path, tabular_dir):
    repeats, activations = 3, ["relu", "tanh", "gelu"]
    cfg = {"batches": 4, "batch_size": 8, "warmup_batches": 1, "repeats": repeats,
           "activations": activations, "hidden": HIDDEN, "seed": 0}  # fmt: skip
    result = profiler.run(cfg, tmp_path, data_dir=tabular_dir, threads=1)
    with open(tmp_path / "repeats.csv") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["device"] == "cpu"]
    assert tuple(reader.fieldnames) == profiler.REPEAT_COLUMNS
    for activation in activations:
        for kind in (*profiler.KINDS, "Model"):
            key = (activation, kind)
            got = [int(r["repeat"]) for r in rows if (r["activation"], r["kind"]) == key]
            assert got == list(range(repeats))  # one row per repeat, as configured

    def values(activation, kind, column):
        key = (activation, kind)
        return [float(r[column]) for r in rows if (r["activation"], r["kind"]) == key]

    verdicts = result["verdicts"]
    assert verdicts["repeats"] == repeats and "geometric mean" in verdicts["convention"]
    cpu = verdicts["by_device"]["cpu"]
    for activation in activations:
        for part, column in (("time", "cpu_time_ms"), ("memory", "cpu_memory_kib")):
            block = cpu["by_activation"][activation][part]
            means = {k: statistics.fmean(values(activation, k, column)) for k in profiler.KINDS}
            assert block["metric"] == column and block["n"] == repeats
            assert means[block["costliest"]] == max(means.values())
            rest = {k: m for k, m in means.items() if k != block["costliest"]}
            assert means[block["second"]] == max(rest.values())
            expected = gmean_ratio(values(activation, block["costliest"], column),
                                   values(activation, block["second"], column))  # fmt: skip
            assert block["value"] == pytest.approx(expected, rel=1e-9)
            assert block["low"] <= block["value"] <= block["high"]
            assert block["means"] == pytest.approx(means)
    assert cpu["time"] == cpu["by_activation"]["relu"]["time"]
    assert cpu["memory"] == cpu["by_activation"]["relu"]["memory"]
    act = cpu["activations"]
    means = {a: statistics.fmean(values(a, "Activation", "cpu_time_ms")) for a in activations}
    assert means[act["slowest"]] == max(means.values())
    assert means[act["fastest"]] == min(means.values())
    expected = gmean_ratio(values(act["slowest"], "Activation", "cpu_time_ms"),
                           values(act["fastest"], "Activation", "cpu_time_ms"))  # fmt: skip
    assert act["value"] == pytest.approx(expected, rel=1e-9) and act["value"] >= 1
    assert act["low"] <= act["value"] <= act["high"]
    for activation in ("tanh", "gelu"):
        ratio = act["vs_relu"][activation]
        expected = gmean_ratio(values(activation, "Activation", "cpu_time_ms"),
                               values("relu", "Activation", "cpu_time_ms"))  # fmt: skip
        assert ratio["value"] == pytest.approx(expected, rel=1e-9)
        assert ratio["low"] <= ratio["value"] <= ratio["high"]
    # modules.csv's means are those of the repeats.
    with open(tmp_path / "modules.csv") as f:
        table = {(r["activation"], r["kind"]): r for r in csv.DictReader(f) if r["device"] == "cpu"}
    for (activation, kind), row in table.items():
        mean = statistics.fmean(values(activation, kind, "cpu_time_ms"))
        assert float(row["cpu_time_ms_mean"]) == pytest.approx(mean)
