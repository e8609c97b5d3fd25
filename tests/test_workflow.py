"""The Snakemake DAG itself: dry run, lint, formatting, and the .test config end to end."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import EXPECTED_RUNS, ROOT

BIN = Path(sys.executable).parent
EXPECTED_TRAIN_JOBS = sum(EXPECTED_RUNS.values())


def snakemake(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_dry_run_of_the_default_config_plans_every_run():
    out = snakemake("-n", "--cores", "4", "--forceall")
    assert out.returncode == 0, out.stderr
    counts = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert counts["train"] == EXPECTED_TRAIN_JOBS
    assert counts["prepare_data"] == 2  # cifar10 and tabular
    assert counts["aggregate_runs"] == 1


def test_a_bad_config_stops_snakemake_before_any_job_with_the_key_and_what_is_allowed(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("studies:\n  optimizer: {runs: {lamb: {optimizer: {name: lamb}}}}\n")
    out = snakemake("--cores", "1", "--configfile", str(bad), "--config", f"results_dir={tmp_path}")
    assert out.returncode == 1
    assert (
        "invalid run spec:\n  studies.optimizer.runs.lamb.optimizer.name: 'lamb' is not "
        "allowed; allowed: sgd, adam, adamw, rmsprop\n"
    ) in out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]  # no job ran


def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


def test_snakefmt_and_ruff_are_clean():
    files = ["Snakefile", *map(str, sorted((ROOT / "rules").glob("*.smk")))]
    fmt = subprocess.run(
        [str(BIN / "snakefmt"), "--check", *files], cwd=ROOT, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stderr
    for args in (["check"], ["format", "--check"]):
        ruff = subprocess.run(
            [str(BIN / "ruff"), *args, "."], cwd=ROOT, capture_output=True, text=True
        )
        assert ruff.returncode == 0, ruff.stdout + ruff.stderr


@pytest.mark.e2e
def test_the_test_config_runs_end_to_end(tmp_path):
    results = tmp_path / "results"
    out = snakemake(
        "--cores", "2", "--configfile", ".test/config.yaml", "--config", f"results_dir={results}",
        timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-5000:]
    runs = pd.read_csv(results / "runs.csv")
    assert len(runs) == EXPECTED_TRAIN_JOBS
    assert runs["status"].notna().all()
    status = dict(zip(runs["study"] + "/" + runs["run"], runs["status"], strict=True))
    # What a CPU host can't do is skipped, with the reason; everything else ran.
    skipped = {
        "parallelism/dataparallel_2gpu", "precision/fp8", "backend/nccl_b32", "backend/nccl_b128",
        "cluster_precision/fp8_n1xp1", "cluster_precision/fp8_n1xp2",
    }  # fmt: skip
    assert {k for k, v in status.items() if v == "skipped"} == skipped
    assert {k for k, v in status.items() if v != "skipped"} == set(status) - skipped
    assert set(runs.loc[~runs["status"].eq("skipped"), "status"]) == {"ok"}
    ok = runs[runs["status"] == "ok"]
    metric_columns = ["train_loss", "train_accuracy", "test_loss", "test_accuracy",
                      "train_time_s", "samples_per_s", "peak_host_rss_bytes"]  # fmt: skip
    assert ok[metric_columns].notna().all().all()
    assert ok["test_accuracy"].between(0, 1).all() and (ok["train_time_s"] > 0).all()
    assert ok["data_synthetic"].all()  # the .test config only uses synthetic data
    # Skipped runs carry their reason and no numbers.
    skip = runs[runs["status"] == "skipped"]
    assert skip["reason"].str.len().gt(20).all() and skip["test_accuracy"].isna().all()
    assert "nccl" in runs.set_index("run").loc["nccl_b32", "reason"]
    # The emulated 2×2 grid really ran 4 processes over 2 node agents.
    grid = runs[(runs["study"] == "cluster_torchrun") & (runs["run"] == "n2xp2")].iloc[0]
    assert grid["processes"] == 4 and bool(grid["nodes_emulated"])
    # The B3 fp16 run through accelerate on a CPU is honest about what it computed in.
    b3 = runs[(runs["study"] == "cluster_precision") & (runs["run"] == "fp16_n1xp1")].iloc[0]
    assert b3["effective_precision"] == "fp32"
    run_dir = results / "runs" / "parallelism" / "ddp_2gpu"
    assert (run_dir / "history.csv").exists() and (run_dir / "model.pt").exists()
    assert "epoch 2/2" in (run_dir / "train.log").read_text()
