"""dmls.files: a full disk while writing a file names the file, its size and the space left,
and leaves what was there; and the claim one workflow holds on its results folder."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from collections import namedtuple

import pytest

from conftest import ROOT
from dmls import files, record
from test_faults_records import two_seed_record

Usage = namedtuple("Usage", "total used free")
FREE = 12_345


@pytest.fixture
def full_disk(monkeypatch):
    """The disk fills as the file is fsynced (where a full disk shows up on write-back), with
    FREE bytes left there."""

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, FREE))


def test_a_full_disk_writing_metrics_json_names_the_file_its_size_and_the_free_space(
    tmp_path, full_disk
):
    """Before: a bare `OSError: [Errno 28] No space left on device` from record.write, naming
    no path, size or free space, though the README promises all three."""
    path = tmp_path / "runs" / "t" / "r" / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the record of an earlier attempt\n")
    metrics = two_seed_record()
    size = len(files.json_text(metrics).encode())
    with pytest.raises(OSError) as err:
        record.write(path, metrics)
    assert str(err.value) == (
        f"[Errno 28] no space left on the device writing {path} ({size:,} bytes to write; "
        f"{FREE:,} bytes free there): the file there is as it was; free space, then run the "
        "workflow again"
    )
    # Still an OSError of that errno; a rerun once there is space goes on (protocol.as_rank).
    assert err.value.errno == errno.ENOSPC and err.value.resumable
    assert path.read_bytes() == b"the record of an earlier attempt\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.json"]  # no temp file


def test_a_full_disk_with_no_file_before_leaves_none_and_says_how_far_it_got(tmp_path, monkeypatch):
    """A writer that streams (a figure, a CSV through pandas) gives no size beforehand: the
    message says what had reached the disk when it failed. A quota is a full disk too."""

    def write(f):
        f.write(b"x" * 3000)
        f.flush()
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, 3 * 2**20))
    path = tmp_path / "runs.csv"
    with pytest.raises(OSError) as err:
        files.atomic_write(path, write)
    assert str(err.value) == (
        f"[Errno {errno.EDQUOT}] disk quota exceeded writing {path} (size unknown: it failed "
        "after 3,000 bytes; 3,145,728 bytes (3.0 MiB) free there): no file was left there; free "
        "space, then run the workflow again"
    )
    assert err.value.errno == errno.EDQUOT and isinstance(err.value, files.DiskFull)
    assert list(tmp_path.iterdir()) == []


def test_other_errors_pass_unchanged_and_leave_the_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("{}")

    def write(f):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        files.atomic_write(path, write)
    assert path.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_file_is_written_whole_with_ordinary_permissions(tmp_path):
    files.write_csv(tmp_path / "a.csv", [{"x": 1}], ["x"])
    assert (tmp_path / "a.csv").read_text() == "x\n1\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == 0o666 & ~umask


# --- The results folder's claim --------------------------------------------------------------


def test_a_claimed_folder_is_refused_to_another_claim_naming_its_holder(tmp_path):
    held = files.claim_folder(tmp_path / "results", "/clones/first")
    lock = tmp_path / "results" / files.WORKFLOW_LOCK
    about = json.loads(lock.read_text())
    assert (about["pid"], about["host"], about["checkout"]) == (
        os.getpid(), socket.gethostname(), "/clones/first"
    )  # fmt: skip
    before = lock.read_bytes()
    with pytest.raises(files.FolderBusy) as err:
        files.claim_folder(tmp_path / "results", "/clones/second")
    assert str(err.value) == (
        f"results folder {tmp_path / 'results'} is in use by another workflow (pid "
        f"{os.getpid()} on host {socket.gethostname()}, started {about['started']}, workflow "
        "/clones/first). This one stops before any job: nothing in the folder was changed. Let "
        "that workflow finish (or stop it), or give this one a folder of its own: --config "
        f"results_dir=<another folder>. A workflow that has ended holds nothing: its lock "
        f"({lock}) goes with its process"
    )
    assert lock.read_bytes() == before  # the refused one wrote nothing
    held.close()
    again = files.claim_folder(tmp_path / "results", "/clones/second")
    assert json.loads(lock.read_text())["checkout"] == "/clones/second"
    again.close()


def test_a_workflow_killed_while_holding_the_folder_blocks_nothing(tmp_path):
    """flock goes with its process: a SIGKILLed Snakemake leaves a lock file that holds nothing."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'workflow' / 'scripts')!r}); "
        "from dmls.files import claim_folder; "
        f"f = claim_folder({str(tmp_path)!r}, 'first'); print('held', flush=True); "
        "import time; time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(files.FolderBusy, match=f"pid {holder.pid} on host"):
            files.claim_folder(tmp_path, "second")
    finally:
        holder.kill()
        holder.wait()
    files.claim_folder(tmp_path, "second").close()


def test_a_lock_file_that_says_nothing_is_still_named(tmp_path):
    (tmp_path / files.WORKFLOW_LOCK).write_text("")
    held = files.claim_folder(tmp_path, "first")
    (tmp_path / files.WORKFLOW_LOCK).write_text("")  # as if its holder had not written yet
    with pytest.raises(files.FolderBusy, match="which did not say who it is in "):
        files.claim_folder(tmp_path, "second")
    held.close()


def test_the_lock_is_not_inherited_by_the_jobs_the_workflow_starts(tmp_path):
    """A job process that outlives a killed Snakemake must not keep the folder claimed."""
    held = files.claim_folder(tmp_path, "first")
    assert not os.get_inheritable(held.fileno())
    held.close()
