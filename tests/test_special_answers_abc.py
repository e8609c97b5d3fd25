"""The answers of A5 explained, B4 and C (dmls.report.special_answers): A5's collectives
sweep against a built summary (latency, bandwidth, Gloo against NCCL at the CNN's
gradient, and without GPUs), B4's profiler and C's fused kernel run here on the CPU (C's
GPU modes as CPU baselines) with their ratios and intervals, and what C says without CUDA."""

import re
from pathlib import Path

import pytest

from dmls import stats
from dmls.report.phrases import full
from dmls.report.special_answers import read_csv_rows
from dmls.report.wording import ratio_strings
from dmls.special import runner
from dmls.special.fused_conv.spec import _ms
from special_fixtures import GRADIENT, answer, facts_of, sweep_rows


# --------------------------------------------------------------------------- A5 explained
def latency(backend, device, size, n=2):
    return (60.0 if backend == "nccl" else 130.0 if device == "cpu" else 330.0) * n / 2 + size / (
        1e4 if backend == "nccl" else 2e2
    )


def test_a5_latency_bandwidth_and_gloo_against_nccl_at_the_gradients_size(tmp_path):
    summary = {"status": "ok", "rows": sweep_rows(), "course_gradient_bytes": GRADIENT}
    # Before: the CIFAR model's gradient, whatever the A runs trained; now named with its model.
    named = summary | {"gradient_model": {"parameters": 390634, "dataset": "fashion_mnist"}}
    gradient = facts_of("collectives", named, tmp_path)[1]["gradient"]
    assert gradient.endswith(": 390,634 parameters, built for Fashion-MNIST"), gradient
    case, facts = facts_of("collectives", summary, tmp_path)
    assert case == "compared"
    assert facts["processes"] == "2"
    big = 67108864 / (latency("nccl", "cuda", 67108864) * 1e-6) / 1e9
    assert facts["setups"].startswith(
        f"NCCL on CUDA tensors 60 µs at 4 B and {big:.3g} GB/s at 64 MiB; Gloo on CPU tensors "
        "130 µs at 4 B"
    )
    assert facts["setups"].endswith(
        "Gloo on CPU tensors over two Slurm nodes not measured here, as it was skipped: no "
        "Slurm cluster here"
    )
    # 2.37 MiB lies nearer 4 MiB than 256 KiB on a log scale.
    assert (facts["gradient"], facts["size"]) == ("2.37 MiB", "4 MiB")
    nccl, gloo = latency("nccl", "cuda", 4194304), latency("gloo", "cuda", 4194304)
    assert facts["gloo_cuda"] == (
        f"{nccl / gloo:.3g}× ({gloo:,.0f} vs {nccl:.3g} µs, the medians of the timed calls; the "
        "sweep keeps no spread, so no verdict)"
    )  # (no interval: the one rule gives no verdict)
    assert facts["gloo_cpu"].endswith("so no verdict)")


def test_a5_without_gpus_gloo_against_nccl_is_not_measured_with_the_reason(tmp_path):
    summary = {"status": "ok", "rows": sweep_rows(nccl=False), "course_gradient_bytes": GRADIENT}
    case, facts = facts_of("collectives", summary, tmp_path)
    assert case == "no_nccl"
    assert (
        facts["why"] == "not measured here, as it was skipped: needs 2 CUDA GPUs, this host has 0"
    )
    assert facts["setups"].startswith(
        "NCCL on CUDA tensors not measured here, as it was skipped: needs 2 CUDA GPUs"
    )
    assert answer("collectives", summary, tmp_path)[1] == (
        "Gloo against NCCL at the CNN's gradient (2.37 MiB): not measured here (as above)."
    )  # the reason is in the sentence before


# --------------------------------------------------------------------------- B4 and C
def test_b4_names_the_costliest_module_kind_and_slowest_activation_with_intervals(b4):
    summary, folder = b4
    _, facts = facts_of("profiler", summary, folder)
    cpu = summary["verdicts"]["by_device"]["cpu"]
    time = cpu["time"]
    assert facts["device"] == "the CPU" and facts["repeats"] == "3"
    # The study's own ratio, with the decimals that show its side of 1 (wording.ratio_strings:
    # an interval near 1 gets more), whatever these timings came out as.
    value, interval = ratio_strings(
        stats.Comparison(time["value"], time["low"], time["high"], 3, 3, 1.0)
    )
    assert facts["time"].startswith(
        f"{time['costliest']}, {value} {time['second']}'s ({interval}; "
    ), facts["time"]
    slowest = cpu["activations"]["slowest"]
    assert facts["activations"].startswith(f"{slowest}, ") and slowest in ("relu", "gelu")
    # Every activation the study swapped in is named with its time, fastest first.
    means = cpu["activations"]["means"]
    assert [part.split()[0] for part in facts["ranking"].split(", ")] == sorted(
        means, key=means.get
    )


