"""What the Snakefile's hooks do (dmls/hooks.py), tested without Snakemake: rules/common.smk only
hands them the workflow, the config and the runs."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from conftest import ROOT
from dmls import hooks


class Resource:
    """A default resource as Snakemake holds one: evaluable (an expression, raw text) or not."""

    def __init__(self, raw=None, value=None):
        self.raw, self.value = raw, value

    def is_evaluable(self):
        return self.raw is not None


@pytest.mark.parametrize(
    ("given", "read"),
    [
        (None, None),
        (Resource(raw="'gpu'"), "gpu"),  # a quoted string
        (Resource(raw="None"), None),  # the profile's unset SBATCH_PARTITION
        (Resource(raw="n1-standard-4"), "n1-standard-4"),  # a bare word, as Snakemake reads it
        (Resource(raw="$DMLS_TEST_PARTITION"), "fromenv"),
        (Resource(raw="lambda wc: wc.x"), None),  # an expression of the job: only it knows
        (Resource(value="short"), "short"),  # already a value
        (Resource(value=""), None),
    ],
)
def test_the_partition_every_job_gets_is_read_as_the_slurm_plugin_hands_it(
    monkeypatch, given, read
):
    monkeypatch.setenv("DMLS_TEST_PARTITION", "fromenv")
    defaults = {} if given is None else {"slurm_partition": given}
    assert hooks.default_submission_resource(defaults, "slurm_partition") == read
    assert hooks.default_submission_resource(None, "slurm_partition") is None


def test_a_second_workflow_on_the_same_results_folder_is_refused_with_the_holder(tmp_path):
    workflow = SimpleNamespace(is_main_process=True, basedir=str(ROOT))
    first = hooks.claim_results_dir(workflow, str(tmp_path))
    try:
        with pytest.raises(hooks.HookError, match=str(tmp_path)):
            hooks.claim_results_dir(workflow, str(tmp_path))
    finally:
        first.close()
    again = hooks.claim_results_dir(workflow, str(tmp_path))  # released: free again
    again.close()
    # A job's process (not the main Snakemake) claims nothing.
    job = SimpleNamespace(is_main_process=False, basedir=str(ROOT))
    assert hooks.claim_results_dir(job, str(tmp_path)) is None


def test_a_data_set_this_host_lacks_is_said_before_any_job(tmp_path):
    def job(rule, dataset=None):
        return SimpleNamespace(rule=SimpleNamespace(name=rule),
                               wildcards=SimpleNamespace(dataset=dataset))  # fmt: skip

    jobs = [job("prepare_data", "cifar10"), job("prepare_data", "cifar10"), job("x")]
    workflow = SimpleNamespace(dag=SimpleNamespace(needrun_jobs=lambda: jobs))
    data = {"cifar10": {"cache_dir": str(tmp_path), "download": False}}
    said = hooks.data_to_download(workflow, data)
    assert len(said) == 1 and said[0].endswith(
        "data.cifar10.download is false: what needs it is skipped with the reason."
    ), said
    # A Snakemake whose scheduler can't be read: nothing said, nothing raised.
    assert hooks.data_to_download(SimpleNamespace(dag=SimpleNamespace()), data) == []


def test_not_under_slurm_the_status_check_is_not_asked():
    workflow = SimpleNamespace(executor_plugin=SimpleNamespace(name="local"))
    assert hooks.check_slurm_status_checks(workflow) is None


def test_under_slurm_without_sbatch_the_hook_says_what_to_run_instead(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    workflow = SimpleNamespace(executor_plugin=SimpleNamespace(name="slurm"))
    with pytest.raises(hooks.HookError, match=r"no Slurm cluster answers here \(sbatch not found"):
        hooks.check_slurm_status_checks(workflow)


def test_the_smk_hooks_hold_no_logic():
    """rules/common.smk hands the hooks their arguments; it imports nothing inside a function
    (what a hook does is dmls/hooks.py's, where ruff and these tests reach it)."""
    text = (ROOT / "rules" / "common.smk").read_text()
    inner = [line for line in text.splitlines() if line.startswith(("    import ", "    from "))]
    assert inner == []


def _fake_sbatch(tmp_path, monkeypatch, stderr: str) -> None:
    """An `sbatch` on PATH that refuses with `stderr` (what Slurm's client prints)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_where_slurms_client_finds_no_cluster_no_partition_is_blamed(tmp_path, monkeypatch):
    """Issue #55 (9): with Slurm's client installed and no controller, `--profile
    profiles/slurm` said "Slurm refuses this workflow's jobs (the cluster's default partition,
    no account) … give a partition"."""
    _fake_sbatch(tmp_path, monkeypatch, "sbatch: fatal: Could not establish a configuration source")
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    workflow = SimpleNamespace(
        executor_plugin=SimpleNamespace(name="slurm"),
        executor_settings=SimpleNamespace(
            status_command="sacct", init_seconds_before_status_checks=40
        ),
        resource_settings=SimpleNamespace(default_resources=None),
    )
    with pytest.raises(hooks.HookError) as err:
        hooks.check_slurm_status_checks(workflow)
    said = str(err.value)
    assert said.startswith(
        "--profile profiles/slurm submits every job to Slurm, but no Slurm cluster answers here "
        "(no Slurm cluster answered `sbatch --test-only`: sbatch: fatal: Could not establish a "
        "configuration source)"
    ), said
    assert "partition" not in said


def test_a_refused_partition_is_to_be_fixed_where_it_was_given(tmp_path, monkeypatch):
    """Issue #55 (9): a partition from --default-resources was advised to be set in
    SBATCH_PARTITION, which the user hadn't used."""
    from dmls.supervisor.slurm import submission_problem

    _fake_sbatch(tmp_path, monkeypatch, "sbatch: error: invalid partition specified: nosuch")
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    assert submission_problem(partition="nosuch") == (
        "Slurm refuses this workflow's jobs (slurm_partition=nosuch): sbatch: error: invalid "
        "partition specified: nosuch. Give a partition `sinfo` lists, and an account of yours "
        "where the cluster wants one, in --default-resources slurm_partition=… (docs/slurm.md)"
    )
    monkeypatch.setenv("SBATCH_PARTITION", "nosuch")
    assert submission_problem(partition="nosuch").endswith(", in SBATCH_PARTITION (docs/slurm.md)")
