"""The special studies' answers (dmls.report.special_answers): each facts function against a
summary whose numbers are known, real ones for the cheap studies (run here on the CPU) and
built ones, with the GPU rows a CPU host can't make, for the others; and the templates proposed
for report/studies.yaml filled from every case."""

import json
import re
import string
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from dmls import stats
from dmls.report import special_answers as sa
from dmls.report.comparisons import NotMeasured
from dmls.report.phrases import full
from dmls.report.special_answers import read_csv_rows
from dmls.report.wording import ratio_strings
from dmls.special import runner
from dmls.special.catalog import STUDIES
from dmls.special.fused_conv_spec import _ms
from dmls.summary import read as read_summary

# The `answer:` blocks proposed for report/studies.yaml, per special section.
# The answers' templates as the report uses them: report/studies.yaml's special sections.
TEMPLATES = {
    section["special"]: section["answer"]
    for section in yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())["sections"]
    if "special" in section and section.get("answer")
}
# Every case each facts function can return.
CASES = {
    "lenet_memory": {"full", "no_full"},
    "spare_failure": {"all_within", "within_chance", "outside"},
    "float32_bytes": {"exact", "inexact"},
    "graphs": {"measured"},
    "collectives": {"compared", "no_nccl"},
    "sharding": {"measured"},
    "profiler": {"measured"},
    "fused_conv": {"measured"},
    "serialization": {"measured"},
    "spark_lazy": {"measured"},
}
SKIPPED_GPU = {"status": "skipped", "reason": "no CUDA device on this host"}


def facts_of(name, summary, folder):
    """A study's case and facts, each fact written in full."""
    case, facts = STUDIES[name].facts(summary, folder)
    return case, {key: full(value) for key, value in facts.items()}


def answer(name, summary, folder):
    return sa.special_answer(TEMPLATES[name], STUDIES[name].facts, summary, folder)[0]


def templates(name, case):
    """The templates of study `name` that case `case` fills."""
    return [e["say"][case] if isinstance(e["say"], dict) else e["say"] for e in TEMPLATES[name]]


def fields(template):
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def written(summary, folder):
    """`summary` as the runner writes it (through JSON), in `folder`."""
    (folder / "summary.json").write_text(json.dumps(summary))
    return json.loads((folder / "summary.json").read_text())


# --------------------------------------------------------------------------- D1
def ran(tmp_path_factory, name: str, cfg: dict) -> tuple[dict, Path]:
    """A special study run on the CPU into a folder of its own: (its summary.json, the folder)."""
    folder = tmp_path_factory.mktemp(name)
    runner.run_study(name, cfg, folder)
    return read_summary(folder / "summary.json"), folder


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    cfg = {"title": "D1", "batch_size": 8, "activation": "tanh", "optimizers": ["adamw"],
           "precisions": ["fp32"], "recompute": ["none", "full"], "steps": 2,
           "seed": 0}  # fmt: skip
    return ran(tmp_path_factory, "lenet_memory", cfg)


def test_d1_gives_parameters_the_estimate_the_measured_peak_and_recomputation(lenet):
    summary, folder = lenet
    case, facts = facts_of("lenet_memory", summary, folder)
    assert case == "full"
    assert facts["parameters"] == facts["closed_form"] == "61,706"
    assert facts["agreement"] == "agree"
    est = {e["recompute"]: e for e in summary["estimate"]}
    measured = {r["device"]: r for r in summary["rows"]
                if r["status"] == "ok" and r["recompute"] == "none"}  # fmt: skip
    row = measured.get("cuda", measured["cpu"])
    device = "the GPU" if row["device"] == "cuda" else "the CPU"
    assert facts["device"].startswith(device)
    assert facts["estimate"].startswith(f"{est['none']['total_bytes']:,} bytes")
    assert facts["peak"].startswith(f"{row['peak_bytes']:,} bytes")
    peak, total = row["peak_bytes"], est["none"]["total_bytes"]
    assert facts["ratio"] == f"{peak / total:.2f}×"
    assert facts["verdict"] == ("under" if total < peak else "over")
    assert facts["gap"] == f"{100 * abs(peak - total) / peak:.1f}%"
    saved = total - est["full"]["total_bytes"]
    assert (facts["effect"], facts["saved"].split(" bytes")[0]) == ("saves", f"{saved:,}")
    sentences = answer("lenet_memory", summary, folder)
    assert len(sentences) == 3
    assert f"{saved:,} bytes" in sentences[2]
    # Before: D1 quoted the estimate's saving and left out its own measurement of it.
    full = next(
        r
        for r in summary["rows"]
        if r["status"] == "ok"
        and r["device"] == row["device"]
        and (r["optimizer"], r["precision"], r["recompute"]) == ("adamw", "fp32", "full")
    )
    none = row["peak_bytes"]
    change = f"full {full['peak_bytes'] - none:+,} bytes ({full['peak_bytes'] / none - 1:+.1%})"
    assert change.replace("-", "−") in facts["measured_full"]
    assert f"; measured against none for AdamW fp32, on {device} " in sentences[2]
    # Every cell: over every optimizer, precision and device measured, how many each changed.
    cells = sum(r["status"] == "ok" and r["recompute"] == "full" for r in summary["rows"])
    assert "and raised it in " in facts["measured_full"]
    assert f" of {cells}" in facts["measured_full"]


