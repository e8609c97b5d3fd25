"""The D studies' answers (dmls.report.special_answers): each facts function against a
summary whose numbers are known, real ones for the cheap studies (D1, D2 and D3, run here
on the CPU) and built ones, with the GPU rows a CPU host can't make, for D5, D4 and D6; and
what each says when its rows were skipped or failed."""

import json

import pytest

from dmls import stats
from dmls.report.comparisons import NotMeasured
from dmls.special import runner
from dmls.special.sharding.measure import STAGES
from special_fixtures import (
    CONTROL,
    EAGER,
    MODE,
    SKIPPED_GPU,
    STEPS,
    _doctor,
    answer,
    facts_of,
    graph_rows,
    shard_rows,
    spark_summary,
)


# --------------------------------------------------------------------------- D1
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
def written(summary, folder):
    """`summary` as the runner writes it (through JSON), in `folder`."""
    (folder / "summary.json").write_text(json.dumps(summary))
    return json.loads((folder / "summary.json").read_text())


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


# --------------------------------------------------------------------------- D4
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


# --------------------------------------------------------------------------- D6
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
    from dmls.special.spark_lazy import measure as spark_lazy

    reason = spark_lazy.missing_dependencies({"PATH": str(tmp_path)})[-1]
    summary = {"status": "skipped", "rows": spark_lazy._unmeasured("skipped", reason)}
    sentences = answer("spark_lazy", summary, tmp_path)
    assert sentences == [
        f"Spark's lazy evaluation: not measured here, as it was skipped: {reason}."
    ]
    assert "apt-get install openjdk-17-jre-headless" in sentences[0]
