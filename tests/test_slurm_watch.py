"""What the terminal hears from Slurm under `--profile profiles/slurm` (dmls/supervisor/
slurm_watch.py), from squeue's and sinfo's own lines: a job's state and nodes every period, a
node of its jobs that Slurm says is not responding or down (with Slurm's reason), a job that
sits COMPLETING, a job that ended badly; and the DAG's last lines name the job, the node and
the reason. Issue #55 (8): a node lost at launch was first said 6 min 30 s later, a job stuck
COMPLETING on a lost node not at all, and the closing lines named no node. (The drill on the
2-node cluster: tests/test_slurm_faults.py.)"""

from __future__ import annotations

import time

from dmls.supervisor import slurm_watch
from dmls.supervisor.slurm_watch import Watch, expand


def job(job_id, state, nodes="node[1-2]", reason="None", name="abc", workdir="/w", when=None):
    """squeue's line of a job, submitted now unless `when`."""
    when = when or time.strftime("%Y-%m-%dT%H:%M:%S")
    comment = "rule_train_wildcards_cluster_torchrun_n2xp1"
    return f"{job_id}|{name}|{comment}|{state}|1:02|{nodes}|{reason}|{workdir}|{when}"


class Slurm:
    """squeue's and sinfo's answers, changed by the test between polls."""

    def __init__(self):
        self.queue: list[str] = []
        self.nodes = ["node1|mixed|none", "node2|mixed|none"]

    def __call__(self, argv):
        return "\n".join(self.queue if argv[0] == "squeue" else self.nodes) + "\n"


def watch(slurm, run_id="abc") -> Watch:
    return Watch("/w", time.time() - 60, run_id, run=slurm)


def test_a_node_that_stops_responding_under_a_job_is_said_with_slurms_reason_and_at_the_end():
    slurm = Slurm()
    w = watch(slurm)
    slurm.queue = [job(17, "RUNNING")]
    (line,) = w.poll()
    assert line.endswith("] Slurm: 1 running (train cluster_torchrun_n2xp1 1:02 on node[1-2])")
    assert line.startswith("[") and line[9] == "]"  # [HH:MM:SS]
    slurm.nodes[1] = "node2|mixed*|none"
    _, node = w.poll()
    assert node.endswith(
        "Slurm: node node2 is not responding (mixed*); job 17 (train cluster_torchrun_n2xp1) on it"
    ), node
    assert w.poll()[1:] == []  # said once, not every period
    # The run ends; Slurm can't clean up on node2: the job sits COMPLETING, said every period.
    slurm.queue = [job(17, "COMPLETING")]
    slurm.nodes[1] = "node2|down*|Not responding"
    lines = w.poll()
    assert lines[0].endswith("Slurm: 1 completing")
    assert "node node2 is down, not responding (down*) (Slurm's reason: Not responding)" in lines[1]
    assert "job 17 (train cluster_torchrun_n2xp1) COMPLETING since " in lines[2]
    assert lines[2].endswith("on node[1-2]: its processes ended and Slurm is still cleaning up on "
                             "its nodes")  # fmt: skip
    slurm.queue = [job(17, "COMPLETED")]
    first = w.problems["node2"].since  # when it was first seen not responding
    completing = lines[2].split(" COMPLETING since ")[1][:8]
    assert w.closing() == [
        "Slurm:",
        f"  job 17 (train cluster_torchrun_n2xp1): COMPLETING on node[1-2] from {completing} to "
        f"{completing} (as polled), then COMPLETED",
        f"  node node2: down, not responding (down*) from {first} (Slurm's reason: Not responding)",
    ]


def test_a_job_that_ends_badly_is_said_once_and_named_at_the_end():
    slurm = Slurm()
    w = watch(slurm)
    pending = job(18, "PENDING", nodes="", reason="ReqNodeNotAvail")
    slurm.queue = [job(17, "NODE_FAIL", reason="NodeDown"), pending]
    slurm.nodes[1] = "node2|down*|Not responding"
    summary, node, ended = w.poll()
    assert summary.endswith("Slurm: 1 pending (Slurm's reason: ReqNodeNotAvail), 1 node_fail")
    assert node.endswith(
        "node node2 is down, not responding (down*) (Slurm's reason: Not responding)"
    )
    assert ended.endswith(
        "job 17 (train cluster_torchrun_n2xp1) ended NODE_FAIL on node[1-2] (Slurm's reason: "
        "NodeDown)"
    )
    assert len(w.poll()) == 1  # the end said once
    closing = w.closing()
    assert closing[:2] == [
        "Slurm:",
        "  job 17 (train cluster_torchrun_n2xp1): NODE_FAIL on node[1-2] (Slurm's reason: "
        "NodeDown)",
    ]
    assert closing[2].startswith("  node node2: down, not responding (down*) from ")


def test_a_failed_jobs_own_reason_is_read_from_its_kept_slurm_log(tmp_path):
    """A node lost as the job starts is named by the job itself (srun's failure, in the
    supervisor's INTERRUPTED line), not by Slurm, which still counts the node up: the last
    lines quote it from the job's kept Slurm log."""
    log = tmp_path / "rule_train" / "cluster_torchrun_n2xp1" / "17.log"
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1\nINTERRUPTED cluster_torchrun/n2xp1: srun could not start a task on "
                   "node node2 (…). The node failed, not the run\nmore\n")  # fmt: skip
    slurm = Slurm()
    slurm.queue = [job(17, "FAILED", reason="NonZeroExitCode")]
    w = Watch("/w", 0.0, "abc", run=slurm, logdir=tmp_path)
    w.poll()
    assert w.closing()[1] == (
        "  job 17 (train cluster_torchrun_n2xp1): FAILED on node[1-2] (Slurm's reason: "
        f"NonZeroExitCode); its log ({log}): INTERRUPTED cluster_torchrun/n2xp1: srun could not "
        "start a task on node node2 (…). The node failed, not the run"
    )


def test_only_this_workflows_jobs_are_watched():
    slurm = Slurm()
    slurm.queue = [job(1, "RUNNING", name="other"), job(2, "RUNNING"),
                   "3|abc|a user's job|RUNNING|1:00|node1|None|/w|2026-01-01T00:00:00"]  # fmt: skip
    assert list(watch(slurm).poll()[0].split(": ", 1)[1].split(" (")[:1]) == ["1 running"]
    # Without the plugin's run id: this user's jobs of this directory, submitted since it began.
    slurm.queue = [job(1, "RUNNING", workdir="/elsewhere"), job(2, "RUNNING"),
                   job(4, "RUNNING", when="2020-01-01T00:00:00")]  # fmt: skip
    w = watch(slurm, run_id=None)
    w.poll()
    assert list(w.jobs) == ["2"]
    # Nothing in the queue, or Slurm not answering: said, never raised.
    slurm.queue = []
    assert watch(slurm).poll()[0].endswith("Slurm: no job of this workflow in the queue")

    def broken(argv):
        raise OSError("squeue: not found")

    assert (
        Watch("/w", 0.0, run=broken).poll()[0].endswith("Slurm: can't be asked (squeue: not found)")
    )


def test_host_lists_expand_as_slurm_writes_them():
    assert expand("node[1-2],gpu7") == ["node1", "node2", "gpu7"]
    assert expand("n[08-10,12]") == ["n08", "n09", "n10", "n12"]
    assert (
        slurm_watch._bad("idle*") and slurm_watch._bad("drained") and not slurm_watch._bad("mixed")
    )