def test_d1_on_a_cpu_host_says_the_device_and_why_the_gpu_rows_are_missing(lenet):
    summary, folder = lenet
    summary = json.loads(json.dumps(summary))
    for r in summary["rows"]:  # as a host without a GPU writes them
        if r["device"] == "cuda":
            r.clear()
            r.update({"device": "cuda", "optimizer": "adamw", "precision": "fp32",
                      "recompute": "none"} | SKIPPED_GPU)  # fmt: skip
    _, facts = facts_of("lenet_memory", summary, folder)
    assert facts["device"] == "the CPU (the GPU's rows were skipped: no CUDA device on this host)"
    # Only the CPU's cells are counted, and no GPU workspace is said where no GPU measured.
    assert "on the GPU" not in facts["measured_full"].split(" (on the GPU")[0]


def test_d1_the_estimate_over_the_peak_and_no_full_recomputation(tmp_path):
    summary = {
        "status": "ok",
        "parameters": {"model_total": 100, "closed_form_total": 90},
        "estimate": [{"optimizer": "adamw", "precision": "fp32", "recompute": "none",
                      "total_bytes": 2000, "activations_stored_bytes": 500}],
        "rows": [{"device": "cuda", "optimizer": "adamw", "precision": "fp32",
                  "recompute": "none", "status": "ok", "reason": None, "peak_bytes": 1600}],
    }  # fmt: skip
    case, facts = facts_of("lenet_memory", summary, tmp_path)
    assert case == "no_full"
    assert facts["agreement"] == "disagree, by 10"
    assert (facts["device"], facts["ratio"], facts["verdict"]) == ("the GPU", "0.80×", "over")
    assert facts["gap"] == "25.0%"  # 400 bytes over a peak of 1,600
    assert facts["why"] == "not measured here, as the config estimates no full recomputation"


def test_d1_with_every_row_skipped_is_not_measured_with_the_reason(tmp_path):
    summary = {"status": "skipped", "parameters": {"model_total": 1, "closed_form_total": 1},
               "estimate": [], "rows": [{"device": "cuda", "optimizer": "adamw",
                                         "precision": "fp32", "recompute": "none"}
                                        | SKIPPED_GPU]}  # fmt: skip
    with pytest.raises(NotMeasured, match="it was skipped: no CUDA device on this host"):
        facts_of("lenet_memory", summary, tmp_path)
    # Three entries, one topic: said once.
    assert answer("lenet_memory", summary, tmp_path) == [
        "LeNet-5's parameters and training memory: not measured here, as it was skipped: no "
        "CUDA device on this host."
    ]


# --------------------------------------------------------------------------- D2
@pytest.fixture(scope="module")
def spare(tmp_path_factory):
    cfg = {"title": "D2", "p_vectors": {"pair": [0.1, 0.2], "three": [0.05, 0.1, 0.3]},
           "curve_p": [0.1], "curve_n": [1, 2, 4], "trials": 200_000, "confidence": 0.99,
           "seed": 3}  # fmt: skip
    return ran(tmp_path_factory, "spare_failure", cfg)


def test_d2_the_first_vector_with_its_monte_carlo_and_the_agreement(spare):
    summary, folder = spare
    case, facts = facts_of("spare_failure", summary, folder)
    rows = {r["quantity"]: r for r in summary["rows"] if r["vector"] == "pair"}
    assert facts["vector"] == "pair (2 machines, p = 0.1, 0.2)"
    assert facts["no_spare"].startswith("0.28 (Monte Carlo ")  # 1 - 0.9 × 0.8
    assert facts["with_spare"].startswith("0.02 (Monte Carlo ")  # both fail
    assert facts["reduction"].startswith("0.26 (Monte Carlo ")  # exactly one fails
    r = rows["reduction"]
    assert (
        f"{r['monte_carlo']:.4g}, 99% interval {r['ci_low']:.4g}–{r['ci_high']:.4g}"
        in (facts["reduction"])
    )
    assert facts["share"] == f"{100 * 0.26 / 0.28:.1f}%"
    # Six vector rows and nine of the curve (curve.csv), all inside their intervals.
    assert case == "all_within"
    assert (facts["total"], facts["expected"], "outside" in facts) == ("15", "0.15", False)
    assert facts["confidence"] == "99%"


def _doctor(row):
    """Move a row's Monte Carlo interval off its closed form."""
    row.update(monte_carlo=row["closed_form"] + 0.5, ci_low=row["closed_form"] + 0.4,
               ci_high=row["closed_form"] + 0.6)  # fmt: skip