def test_special_ratios_of_repeats_that_agree_exactly_print_no_interval():
    """Before: B4's memory read "1.62× BatchNorm's (1.62–1.62×; 65 vs 40 KiB), costlier", the
    zero-width interval of repeats that allocate the same bytes (item 11's "0.23–0.23×")."""
    from dmls.report.special_answers import speed

    block = {"metric": "cpu_memory_kib", "costliest": "Linear", "second": "BatchNorm",
             "means": {"Linear": 65.0, "BatchNorm": 40.0}, "value": 1.625, "low": 1.625,
             "high": 1.625, "n": 2}  # fmt: skip
    same = {"value": 1.0, "low": 1.0, "high": 1.0}
    summary = {"rows": [{"status": "ok"}], "verdicts": {"repeats": 2, "by_device": {"cpu": {
        "time": block | {"metric": "cpu_time_ms"}, "memory": block,
        "time_per_layer": block | {"metric": "cpu_time_ms",
                                   "modules": {"Linear": 2, "BatchNorm": 1}},
        "activations": block | {"metric": "cpu_time_ms", "slowest": "gelu", "fastest": "relu",
                                "means": {"gelu": 2.0, "relu": 1.0},
                                "vs_batchnorm": {"gelu": same, "relu": same},
                                "control": {"kind": "BatchNorm", "reference": "relu",
                                            "gelu": same}},
        "drift": None}}}}  # fmt: skip
    _, facts = facts_of("profiler", summary, Path("."))
    assert facts["memory"] == (
        "Linear, 1.62× BatchNorm's (65 vs 40 KiB; no spread in the repeats compared), costlier"
    )
    assert full(speed([2.0, 2.0], [1.0, 1.0], "2 vs 1 ms")) == (
        "2.00× (2 vs 1 ms; no spread in the repeats compared), faster"
    )
    assert full(speed([1.0], [0.99], "1 vs 0.99 ms")) == (
        "1.01× (1 vs 0.99 ms; one repeat on a side, no interval), too few repeats to tell"
    )


def test_c_gives_the_fused_kernel_against_cudnn_as_a_speed_with_its_interval(c):
    summary, folder = c
    _, facts = facts_of("fused_conv", summary, folder)
    assert (facts["shallow"], facts["deep"]) == ("2", "4")
    forward = summary["verdicts"]["by_depth"]["2"]["vs_cudnn"]["fused"]["forward"]
    # The study's own ratio, written with the decimals that show its side of 1 (2 to 4:
    # wording.ratio_strings), so a lower end of 1.001 never reads "1.00".
    value, interval = ratio_strings(
        stats.Comparison(forward["value"], forward["low"], forward["high"], 2, 2, 1.0)
    )
    assert facts["forward_shallow"].startswith(f"{value} ({interval}; ")

    # The fused kernel's time first, as in every "run vs reference" (it read cuDNN's first).
    def mean_ms(mode: str) -> str:
        times = [float(r["forward_ms"]) for r in read_csv_rows(folder / "repeats.csv")
                 if r["depth"] == "2" and r["mode"] == mode]  # fmt: skip
        return _ms(stats.geometric_mean(times))

    assert f"; {mean_ms('fused')} vs {mean_ms('cudnn')} ms per step)" in facts["forward_shallow"]
    # The course's other baselines, the CPU here (cuDNN off is not in this config).
    assert facts["others_shallow"].startswith("on the CPU: forward ")
    assert f"; {mean_ms('cpu')} vs {mean_ms('cudnn')} ms per step)" in facts["others_shallow"]
    # Accuracy over the seeds for the modes trained for it, then fused − cuDNN by the one
    # rule; the CPU is timed only, and the answer says so.
    assert re.search(r"^cudnn [\d.]+%( ± [\d.]+)?; fused [\d.]+%( ± [\d.]+)?; fused − cuDNN ",
                     facts["accuracy_shallow"])  # fmt: skip
    assert "cpu" not in facts["accuracy_shallow"]
    assert facts["timed_only"] == (
        "the mode cpu was timed only, not trained for accuracy (the config's accuracy_modes)"
    )
    assert facts["seeds"] == "2 seeds" and facts["epochs"] == "1 epoch"


def test_c_without_cuda_says_why_the_kernel_is_not_measured(tmp_path):
    from dmls.data import datasets

    data = tmp_path / "images"
    datasets.prepare("synthetic_cifar", {"n_train": 64, "n_test": 32, "seed": 0}, data)
    cfg = {"title": "C", "dataset": "synthetic_cifar", "depths": [2], "channels": 4,
           "fc_hidden": 8, "modes": ["cudnn", "fused", "cpu"], "epochs": 1, "batch_size": 16,
           "lr": 0.001, "warmup_steps": 1, "timed_steps": 3, "train_samples": 64,
           "test_samples": 32, "tf32": False, "seed": 0, "repeats": 2, "accuracy_seeds": 2,
           "accuracy_modes": ["cudnn", "fused"]}  # fmt: skip
    summary = runner.run_study("fused_conv", cfg, tmp_path / "c", data_dir=data)
    if summary["rows"][0]["status"] == "ok":
        pytest.skip("this host has CUDA")
    _, facts = facts_of("fused_conv", summary, tmp_path / "c")
    assert facts["forward_shallow"].startswith("not measured here, as ")
    assert "needs a CUDA GPU" in facts["forward_shallow"]
    # Without cuDNN's times, the course's other baselines against it say why once.
    assert facts["others_shallow"].startswith("cuDNN off and the CPU not measured here, as it ")
    assert facts["others_shallow"].count("not measured") == 1


def test_c_names_every_mode_timed_only_and_no_mode_whose_accuracy_failed():
    from dmls.special.fused_conv.measure import TIMED_ONLY
    from dmls.special.fused_conv.spec import Measured

    rows = [
        {"depth": 2, "mode": "cudnn", "status": "ok", "accuracy_reason": None},
        {"depth": 2, "mode": "fused", "status": "ok", "accuracy_reason": TIMED_ONLY},
        {"depth": 2, "mode": "cpu", "status": "failed",
         "accuracy_reason": "accuracy seed 0 (1/3): RuntimeError: out of memory"},
    ]  # fmt: skip
    assert Measured(rows, {}).timed_only() == (
        "the mode fused was timed only, not trained for accuracy (the config's accuracy_modes)"
    )
