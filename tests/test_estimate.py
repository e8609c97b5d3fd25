"""How long the DAG takes here, said when it starts (issue #41): costs calibrated from a
results folder (tools/calibrate_costs.py), scaled to a run's settings and packed onto the host
as Snakemake starts jobs (dmls/supervisor/estimate.py)."""

import importlib.util
import json

import pytest
import yaml

from conftest import ROOT, make_spec
from dmls.config.spec import load_schema
from dmls.supervisor.estimate import (
    LIKENESS,
    RUN_COSTS,
    Job,
    duration,
    estimate,
    pack,
    run_costs,
    run_seconds,
    said,
    samples,
)
from dmls.supervisor.hardware import Host

SCHEMA = load_schema()
CPU_HOST = Host("box", 2, (), (), False)
GPU_HOST = Host("gpu", 16, ("H200",), ((9, 0),), True)


def calibrate_module():
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "tools/calibrate_costs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job(jobid, seconds_name="x", threads=1, gpus=0, priority=0, needs=()):
    return Job(jobid, "rule", seconds_name, threads, gpus, priority, tuple(needs))


def test_jobs_pack_onto_the_cores_and_gpus_in_order_of_priority_after_what_they_need():
    seconds = {1: 10.0, 2: 10.0, 3: 10.0, 4: 5.0}
    # Two cores, three 1-core jobs: two at once, then the third.
    assert pack([job(1), job(2), job(3)], seconds, cores=2, gpus=None) == 20.0
    # A job that needs another starts when it ends.
    assert pack([job(1), job(2, needs=[1])], seconds, cores=4, gpus=None) == 20.0
    # A need outside the jobs to run is done already (an up-to-date output).
    assert pack([job(2, needs=[99])], seconds, cores=1, gpus=None) == 10.0
    # One GPU: GPU jobs take turns while a CPU job runs beside them.
    gpu_jobs = [job(1, gpus=1), job(2, gpus=1), job(4)]
    assert pack(gpu_jobs, seconds, cores=4, gpus=1) == 20.0
    # GPUs not scheduled (isolation none): they all start at once.
    assert pack(gpu_jobs, seconds, cores=4, gpus=None) == 10.0
    # The longest first: a 30 s job of high priority starts at once, the short ones beside it.
    long_first = {1: 30.0, 2: 10.0, 3: 10.0, 4: 10.0}
    jobs = [job(2), job(3), job(4), job(1, priority=40)]
    assert pack(jobs, long_first, cores=2, gpus=None) == 30.0
    # Asking for more cores than the host has: it takes them all.
    assert pack([job(1, threads=8), job(2)], seconds, cores=2, gpus=None) == 20.0


def record(seeds=2, epochs=3, first=5.0, steady=1.0, evaluate=0.2, job_s=40.0):
    """A finished run's metrics.json, as much of it as calibration reads: every epoch after a
    seed's first trains in `steady` s, the first seed's first epoch in `first`."""
    history = [
        [{"train_time_s": (first if (s == 0 and e == 0) else steady), "eval_time_s": evaluate}
         for e in range(epochs)]
        for s in range(seeds)
    ]  # fmt: skip
    seed_list = [
        {"status": "ok", "history": h,
         "timing": {"setup_s": 0.5, "checkpoint_time_s": 0.1 * epochs,
                    "fit_s": 0.5 + sum(x["train_time_s"] + x["eval_time_s"] for x in h)
                    + 0.1 * epochs}}
        for h in history
    ]  # fmt: skip
    spec = make_spec(seeds=seeds, epochs=epochs, train_samples=1000).to_dict()
    return {"study": "t", "run": "r", "status": "ok", "seeds": seed_list, "spec": spec,
            "derived": {"device": "cpu", "processes": 1},
            "data": {"n_train": 1000, "n_test": 400, "n_validation": 100}}, job_s  # fmt: skip