def test_d2_a_monte_carlo_row_outside_its_interval_flips_the_verdict(spare):
    summary, folder = spare
    summary = json.loads(json.dumps(summary))
    _doctor(summary["rows"][4])  # the within_ci flag left as written: the numbers count
    case, facts = facts_of("spare_failure", summary, folder)
    assert (case, facts["outside"], facts["total"]) == ("within_chance", "1", "15")
    assert facts["chance"] == f"{1 - 0.99**15:.2g}"  # at least one of 15 misses at 1%
    _doctor(summary["rows"][5])
    case, facts = facts_of("spare_failure", summary, folder)
    assert (case, facts["outside"]) == ("outside", "2")
    assert answer("spare_failure", summary, folder)[1].startswith(
        "The Monte Carlo disagrees: 2 of the 15 closed forms lie outside"
    )


# --------------------------------------------------------------------------- D3
def test_d3_bits_bytes_and_round_trip(tmp_path):
    summary = runner.run_study("float32_bytes", {"title": "D3", "value": 6.342e-5}, tmp_path)
    case, facts = facts_of("float32_bytes", summary, tmp_path)
    assert case == "exact"
    assert facts["value"] == "6.342e-05"
    assert facts["bits_hex"] == "0x3885005A"
    assert facts["sign"] == "0 (positive)"
    assert facts["exponent"] == "01110001 (biased 113, so 2^−14)"
    assert facts["fraction"].startswith("00001010000000001011010 (0x05005A, significand 1.039")
    assert (facts["little"], facts["big"]) == ("5a 00 85 38", "38 85 00 5a")
    assert facts["stored"] == repr(4358189 / 2**36)
    assert facts["error"] == "−4.92e−08"
    assert answer("float32_bytes", summary, tmp_path)[2].startswith("The round trip is exact")


def test_d3_an_inexact_round_trip_and_a_failed_study(tmp_path):
    summary = runner.run_study("float32_bytes", {"title": "D3", "value": -2.5}, tmp_path)
    summary["rows"][0]["round_trip_big_endian"] = 2.5
    case, facts = facts_of("float32_bytes", summary, tmp_path)
    assert (case, facts["sign"]) == ("inexact", "1 (negative)")
    failed = {"rows": [{"status": "failed", "reason": "struct exploded"}]}
    assert answer("float32_bytes", failed, tmp_path) == [
        "The float's bits and bytes: not measured here, as it failed: struct exploded."
    ]


# --------------------------------------------------------------------------- D5
EAGER = {"cpu": [23.0, 23.7, 24.4], "cuda": [2.5, 2.6, 2.7]}
MODE = {("cpu", "compile"): [21.0, 21.1, 21.2], ("cpu", "export"): [23.2, 23.6, 24.0],
        ("cuda", "compile"): [3.1, 3.2, 3.3], ("cuda", "export"): [2.55, 2.6, 2.65]}  # fmt: skip
FIRST = {"eager": 0.5, "compile": 86.77, "export": 0.2655}
CONTROL = [
    {"model": "if h.sum() > 0", "capture": "eager", "outcome": "runs", "graphs": 0,
     "graph_breaks": 0, "ops": None, "detail": "Python evaluates the condition"},
    {"model": "if h.sum() > 0", "capture": "torch.compile", "outcome": "graph break",
     "graphs": 2, "graph_breaks": 1, "ops": 3, "detail": "torch._dynamo.explain: generic_jump"},
    {"model": "if h.sum() > 0", "capture": "torch.export", "outcome": "refused", "graphs": 0,
     "graph_breaks": None, "ops": None,
     "detail": "GuardOnDataDependentSymNode: Could not guard on data-dependent expression"},
    {"model": "torch.cond(h.sum() > 0, ...)", "capture": "torch.export", "outcome": "exported",
     "graphs": 1, "graph_breaks": 0, "ops": 5, "detail": "both branches are subgraphs"},
]  # fmt: skip


def graph_rows(cuda=True):
    rows = []
    for device in ("cpu", "cuda"):
        for mode in ("eager", "compile", "export"):
            if device == "cuda" and not cuda:
                rows.append({"device": device, "mode": mode} | SKIPPED_GPU)
                continue
            repeats = EAGER[device] if mode == "eager" else MODE[(device, mode)]
            estimate = stats.mean_interval(repeats)
            rows.append({"device": device, "mode": mode, "status": "ok", "reason": None,
                         "first_call_s": FIRST[mode], "steady_step_ms": estimate.mean,
                         "steady_step_ms_ci95": estimate.half_width, "repeats": repeats,
                         "graphs": 1, "graph_breaks": 0})  # fmt: skip
    return rows


