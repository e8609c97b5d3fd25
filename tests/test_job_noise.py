"""A speed between two runs, each its own job, is a finding only beyond what two jobs of
identical settings differed by (the DAG's A/A jobs): seeds within one job can't see what varies
between jobs. Issue #53's second report: B2's "1 × 1 1.27× (1.04–1.56×), faster" beside B3's
byte-identical job at 0.72× of it."""

import pytest
import yaml

from conftest import ROOT
from dmls import stats
from dmls.config.studies import identical_runs
from dmls.report import observations, quantities
from dmls.report.study import Study
from fake_runs import fake_metrics


def test_jobs_noise_is_the_largest_ratio_between_identical_jobs():
    noise = stats.job_noise([[100.0, 72.0], [50.0, 51.0, 50.5], [7.0]])
    assert noise.largest == 100 / 72 and noise.jobs == 5
    assert stats.job_noise([[3.0]]) is None


def test_a_speed_between_jobs_is_a_finding_only_beyond_the_aa_jobs():
    a, b = [127.0, 120.0, 134.0], [100.0, 98.0, 102.0]  # (1.27×, seeds' interval above 1)
    assert stats.ratio(a, b).finding == stats.MORE
    # Identical jobs differed by 1.39× (B3's fp32_n1xp1 at 0.72× B2's n1xp1): no finding.
    wide = stats.across_jobs(a, b, stats.JobNoise(1 / 0.72, 2))
    assert wide.finding == stats.NO_EFFECT
    assert wide.verdict("faster", "slower") == "within job noise"
    # The same ratio where identical jobs differed by 2%: beyond it, a finding.
    assert stats.across_jobs(a, b, stats.JobNoise(1.02, 2)).finding == stats.MORE
    # No A/A jobs: no verdict, and it says why.
    untold = stats.across_jobs(a, b, None)
    assert untold.finding == stats.TOO_FEW and untold.has_interval
    assert untold.verdict("faster", "slower").startswith("no verdict: no two jobs of identical")
    # A speed-up against the ideal moves the band with the null.
    moved = wide.against(2.0)
    assert moved.band == (2 * 0.72, 2 / 0.72)


def test_identical_jobs_are_grouped_by_what_ran_and_where():
    one = fake_metrics("n1xp1", study="cluster_accelerate", epochs=2, samples_per_s=100.0)
    twin = fake_metrics("fp32_n1xp1", study="cluster_precision", epochs=2, samples_per_s=72.0)
    other = fake_metrics("n1xp2", study="cluster_accelerate", epochs=2, batch_size=64)
    cpu = fake_metrics("n1xp1_cpu", study="cluster_precision", epochs=2)
    cpu["derived"]["device"] = "cpu"
    groups = quantities.identical_jobs([one, twin, other, cpu])
    assert [[m["run"] for m in g] for g in groups] == [["n1xp1", "fp32_n1xp1"]]
    noise = quantities.job_noise([one, twin, other, cpu])
    assert list(noise) == ["cuda"] and noise["cuda"].largest == pytest.approx(100 / 72)
    assert noise["cuda"].labels == (("cluster_accelerate/n1xp1", "cluster_precision/fp32_n1xp1"),)


def test_the_report_judges_speeds_against_the_aa_jobs_and_says_so():
    runs = [
        fake_metrics("single_gpu", launcher="single", epochs=3, spread=(0.98, 1.0, 1.02)),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1270.0,
                     epochs=3, spread=(0.98, 1.0, 1.02)),
    ]  # fmt: skip
    noise = {"cuda": stats.JobNoise(1 / 0.72, 2, (("b/n1xp1", "c/fp32_n1xp1"),))}
    study = Study.from_metrics("parallelism", {}, runs, job_noise=noise)
    lines = observations.all_observations(study)
    said = "job noise, what two jobs of identical settings differed by: 38.9% at most, among "
    assert any(f"{said}b/n1xp1 and c/fp32_n1xp1" in line for line in lines), lines
    [versus] = observations.versus_baseline(study)
    assert "within job noise" in versus, versus
    bare = Study.from_metrics("parallelism", {}, runs)
    assert any(line.startswith("Speeds between runs on GPUs have no verdict") for line in
               observations.all_observations(bare))  # fmt: skip
    assert "no verdict: no two jobs of identical settings" in observations.versus_baseline(bare)[0]


def test_the_dag_reads_the_aa_jobs_it_already_has():
    """The default config's runs that repeat another's settings: what every section reads
    (rules/common.smk IDENTICAL_RUNS)."""
    from snakemake.utils import validate

    from dmls.config.spec import resolve_runs

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(config, str(ROOT / "config" / "schemas" / "config.schema.yaml"), set_default=True)
    runs = resolve_runs(config)
    found = set(identical_runs({k: v.to_dict() for k, v in runs.items()}))
    assert {"cluster_accelerate/n1xp1", "cluster_precision/fp32_n1xp1", "parallelism/ddp_2gpu",
            "batch_size/b32", "grad_accumulation/accum1"} <= found  # fmt: skip
    assert "parallelism/single_gpu" not in found
