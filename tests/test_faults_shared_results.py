"""Two workflows on one results folder (two clones with the same `results_dir`): the second
stops before any job, naming the first, and changes nothing in the folder.

Before: the second was refused (RunBusy) only inside a train job, after Snakemake had removed
that job's outputs: the first workflow's train.log became an empty file, and once a finished
metrics.json was removed as "output files of failed job"."""

import hashlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from dmls.files import WORKFLOW_LOCK

BIN = Path(sys.executable).parent
RUN = "cluster_torchrun/n1xp1"  # a one-process CPU run on the synthetic tabular data


def clone(tmp_path: Path, name: str) -> Path:
    """A checkout of this workflow with a working directory (and .snakemake) of its own, as a
    second clone has: its code is this one's."""
    checkout = tmp_path / name
    checkout.mkdir()
    for entry in ("Snakefile", "rules", "workflow", "config", "report", "envs", "profiles"):
        (checkout / entry).symlink_to(ROOT / entry)
    return checkout


def tiny_config(tmp_path: Path, results: Path, epochs: int) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"results_dir: {results}\nisolation: none\n"
        "data: {tabular: {synthetic: {n_train: 512, n_test: 256, seed: 0}}}\n"
        f"studies: {{cluster_torchrun: {{base: {{epochs: {epochs}, seeds: 1}}}}}}\n"
    )
    return config


def command(config: Path, results: Path, *args: str) -> list[str]:
    target = str(results / "runs" / RUN / "metrics.json")
    settings = ["--cores", "2", "--configfile", str(config), *args]
    return [str(BIN / "snakemake"), *settings, "--", target]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, each file's SHA-256."""
    return {
        str(p.relative_to(folder)): sha256(p) if p.is_file() else "folder"
        for p in sorted(folder.rglob("*"))
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for(condition, what: str, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.05)


def signal_tree(process: psutil.Process, sig: signal.Signals) -> None:
    """`sig` to `process`, then to every process below it (stopped first, it starts no more).
    A SIGSTOP returns once every one of them has stopped: the signal is delivered
    asynchronously, and a snapshot taken before caught a checkpoint's temporary file that the
    rank renamed a moment later (CI, e75a4ae)."""
    process.send_signal(sig)
    tree = [process, *process.children(recursive=True)]
    for child in tree[1:]:
        child.send_signal(sig)
    if sig != signal.SIGSTOP:
        return

    def stopped(p: psutil.Process) -> bool:
        try:
            return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:
            return True  # (it had exited: it changes nothing more)

    deadline = time.monotonic() + 10
    while not all(stopped(p) for p in tree):
        if time.monotonic() > deadline:
            raise AssertionError(f"not every process of {process.pid}'s tree stopped in 10 s")
        time.sleep(0.01)


def test_a_second_workflow_on_the_same_results_folder_stops_at_once_and_changes_nothing(
    tmp_path,
):
    results = tmp_path / "results"
    config = tiny_config(tmp_path, results, epochs=100)
    first_checkout, second_checkout = clone(tmp_path, "first"), clone(tmp_path, "second")
    train_log = results / "runs" / RUN / "train.log"
    with open(tmp_path / "first.stderr", "w") as first_err:
        first = subprocess.Popen(
            command(config, results), cwd=first_checkout, stdout=first_err, stderr=first_err
        )
    try:
        # The first workflow is training: its run has written an epoch or two into train.log.
        wait_for(lambda: train_log.exists() and "epoch 2/100" in train_log.read_text(),
                 "second epoch in train.log")  # fmt: skip
        assert first.poll() is None
        # It holds still (stopped, jobs and all, still holding its claim) while the second runs.
        signal_tree(psutil.Process(first.pid), signal.SIGSTOP)
        before = snapshot(results)
        start = time.monotonic()
        second = subprocess.run(
            command(config, results), cwd=second_checkout, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        seconds = time.monotonic() - start
        after = snapshot(results)
        signal_tree(psutil.Process(first.pid), signal.SIGCONT)
        first_code = first.wait(timeout=300)
    finally:
        if first.poll() is None:
            signal_tree(psutil.Process(first.pid), signal.SIGCONT)
            first.kill()
            first.wait()
    print(f"the second workflow stopped after {seconds:.1f} s:\n{second.stderr[-1500:]}")
    # Byte for byte, every file of the first workflow's folder, and no file more or less.
    assert after == before
    assert "runs/cluster_torchrun/n1xp1/train.log" in before
    assert second.returncode == 1
    assert seconds < 60
    assert "rule train:" not in second.stderr and "Removing output files" not in second.stderr
    holder = json.loads((results / WORKFLOW_LOCK).read_text())
    assert (
        f"results folder {results} is in use by another workflow (pid {first.pid} on host "
        f"{socket.gethostname()}, started {holder['started']}, workflow {first_checkout}). "
        "This one stops before any job: nothing in the folder was changed. Let that workflow "
        "finish (or stop it), or give this one a folder of its own: --config "
        "results_dir=<another folder>."
    ) in second.stderr
    # The first workflow went on to the end as if nothing had happened.
    assert first_code == 0, (tmp_path / "first.stderr").read_text()[-3000:]
    metrics = json.loads((results / "runs" / RUN / "metrics.json").read_text())
    assert metrics["status"] == "ok" and len(metrics["history"]) == 100
    assert train_log.read_text().count("epoch 100/100  train loss") == 1


@pytest.fixture
def held_folder(tmp_path):
    """A results folder held by a process that imitates a running workflow (dmls.files'
    claim, as the Snakefile's onstart takes it)."""
    results = tmp_path / "results"
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'workflow' / 'scripts')!r}); "
        "from dmls.files import claim_folder; "
        f"f = claim_folder({str(results)!r}, 'the first clone'); print('held', flush=True); "
        "import time; time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    yield results, holder
    holder.kill()
    holder.wait()