def test_d5_steady_step_as_a_speed_with_its_interval_first_call_and_control_flow(tmp_path):
    summary = written({"status": "ok", "rows": graph_rows(), "control_flow": CONTROL}, tmp_path)
    case, facts = facts_of("graphs", summary, tmp_path)
    cpu = stats.ratio(EAGER["cpu"], MODE[("cpu", "compile")])
    gpu = stats.ratio(EAGER["cuda"], MODE[("cuda", "compile")])
    assert facts["steady_cpu"].startswith(
        f"compiled {cpu.value:.2f}× ({cpu.low:.2f}–{cpu.high:.2f}×; "
        "21.10 ± 0.25 vs 23.7 ± 1.7 ms), faster; exported"
    )
    assert facts["steady_cpu"].endswith("within repeat noise")
    assert facts["steady_cuda"].startswith(
        f"compiled {gpu.value:.2f}× ({gpu.low:.2f}–{gpu.high:.2f}×; "
        "3.20 ± 0.25 vs 2.60 ± 0.25 ms), slower; exported"
    )
    assert gpu.value < 1 < cpu.value
    # First calls in eager steps: 86.77 s / 2.6 ms; 0.2655 s / 23.7 ms.
    assert facts["first_cuda"].startswith("compiled 86.8 s, 33,373 eager steps; exported")
    assert facts["first_cpu"].endswith("exported 0.266 s, 11 eager steps")
    assert facts["branch_compile"].startswith("broke it into 2 graphs at 1 break")
    assert facts["branch_export"] == "refused it (GuardOnDataDependentSymNode)"
    assert facts["branch_cond"] == "exported it as 1 graph"
    assert case == "measured"


def test_d5_without_a_gpu_says_why_and_reads_control_flow_from_its_csv(tmp_path):
    fields_ = list(CONTROL[0])
    with (tmp_path / "control_flow.csv").open("w") as f:
        f.write(",".join(fields_) + "\n")
        for c in CONTROL:
            f.write(",".join(f'"{c[k]}"' if c[k] is not None else "" for k in fields_) + "\n")
    summary = {"status": "ok", "rows": graph_rows(cuda=False)}
    _, facts = facts_of("graphs", summary, tmp_path)
    gone = "not measured here, as it was skipped: no CUDA device on this host"
    assert facts["steady_cuda"] == facts["first_cuda"] == gone
    assert facts["branch_compile"].startswith("broke it into 2 graphs at 1 break")
    assert "faster" in facts["steady_cpu"]


# --------------------------------------------------------------------------- A5 explained
SIZES = [4, 64, 1024, 16384, 262144, 4194304, 67108864]
GRADIENT = 2_486_048  # the course CNN's fp32 gradient, 2.37 MiB


def sweep_rows(nccl=True):
    rows = []
    for backend, device, latency in (("nccl", "cuda", 60.0), ("gloo", "cpu", 130.0),
                                     ("gloo", "cuda", 330.0)):  # fmt: skip
        for n in (2, 4):
            base = {"backend": backend, "device": device, "placement": "host", "processes": n}
            if device == "cuda" and not nccl:
                rows.append(base | {"op": "all", "status": "skipped",
                                    "reason": f"needs {n} CUDA GPUs, this host has 0"})  # fmt: skip
                continue
            for op in ("all_reduce", "all_gather"):
                for size in SIZES:
                    us = latency * n / 2 + size / (1e4 if backend == "nccl" else 2e2)
                    bw = size / (us * 1e-6) / 1e9
                    rows.append(base | {"op": op, "size_bytes": size, "status": "ok",
                                        "reason": None, "latency_us": us, "algbw_gb_s": bw,
                                        "busbw_gb_s": bw})  # fmt: skip
    rows.append({"backend": "gloo", "device": "cpu", "placement": "slurm", "processes": 2,
                 "op": "all", "status": "skipped", "reason": "no Slurm cluster here"})  # fmt: skip
    return rows


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


# --------------------------------------------------------------------------- D4
P = 476_260_352
STEPS = {"none": [14.9, 15.0, 15.1], "optimizer": [18.2, 18.3, 18.2],
         "gradients": [25.0, 26.1, 27.2], "full": [31.0, 32.7, 34.5]}  # fmt: skip
from dmls.special.sharding import STAGES  # noqa: E402


def shard_rows(n=4, zero1_state=12.51):
    """Rows as the study writes them at N = 2 and `n` on GPUs; the closed forms are the
    module's (ZeRO-2 and ZeRO-3 16/N), the state measured as given for ZeRO-1."""
    rows = []
    for ranks in (2, n):
        for strategy, stage in STAGES.items():
            closed = {"none": 16, "optimizer": 8 + 8 / ranks}.get(strategy, 16 / ranks)
            state = zero1_state if strategy == "optimizer" and ranks == n else closed
            est = stats.mean_interval(STEPS[strategy])
            rows.append({"device": "cuda", "processes": ranks, "strategy": strategy,
                         "stage": stage, "status": "ok", "reason": None, "parameters": P,
                         "state_bytes": round(state * P),
                         "state_closed_form_bytes": round(closed * P),
                         "state_expected_bytes": round(state * P), "step_ms": est.mean,
                         "step_ms_ci95": est.half_width,
                         "step_ms_samples": STEPS[strategy]})  # fmt: skip
    return rows


