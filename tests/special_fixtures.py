"""What the tests of the special studies' answers (tests/test_special_answers*.py) share:
the answers' templates, a study's facts written in full and its answer, D2's doctored
row, and summaries built with the GPU rows a CPU host can't make (D5 `graph_rows`, A5
`sweep_rows`, D4 `shard_rows`, D6 `spark_summary`). The studies run here on the CPU (D1
`lenet`, D2 `spare`, B4 `b4`, C `c`) are fixtures in conftest.py."""

import yaml

from conftest import ROOT
from dmls import stats
from dmls.report import special_answers as sa
from dmls.report.phrases import full
from dmls.special.catalog import STUDIES
from dmls.special.sharding.measure import STAGES

# The `answer:` blocks proposed for report/studies.yaml, per special section.
# The answers' templates as the report uses them: report/studies.yaml's special sections.
TEMPLATES = {
    section["special"]: section["answer"]
    for section in yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())["sections"]
    if "special" in section and section.get("answer")
}


SKIPPED_GPU = {"status": "skipped", "reason": "no CUDA device on this host"}


def facts_of(name, summary, folder):
    """A study's case and facts, each fact written in full."""
    case, facts = STUDIES[name].facts(summary, folder)
    return case, {key: full(value) for key, value in facts.items()}


def answer(name, summary, folder):
    return sa.special_answer(TEMPLATES[name], STUDIES[name].facts, summary, folder)[0]


# --------------------------------------------------------------------------- D2
def _doctor(row):
    """Move a row's Monte Carlo interval off its closed form."""
    row.update(monte_carlo=row["closed_form"] + 0.5, ci_low=row["closed_form"] + 0.4,
               ci_high=row["closed_form"] + 0.6)  # fmt: skip


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


# --------------------------------------------------------------------------- D4
P = 476_260_352
STEPS = {"none": [14.9, 15.0, 15.1], "optimizer": [18.2, 18.3, 18.2],
         "gradients": [25.0, 26.1, 27.2], "full": [31.0, 32.7, 34.5]}  # fmt: skip


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
    from dmls.special.spark_lazy import measure as spark_lazy

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