def test_costs_calibrated_from_a_run_give_back_its_own_time_and_scale_with_its_settings():
    calibrate = calibrate_module()
    rec, job_s = record()
    costs = calibrate.run_costs(rec, job_s)
    assert set(RUN_COSTS) | set(LIKENESS) <= set(costs)  # what the estimate reads
    assert costs["first_warmup_s"] == 4.0 and costs["train_s_per_sample"] == 0.001
    assert costs["eval_s_per_sample"] == 0.2 / 500 and costs["checkpoint_s"] == 0.1
    spec = make_spec(seeds=2, epochs=3, train_samples=1000, validation_samples=100)
    assert run_seconds(spec, costs, 1000, 500) == pytest.approx(job_s)
    # Twice the samples, twice the epochs, one more seed: each part scales as it should.
    more = make_spec(seeds=3, epochs=6, train_samples=2000, validation_samples=100)
    fixed = job_s - sum(s["timing"]["fit_s"] for s in rec["seeds"])
    expect = fixed + 3 * 0.5 + 4.0 + 3 * 6 * (2000 * 0.001 + 500 * 0.0004 + 0.1)
    assert run_seconds(more, costs, 2000, 500) == pytest.approx(expect)


def test_a_runs_samples_are_what_the_config_fixes_less_the_validation_split():
    spec = make_spec(dataset="cifar10", train_samples=0, test_samples=0, validation_samples=5000)
    assert samples(spec, {}, SCHEMA, {}) == (45_000, 15_000)
    capped = make_spec(dataset="synthetic_cifar", train_samples=400, validation_samples=0)
    assert samples(capped, {}, SCHEMA, {}) == (400, 256)  # the synthetic set's n_test
    own = make_spec(dataset="tabular", train_samples=0, test_samples=0, validation_samples=0)
    data = {"data": {"tabular": {"dir": "/mine"}}}
    assert samples(own, data, SCHEMA, {"n_train": 7, "n_test": 3}) == (7, 3)  # as measured


def test_a_run_not_measured_takes_the_costs_of_the_runs_most_like_it():
    base = {"fixed_s": 1.0, "seed_s": 0.0, "first_warmup_s": 0.0, "eval_s_per_sample": 0.0,
            "checkpoint_s": 0.0, "device": "cpu", "launcher": "single", "processes": 1,
            "step": "eager", "loader": "device", "precision": "fp32"}  # fmt: skip
    measured = {
        "a/eager": base | {"train_s_per_sample": 1.0},
        "a/graph": base | {"train_s_per_sample": 3.0, "step": "graph"},
        "a/torchrun": base | {"train_s_per_sample": 9.0, "launcher": "torchrun"},
    }
    spec = make_spec(device="cpu", launcher="single", step="eager", precision="bf16")
    costs, basis = run_costs(spec, CPU_HOST, measured)
    assert basis == "similar" and costs["train_s_per_sample"] == 1.0  # device..step agree
    mine = make_spec(study="a", run="graph", device="cpu")
    assert run_costs(mine, CPU_HOST, measured) == (measured["a/graph"], "measured")