def test_d4_what_ran_state_against_the_closed_form_at_the_largest_n_and_the_step(tmp_path):
    failed = {"device": "cpu", "processes": 2, "strategy": "none", "stage": "DDP",
              "status": "failed", "reason": "gloo hung"}  # fmt: skip
    rows = [*shard_rows(), failed]
    case, facts = facts_of("sharding", {"status": "failed", "rows": rows}, tmp_path)
    assert case == "measured"
    assert facts["ranks"] == "4 GPU ranks (the CPU's rows failed: gloo hung)"
    assert facts["parameters"] == "476.3 M"
    assert facts["ns"] == "N = 2 and 4; the figures are N = 4's"
    only = [r for r in shard_rows() if r["processes"] == 2]
    _, only_two = facts_of("sharding", {"status": "ok", "rows": only}, tmp_path)
    assert only_two["ns"] == "N = 2 only"
    assert facts["ran"] == (
        "DDP (DistributedDataParallel); ZeroRedundancyOptimizer under DDP (ZeRO-1); "
        "fully_shard, reshard_after_forward=False (ZeRO-2-like; parameters sharded too); "
        "fully_shard, reshard_after_forward=True (ZeRO-3)"
    )
    assert "ZeroRedundancyOptimizer under DDP (ZeRO-1)" in facts["ran"]
    assert "reshard_after_forward=False (ZeRO-2-like; parameters sharded too)" in facts["ran"]
    assert "reshard_after_forward=True (ZeRO-3)" in facts["ran"]
    # At N = 4: ZeRO-1 (8 + 8/4) = 10, ZeRO-2 and ZeRO-3 16/4 = 4, not the 12 and 8 of N = 2.
    assert facts["memory"] == (
        "DDP 16.00 against 16.00, agrees; ZeroRedundancyOptimizer (ZeRO-1) 12.51 against "
        "10.00, 25.1% above (the split the implementation makes gives 12.51: agrees); "
        "fully_shard, no reshard after forward 4.00 against 4.00, agrees; fully_shard (ZeRO-3) "
        "4.00 against 4.00, agrees"
    )
    # Every sharded strategy against DDP (the course asks for each), the most sharded last.
    r = stats.ratio(STEPS["none"], STEPS["full"])
    assert facts["step"].startswith("ZeroRedundancyOptimizer (ZeRO-1) 0.8")
    assert facts["step"].endswith(
        f"; fully_shard (ZeRO-3) {r.value:.2f}× ({r.low:.2f}–{r.high:.2f}×; "
        "32.7 ± 4.3 vs 15.00 ± 0.25 ms), slower"  # not "15 ± 0.248"
    )


def test_d4_a_state_off_the_closed_form_disagrees_and_a_missing_ddp_is_said(tmp_path):
    rows = [r for r in shard_rows(n=2, zero1_state=11.0) if r["strategy"] != "none"]
    rows.append({"device": "cuda", "processes": 2, "strategy": "none", "stage": "DDP",
                 "status": "failed", "reason": "out of memory"})  # fmt: skip
    _, facts = facts_of("sharding", {"status": "failed", "rows": rows}, tmp_path)
    assert "ZeroRedundancyOptimizer (ZeRO-1) 11.00 against 12.00, 8.3% below" in facts["memory"]
    assert facts["ran"].startswith(
        "DDP (DistributedDataParallel) not measured here, as it failed: out of memory"
    )
    assert facts["step"] == "not measured here, as DDP did not run on 2 GPU ranks"


def test_d4_on_a_host_without_gpus_is_not_measured_when_every_row_was_skipped(tmp_path):
    rows = [{"device": "cuda", "processes": 2, "strategy": s, "stage": STAGES[s],
             "status": "skipped", "reason": "needs 2 CUDA GPUs, this host has 0"}
            for s in STAGES]  # fmt: skip
    with pytest.raises(NotMeasured, match="needs 2 CUDA GPUs, this host has 0"):
        facts_of("sharding", {"status": "skipped", "rows": rows}, tmp_path)


# --------------------------------------------------------------------------- B4 and C
@pytest.fixture
def b4(tmp_path, tabular_dir):
    """The profiler on the CPU, 3 repeats: (summary, folder)."""
    cfg = {"title": "B4", "batches": 4, "batch_size": 8, "warmup_batches": 1, "repeats": 3,
           "activations": ["relu", "gelu"], "hidden": 32, "seed": 0}  # fmt: skip
    folder = tmp_path / "b4"
    return runner.run_study("profiler", cfg, folder, data_dir=tabular_dir), folder