def test_a_dry_run_lint_and_report_still_work_while_another_workflow_holds_the_folder(
    tmp_path, held_folder
):
    """Onstart, where the folder is claimed, runs in no dry run, --lint or --report. Parsing the
    Snakefile may add a marker of the user's data files read without a problem
    (data/.sources-read, rules/common.smk), once per content: the folder is compared after the
    first parse."""
    results, holder = held_folder
    config = tiny_config(tmp_path, results, epochs=2)
    checkout = clone(tmp_path, "second")
    dry = subprocess.run(command(config, results, "-n"), cwd=checkout, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert re.search(r"^train +1$", dry.stdout, re.M), dry.stdout[-2000:]
    before = snapshot(results)
    again = subprocess.run(command(config, results, "-n"), cwd=checkout, capture_output=True)
    assert again.returncode == 0
    lint = subprocess.run([str(BIN / "snakemake"), "--lint", "--configfile", str(config)],
                          cwd=checkout, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    page = tmp_path / "snakemake-report.html"
    report = subprocess.run(
        [str(BIN / "snakemake"), "--configfile", str(config), "--report", str(page), "--",
         str(results / "data" / "tabular.json")],
        cwd=checkout, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0 and page.exists(), report.stderr[-3000:]
    assert snapshot(results) == before
    # A run is refused while the holder lives; once it is killed (-9), the folder is free.
    refused = subprocess.run(command(config, results), cwd=checkout, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 1
    assert f"(pid {holder.pid} on host {socket.gethostname()}, started " in refused.stderr
    assert "workflow the first clone)" in refused.stderr
    assert snapshot(results) == before
    holder.kill()
    holder.wait()
    ran = subprocess.run(command(config, results), cwd=checkout, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads((results / "runs" / RUN / "metrics.json").read_text())["status"] == "ok"
    assert json.loads((results / WORKFLOW_LOCK).read_text())["checkout"] == str(checkout)