def test_the_estimate_says_what_it_rests_on_and_its_longest_jobs():
    spec = make_spec(study="t", run="r", device="cpu", seeds=1, epochs=1, train_samples=100,
                     validation_samples=0, test_samples=100)  # fmt: skip
    section = {
        "measured_on": {"host": "the test box"},
        "skipped_job_s": 2.0,
        "rules": {"aggregate_runs": 3.0},
        "studies": {"profiler": {"seconds": 120.0, "settings": {"repeats": 5, "batch": 8}}},
        "runs": {},
    }
    costs = {"cpu": section | {"runs": {"t/other": {
        "device": "cpu", "launcher": "single", "processes": 1, "step": "eager",
        "loader": "device", "precision": "fp32", "fixed_s": 5.0, "seed_s": 0.0,
        "first_warmup_s": 0.0, "train_s_per_sample": 0.1, "eval_s_per_sample": 0.0,
        "checkpoint_s": 0.0}}}}  # fmt: skip
    jobs = [Job(1, "train", "t/r", 1, 0, 2), Job(2, "profiler", "profiler", 1, 0, 40),
            Job(3, "aggregate_runs", "aggregate_runs", 1, 0, 0, (1, 2)),
            Job(4, "mystery", "mystery", 1, 0, 0)]  # fmt: skip
    config = {"special_studies": {"profiler": {"repeats": 2, "batch": 8}}}
    est, _ = estimate(jobs, {"t/r": spec}, CPU_HOST, 2, None, costs, config, SCHEMA)
    assert est.seconds == {1: 15.0, 2: 120.0, 3: 3.0, 4: 0.0}
    assert est.changed == {"profiler": ["repeats"]}
    assert est.basis == {1: "similar", 2: "measured", 3: "rule", 4: "none"}
    assert est.wall_s == 123.0  # the run beside the study, then the aggregation
    text = said(jobs, est, costs["cpu"], 2, None)
    assert text.startswith(
        "Estimated time for these 4 jobs here: about 2 min (an estimate, not"
        " a measurement: each job's time as measured on the test box"
    )
    assert "longest: profiler ~2 min, t/r ~15 s, aggregate_runs ~3 s" in text
    assert "1 run(s) not measured there" in text
    assert "no cost known (counted as 0 s): mystery" in text
    assert (
        "set otherwise than when measured, taken at the measured time: profiler (repeats)" in text
    )
    # A run this host can't train costs a skipped job's time.
    fp8 = make_spec(study="t", run="r", device="cuda", precision="fp8")
    est, _ = estimate(jobs[:1], {"t/r": fp8}, CPU_HOST, 2, None, costs, {}, SCHEMA)
    assert est.seconds == {1: 2.0} and est.basis == {1: "skipped"}
    # A GPU host reads the table's cuda section.
    est, section = estimate(jobs[1:2], {}, GPU_HOST, 2, 1, costs, {}, SCHEMA)
    assert section == {} and est.basis == {2: "none"}
    # (GPUs not scheduled, isolation none, on that GPU host: the line names no host kind wrongly)
    assert said(jobs[1:2], est, section, 2, None).startswith(
        "No estimate of the DAG's time: config/costs.yaml has no costs for a host of this kind"
    )


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (40, 89, 600, 3599, 3600, 7500)] == [
        "40 s", "89 s", "10 min", "1 h 00 min", "1 h 00 min", "2 h 05 min"]  # fmt: skip


def test_the_committed_cost_table_has_both_sections_with_where_they_were_measured():
    costs = yaml.safe_load((ROOT / "config" / "costs.yaml").read_text())
    for name in ("cpu", "cuda"):
        section = costs[name]
        assert section["measured_on"]["host"] and section["runs"] and section["studies"], name
        for run_id, c in section["runs"].items():
            assert c["train_s_per_sample"] > 0 and c["fixed_s"] >= 0, (name, run_id)


def test_a_snakemake_log_gives_each_rules_median_job_seconds(tmp_path):
    log = tmp_path / "x.snakemake.log"
    log.write_text("\n".join([
        "[Sun Nov 29 10:41:07 2026]", "localrule prepare_data:", "    jobid: 72",
        "[Sun Nov 29 10:41:07 2026]", "rule report_study:", "    output: x", "    jobid: 5",
        "[Sun Nov 29 10:41:07 2026]", "localrule graphs:",
        "    output: results/studies/graphs/summary.json, results/studies/graphs/a.csv",
        "    jobid: 6",
        "[Sun Nov 29 10:41:08 2026]", "Finished jobid: 72 (Rule: prepare_data)",
        "[Sun Nov 29 10:41:17 2026]", "Finished jobid: 5 (Rule: report_study)",
    ]))  # fmt: skip
    assert calibrate_module().rule_seconds(log) == (
        {"prepare_data": 1.0, "report_study": 10.0},
        {"graphs"},
    )
    assert json.dumps(calibrate_module().three(0.000123456)) == "0.000123"