@pytest.fixture
def c(tmp_path, monkeypatch):
    """The fused-kernel study with its GPU modes as CPU baselines, so that the comparison runs
    on a host without CUDA: (summary, folder)."""
    from dmls.data import datasets
    from dmls.special import fused_conv

    data = tmp_path / "images"
    datasets.prepare("synthetic_cifar", {"n_train": 64, "n_test": 32, "seed": 0}, data)
    for name in ("cudnn", "fused"):
        mode = fused_conv.Mode("cpu", fused=False, cudnn=True, title=name)
        monkeypatch.setitem(fused_conv.MODES, name, mode)
    cfg = {"title": "C", "dataset": "synthetic_cifar", "depths": [2, 4], "channels": 4,
           "fc_hidden": 8, "modes": ["cudnn", "fused", "cpu"], "epochs": 1, "batch_size": 16,
           "lr": 0.001, "warmup_steps": 1, "timed_steps": 3, "train_samples": 64,
           "test_samples": 32, "tf32": False, "seed": 0, "repeats": 3, "accuracy_seeds": 2,
           "accuracy_modes": ["cudnn", "fused"]}  # fmt: skip
    folder = tmp_path / "c"
    return runner.run_study("fused_conv", cfg, folder, data_dir=data), folder


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


# --------------------------------------------------------------------------- D6
# What pyspark 4.3.0 measured per action (tests/test_spark_lazy.py runs Spark itself): jobs,
# stages run, skipped, tasks, rows scanned, the jobs' stages.
SPARK = {
    ("no cache", "count()"): (2, 2, 1, 3, "Scan ExistingRDD=3",
                              "job 0: stage 0 ran 2 task(s); job 1: stage 1 skipped (2 task(s)), "
                              "stage 2 ran 1 task(s)"),
    ("no cache", "renamed_df_2nd.collect()"): (1, 1, 0, 2, "Scan ExistingRDD=3",
                                               "job 2: stage 3 ran 2 task(s)"),
    ("no cache", "renamed_df.collect()"): (1, 1, 0, 2, "Scan ExistingRDD=3",
                                           "job 3: stage 4 ran 2 task(s)"),
    ("cache", "count()"): (3, 3, 1, 5, "InMemoryTableScan=2; Scan ExistingRDD=3",
                           "job 4: stage 5 ran 2 task(s); job 5: stage 6 ran 2 task(s); "
                           "job 6: stage 7 skipped (2 task(s)), stage 8 ran 1 task(s)"),
    ("cache", "renamed_df_2nd.collect()"): (1, 1, 0, 2, "InMemoryTableScan=2; Scan ExistingRDD=0",
                                            "job 7: stage 9 ran 2 task(s)"),
    ("cache", "renamed_df.collect()"): (1, 1, 0, 2, "Scan ExistingRDD=3",
                                        "job 8: stage 10 ran 2 task(s)"),
}  # fmt: skip
OPTIMIZED = """== Optimized Logical Plan ==
Project [Name#4, Age#5L, (Age#5L + 15) AS AgeAfterFiftheenYears#7L]
+- Filter (isnotnull(Age#5L) AND (Age#5L > 26))
   +- LogicalRDD [Name#4, Age#5L], false

== Physical Plan ==
"""


def spark_summary():
    """A D6 summary as the study writes it, with the counts measured (SPARK)."""
    from dmls.special import spark_lazy

    rows = []
    for variant in spark_lazy.VARIANTS:
        for line, (code, kind) in enumerate(spark_lazy.program(variant), start=1):
            measured = next((v for (var, end), v in SPARK.items()
                             if var == variant and code.endswith(end)), None)  # fmt: skip
            jobs, run, skipped, tasks, scanned, stages = measured or (0, 0, 0, 0, "", "")
            rows.append({"variant": variant, "line": line, "code": code, "kind": kind,
                         "jobs": jobs, "stages_run": run, "stages_skipped": skipped,
                         "tasks": tasks, "rows_scanned": scanned, "job_stages": stages,
                         "status": "ok", "reason": None})  # fmt: skip
    return {
        "status": "ok",
        "rows": rows,
        "plans": {"no cache": {"renamed_df_2nd": OPTIMIZED}},
        "convert_to_local_relation": {"no cache": {"effective_runs": 0, "runs": 7}},
        "control": {"status": "ok", "jobs": 0, "stages_run": 0, "stages_skipped": 0, "tasks": 0},
    }


def test_d6_names_the_lines_that_start_jobs_and_what_collect_after_count_recomputes(tmp_path):
    case, facts = facts_of("spark_lazy", spark_summary(), tmp_path)
    assert case == "measured"
    assert facts["actions"] == (
        "renamed_df_2nd.count(): 2 jobs; renamed_df_2nd.collect(): 1 job; renamed_df.collect(): "
        "1 job"
    )
    assert facts["idle"] == "12 lines" and facts["defines"].startswith("createDataFrame of a")
    assert facts["order"] == "renamed_df_2nd, then renamed_df"
    assert facts["count_stages"] == "job 0: stage 0 ran; job 1: stage 1 skipped, stage 2 ran"
    assert facts["again"] == (
        "ran the chain again from its source (1 job: Scan ExistingRDD read 3 rows)"
    )
    assert facts["cached_again"].startswith("read the cached rows, not the source")
    assert facts["optimized"] == (
        "Project [Name, Age, (Age + 15) AS AgeAfterFiftheenYears] over "
        "Filter (isnotnull(Age) AND (Age > 26)) over LogicalRDD [Name, Age]"
    )
    assert facts["folded"] == "ConvertToLocalRelation folded nothing (0 effective runs)"
    assert facts["control"].startswith("0 jobs")


def test_d6_without_spark_answers_not_measured_with_the_command_that_installs_it(tmp_path):
    from dmls.special import spark_lazy

    reason = spark_lazy.missing_dependencies({"PATH": str(tmp_path)})[-1]
    summary = {"status": "skipped", "rows": spark_lazy._unmeasured("skipped", reason)}
    sentences = answer("spark_lazy", summary, tmp_path)
    assert sentences == [
        f"Spark's lazy evaluation: not measured here, as it was skipped: {reason}."
    ]
    assert "apt-get install openjdk-17-jre-headless" in sentences[0]


# --------------------------------------------------------------------------- templates
@pytest.fixture
def every_case(lenet, spare, b4, c, tmp_path):
    """(study, case, facts) for every case of every study."""
    out = []

    def add(name, summary, folder, edit=None):
        summary = json.loads(json.dumps(summary))
        if edit:
            edit(summary)
        case, facts = facts_of(name, summary, folder)
        out.append((name, case, facts))

    add("lenet_memory", *lenet)
    add("lenet_memory", *lenet, edit=lambda s: s.update(
        estimate=[e for e in s["estimate"] if e["recompute"] != "full"]))  # fmt: skip
    add("spare_failure", *spare)
    add("spare_failure", *spare, edit=lambda s: _doctor(s["rows"][0]))
    add("spare_failure", *spare, edit=lambda s: [_doctor(r) for r in s["rows"][:3]])
    d3 = runner.run_study("float32_bytes", {"title": "D3", "value": 6.342e-5}, tmp_path)
    add("float32_bytes", d3, tmp_path)
    add("float32_bytes", d3, tmp_path, edit=lambda s: s["rows"][0].update(round_trip_exact=False))
    add("graphs", {"status": "ok", "rows": graph_rows(), "control_flow": CONTROL}, tmp_path)
    summary = {"status": "ok", "rows": sweep_rows(), "course_gradient_bytes": GRADIENT}
    add("collectives", summary, tmp_path)
    add("collectives", summary | {"rows": sweep_rows(nccl=False)}, tmp_path)
    add("sharding", {"status": "ok", "rows": shard_rows()}, tmp_path)
    add("profiler", *b4)
    add("fused_conv", *c)
    add("spark_lazy", spark_summary(), tmp_path)
    d7 = runner.run_study("serialization", {"title": "D7"}, tmp_path / "d7")
    add("serialization", d7, tmp_path / "d7")
    return out


def test_every_template_fills_from_its_cases_facts_and_uses_every_fact(every_case):
    seen = {name: set() for name in TEMPLATES}
    for name, case, facts in every_case:
        seen[name].add(case)
        used = set().union(*(fields(t) for t in templates(name, case)))
        assert used == set(facts), (name, case, used ^ set(facts))
        for t in templates(name, case):
            t.format(**facts)
    assert seen == CASES


def test_the_templates_cover_every_case_hold_no_number_and_say_at_most_three_sentences():
    assert set(TEMPLATES) == set(STUDIES) == set(CASES)
    for name, entries in TEMPLATES.items():
        assert len(entries) <= 3, name
        assert len({e["topic"] for e in entries}) == 1, name
        for e in entries:
            says = e["say"].values() if isinstance(e["say"], dict) else [e["say"]]
            if isinstance(e["say"], dict):
                assert set(e["say"]) == CASES[name], name
            for say in says:
                prose = re.sub(r"\{[^}]*\}", "", say)
                # (A digit inside a name, as in LeNet-5 or fp32, is no number.)
                assert not re.search(r"(?<![\w-])\d", prose), (name, say)
                assert prose.count(". ") == 0 and say.endswith("."), (name, say)


def test_every_special_section_says_what_it_ran_on():
    """Before: B4, C, D1–D7 and A5 explained had no visible "Ran on" line."""
    from dmls.report import special

    host = {"hostname": "h", "gpus": ["NVIDIA H200"], "cpu_model": "Xeon"}
    c = {"config": {"dataset": "fashion_mnist", "train_samples": 2000, "epochs": 2,
                    "repeats": 3}, "host": host,
         "rows": [{"mode": "cudnn", "status": "ok"}, {"mode": "cpu", "status": "ok"}]}  # fmt: skip
    assert special.provenance(c) == (
        "Ran on Fashion-MNIST, 2,000 training samples, 2 epochs; 3 repeats; NVIDIA H200 (GPU) "
        "and the CPU (Xeon)."
    )
    d1 = {
        "config": {"steps": 2},
        "host": host | {"gpus": []},
        "rows": [{"device": "cpu", "status": "ok"}, {"device": "cuda", "status": "skipped"}],
    }
    repeats = STUDIES["lenet_memory"].repeats
    assert special.provenance(d1, repeats) == "Ran on 2 steps; the CPU (Xeon)."
    synthetic = {"config": {"dataset": "synthetic_cifar"}, "host": host,
                 "rows": [{"device": "cuda", "status": "ok"}]}  # fmt: skip
    assert special.provenance(synthetic) == (
        "Ran on SYNTHETIC CIFAR-shaped images; NVIDIA H200 (GPU)."
    )
    # A study that computes on no device of its own (D2, D3, D6) names the machine, so that D6,
    # run where Java is, is told apart from the GPU host of the same hostname.
    arithmetic = {"config": {}, "rows": [{"status": "ok"}]}
    gpu_host = host | {"cpu_count": 64, "gpus": ["NVIDIA H200"] * 4}
    assert special.provenance(arithmetic | {"host": gpu_host}) == (
        "Ran on host h (64 cores of Xeon; 4× NVIDIA H200)."
    )
    assert special.provenance(arithmetic | {"host": host | {"cpu_count": 2, "gpus": []}}) == (
        "Ran on host h (2 cores of Xeon; no GPU)."
    )


def test_c_names_every_mode_timed_only_and_no_mode_whose_accuracy_failed():
    from dmls.special.fused_conv import TIMED_ONLY
    from dmls.special.fused_conv_spec import Measured

    rows = [
        {"depth": 2, "mode": "cudnn", "status": "ok", "accuracy_reason": None},
        {"depth": 2, "mode": "fused", "status": "ok", "accuracy_reason": TIMED_ONLY},
        {"depth": 2, "mode": "cpu", "status": "failed",
         "accuracy_reason": "accuracy seed 0 (1/3): RuntimeError: out of memory"},
    ]  # fmt: skip
    assert Measured(rows, {}).timed_only() == (
        "the mode fused was timed only, not trained for accuracy (the config's accuracy_modes)"
    )


def test_d4_gives_each_ranks_peak_and_says_why_an_n_the_course_asks_for_did_not_run(tmp_path):
    """The example's D4 line listed what ran, its peaks per rank sat in a closed note, and why
    N = 4 was not run went unsaid."""
    rows = [r | {"peak_allocated_bytes": 2**30 * (9 - 2 * k),
                 "peak_predicted_bytes": 2**30 * (9 - 2 * k) - 2**26}
            for k, r in enumerate(shard_rows(n=2)[:4])]  # fmt: skip
    summary = {"status": "ok", "rows": rows, "config": {"processes": [2]}}
    _, facts = facts_of("sharding", summary, tmp_path)
    assert facts["ns"] == (
        "N = 2 only (N = 4 not run: this config's special_studies.sharding.processes is [2])"
    )
    assert (
        "DDP 16.00 against 16.00, agrees, its peak 9.00 GiB (predicted 8.94 GiB)"
        in (facts["memory"])
    )
    assert facts["step"].count("× (") == 3  # every sharded strategy against DDP


def test_a_special_answers_brief_drops_the_means_and_gives_a_reason_once():
    """The brief is rendered from the same facts (dmls.report.phrases), not edited from the
    whole answer: a ratio without its means, a repeated reason 'as above' in both."""
    entries = [
        {"topic": "steps", "say": "Steps: {steps}."},
        {"topic": "first calls", "say": "First calls: {first}."},
    ]
    gpu = sa.not_measured("it was skipped: no CUDA device on this host")

    def facts(summary, folder):
        steps = "on the CPU " + sa.speed([2.0, 2.1, 1.9], [1.0, 1.1, 0.9], "1 vs 2 ms") + "; "
        return "measured", {"steps": steps + "on the GPU " + gpu, "first": "on the GPU " + gpu}

    whole, brief = sa.special_answer(entries, facts, {}, Path("."))
    value, interval = ratio_strings(stats.ratio([2.0, 2.1, 1.9], [1.0, 1.1, 0.9]))
    assert whole[0].startswith(f"Steps: on the CPU {value} ({interval}; 1 vs 2 ms), faster; ")
    assert brief[0].startswith(f"Steps: on the CPU {value} ({interval}), faster; ")
    for said in (whole, brief):
        assert said[0].endswith("on the GPU not measured here, as it was skipped: no CUDA device "
                                "on this host.")  # fmt: skip
        assert said[1] == "First calls: on the GPU not measured here (as above)."


def test_a_phrase_is_never_flattened_by_a_format():
    """A fact with parts can't be written into an f-string or str.join by mistake: the means
    or the reason would then be text that only a regex could take out again."""
    phrase = sa.not_measured("no GPU")
    with pytest.raises(TypeError):
        f"{phrase}"
    with pytest.raises(TypeError):
        "; ".join([phrase])
