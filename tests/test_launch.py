"""Each launcher builds the command a student would type, as an argument list."""

import os
import shlex
import shutil
import signal
import sys
from dataclasses import replace

from conftest import make_spec
from dmls.supervisor.launch import NODE_AGENT, WORKER, Command, agent_command, build_commands

ARGS = ["--spec", "{}", "--data-dir", "d", "--run-dir", "r"]


def flags(argv: list[str]) -> dict[str, str]:
    """`--key value` pairs of an argv (flags without a value map to '')."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            out[argv[i]] = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def test_single_and_dp_run_the_worker_directly():
    for spec in (make_spec(launcher="single"), make_spec(launcher="dp", nproc_per_node=2)):
        (cmd,) = build_commands(spec, ARGS, device="cuda", port=1234, threads=8)
        assert cmd.argv == [sys.executable, str(WORKER), *ARGS]
        assert cmd.env["OMP_NUM_THREADS"] == "8"


def test_torchrun_one_agent_per_emulated_node():
    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=2, device="cpu")
    cmds = build_commands(spec, ARGS, device="cpu", port=29555, threads=4)
    assert len(cmds) == 2
    for node, cmd in enumerate(cmds):
        assert cmd.argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
        f = flags(cmd.argv)
        assert f["--nnodes"] == "2" and f["--nproc_per_node"] == "2"
        assert f["--rdzv_backend"] == "c10d" and f["--rdzv_endpoint"] == "127.0.0.1:29555"
        assert f["--rdzv_conf"] == f"is_host={'true' if node == 0 else 'false'}"
        assert cmd.argv[-len(ARGS) - 1 :] == [str(WORKER), *ARGS]
        assert cmd.env["OMP_NUM_THREADS"] == "1"  # 4 threads shared by 4 processes
    assert flags(cmds[0].argv)["--rdzv_id"] == flags(cmds[1].argv)["--rdzv_id"]


def test_the_openmp_wait_policy_reaches_every_launcher_and_only_when_set():
    for launcher, srun in (("torchrun", False), ("accelerate", False), ("torchrun", True)):
        spec = make_spec(launcher=launcher, nodes=2, nproc_per_node=2, device="cpu",
                         omp_wait_policy="passive")  # fmt: skip
        cmds = build_commands(spec, ARGS, device="cpu", port=29555, threads=4, srun=srun)
        assert [c.env["OMP_WAIT_POLICY"] for c in cmds] == ["PASSIVE"] * len(cmds)
        default = build_commands(replace(spec, omp_wait_policy="default"), ARGS, device="cpu",
                                 port=29555, threads=4, srun=srun)  # fmt: skip
        assert not any("OMP_WAIT_POLICY" in c.env for c in default)  # the library's own


def test_accelerate_on_cpu_uses_multi_gpu_with_use_cpu():
    spec = make_spec(launcher="accelerate", nproc_per_node=2, device="cpu", precision="bf16")
    (cmd,) = build_commands(spec, ARGS, device="cpu", port=29600, threads=2)
    f = flags(cmd.argv)
    assert cmd.argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert "--multi_gpu" in f and "--cpu" not in f
    assert f["--num_processes"] == "2" and f["--num_machines"] == "1"
    assert f["--mixed_precision"] == "bf16"
    assert cmd.env["ACCELERATE_USE_CPU"] == "1"


def test_accelerate_grid_counts_total_processes_and_machine_ranks():
    spec = make_spec(launcher="accelerate", nodes=2, nproc_per_node=2, device="cuda")
    cmds = build_commands(spec, ARGS, device="cuda", port=29700, threads=16)
    assert [flags(c.argv)["--machine_rank"] for c in cmds] == ["0", "1"]
    for cmd in cmds:
        f = flags(cmd.argv)
        assert f["--num_processes"] == "4"  # the TOTAL, not per machine
        assert f["--num_machines"] == "2" and f["--main_process_port"] == "29700"
        assert f["--mixed_precision"] == "no"
        assert "ACCELERATE_USE_CPU" not in cmd.env


def test_accelerate_single_process_on_cpu():
    spec = make_spec(launcher="accelerate", device="cpu")
    (cmd,) = build_commands(spec, ARGS, device="cpu", port=1, threads=2)
    f = flags(cmd.argv)
    assert "--cpu" in f and "--multi_gpu" not in f and f["--num_processes"] == "1"


def test_slurm_nodes_get_one_srun_with_one_agent_per_node():
    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=2, device="cpu")
    (cmd,) = build_commands(spec, ARGS, device="cpu", port=20042, threads=4, srun=True)
    assert cmd.argv[0] == "srun"
    f = flags(cmd.argv)
    assert f["--nodes"] == f["--ntasks"] == "2" and f["--ntasks-per-node"] == "1"
    assert f["--cpus-per-task"] == "4" and "--kill-on-bad-exit=1" in cmd.argv
    assert cmd.argv[cmd.argv.index(str(NODE_AGENT)) - 1] == sys.executable
    assert f["--port"] == "20042" and f["--device"] == "cpu"
    # 4 threads on each node, shared by that node's 2 processes (not by all 4).
    assert f["--threads-per-process"] == "2"
    assert cmd.argv[-len(ARGS) - 1 :] == ["--", *ARGS]


def test_the_agent_of_a_later_node_joins_the_first_nodes_rendezvous():
    def second_node(launcher):
        spec = make_spec(launcher=launcher, nodes=2, nproc_per_node=2, device="cpu")
        return agent_command(
            spec, ARGS, device="cpu", node_rank=1, master_addr="node1", port=20042,
            threads_per_process=2,
        )  # fmt: skip

    cmd = second_node("torchrun")
    f = flags(cmd.argv)
    assert f["--rdzv_endpoint"] == "node1:20042" and f["--rdzv_conf"] == "is_host=false"
    assert f["--nnodes"] == "2" and f["--nproc_per_node"] == "2"
    assert cmd.env["OMP_NUM_THREADS"] == "2"
    f = flags(second_node("accelerate").argv)
    assert f["--machine_rank"] == "1" and f["--main_process_ip"] == "node1"
    assert f["--num_processes"] == "4" and f["--num_machines"] == "2"


# Strings a shell would act on. Config can't produce them (the schema forbids them in run
# names and results_dir), but commands must not depend on that.
HOSTILE = ["a b", "it's", 'say "hi"', "$(touch pwned)", "`touch pwned`", "x; touch pwned", "|&>*"]


def test_hostile_strings_stay_single_words_of_every_command():
    from dataclasses import replace

    for launcher, nproc in (("single", 1), ("dp", 2), ("torchrun", 2), ("accelerate", 2)):
        spec = replace(make_spec(launcher=launcher, nproc_per_node=nproc), run="r; touch pwned")
        args = [word for value in HOSTILE for word in ("--x", value)]
        for cmd in build_commands(spec, args, device="cpu", port=1, threads=2):
            assert cmd.argv[-len(args) :] == args
            assert all(isinstance(word, str) for word in cmd.argv)
            # What the log shows is quoted so that a shell would give back the same words.
            assert shlex.split(shlex.join(cmd.argv)) == cmd.argv


def test_hostile_paths_and_names_reach_the_worker_intact_and_no_shell_runs(
    tmp_path, tabular_dir, monkeypatch
):
    from dataclasses import replace

    from dmls.supervisor import supervise

    monkeypatch.chdir(tmp_path)  # where a shell would have created the files
    data_dir = tmp_path / "d $(touch pwned1) `touch pwned2`; touch pwned3 'q\""
    shutil.copytree(tabular_dir, data_dir)
    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=1,
        num_workers=0, run="x",
    )  # fmt: skip
    spec = replace(spec, run="r $(touch pwned4); touch pwned5")
    with open(tmp_path / "train.log", "w") as log:
        metrics = supervise.run(
            spec, run_dir=tmp_path / "run dir", data_dir=data_dir,
            checkpoint_path=tmp_path / "c.pt", log=log, threads=1,
        )  # fmt: skip
    assert metrics["status"] == "ok" and metrics["run"] == spec.run
    assert not list(tmp_path.glob("pwned*"))
    (logged,) = [line for line in (tmp_path / "train.log").open() if line.startswith("$ ")]
    assert shlex.split(logged[2:]) == metrics["launch"]["commands"][0]
    assert str(data_dir) in metrics["launch"]["commands"][0]


def test_a_worker_stopped_from_outside_writes_where_it_was(tmp_path, tabular_dir):
    """A hung run's log must say where it hung: SIGTERM (what a launcher sends its ranks when it
    is stopped) makes rank.py print every thread's stack before it dies."""
    import os
    import signal
    import subprocess

    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=10_000,
        num_workers=0, launcher="single",
    )  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "--spec", spec.to_json(), "--data-dir", str(tabular_dir),
         "--run-dir", str(tmp_path), "--checkpoint", str(tmp_path / "c.pt")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONPATH": str(WORKER.parent)},
    )  # fmt: skip
    for line in worker.stdout:  # training has started
        if line.startswith("epoch 1/"):
            break
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == -signal.SIGTERM
    assert "most recent call first" in stderr and "in fit" in stderr


def test_a_special_studys_agents_are_a_training_runs_with_its_module_for_train_py():
    from dmls.supervisor.launch import group_commands

    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=2, device="cpu")
    training = build_commands(spec, ARGS, device="cpu", port=29555, threads=4)
    # make_spec's run is t/r: the rendezvous of a study named "t.r" has the same id.
    special = group_commands("dmls.special.x", ARGS, nodes=2, nproc_per_node=2, port=29555,
                             name="t.r")  # fmt: skip
    for ours, theirs in zip(special, training, strict=True):
        assert ours.argv == [*theirs.argv[: -len(ARGS) - 1], "-m", "dmls.special.x", *ARGS]
        assert ours.env["OMP_NUM_THREADS"] == theirs.env["OMP_NUM_THREADS"] == "1"
        assert ours.env["PYTHONPATH"].split(os.pathsep)[0] == str(WORKER.parent)


def test_a_special_studys_slurm_ranks_start_as_a_training_runs_a_node_agent_per_node(
    monkeypatch,
):
    """One srun step runs node_agent.py once per node, which builds that node's torchrun agent
    for the module, the step's first node hosting the rendezvous: as a multi-node training run
    starts, with no rank finding its rendezvous host itself."""
    from dmls.supervisor.launch import group_commands

    (cmd,) = group_commands("m", ["a"], nodes=2, nproc_per_node=3, port=20042, name="x",
                            srun=True)  # fmt: skip
    f = flags(cmd.argv)
    assert cmd.argv[0] == "srun" and f["--nodes"] == "2" and f["--ntasks-per-node"] == "1"
    assert f["--cpus-per-task"] == "3" and "--kill-on-bad-exit=1" in cmd.argv
    agent = cmd.argv[cmd.argv.index(sys.executable) :]
    assert agent[1] == str(NODE_AGENT) and agent[-3:] == ["--", "m", "a"]
    # What node_agent.py runs on node 1 of the step node[3-4]:
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[3-4]")
    from dmls.supervisor import slurm

    monkeypatch.setattr(slurm, "expand_hostlist", lambda hosts: ("node3", "node4"))
    monkeypatch.setattr(sys, "argv", agent[1:])
    started = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append(argv))
    import runpy

    runpy.run_path(str(NODE_AGENT), run_name="__main__")
    (argv,) = started
    g = flags(argv)
    assert argv[1:3] == ["-m", "torch.distributed.run"] and argv[-3:] == ["-m", "m", "a"]
    assert g["--nnodes"] == "2" and g["--nproc_per_node"] == "3"
    assert g["--rdzv_endpoint"] == "node3:20042" and g["--rdzv_id"] == "x.20042"
    assert g["--rdzv_conf"] == "is_host=false"


def python(code: str) -> Command:
    return Command([sys.executable, "-c", code])


SLEEPS = python("import time; time.sleep(600)")


def test_when_one_launcher_fails_the_others_are_stopped_at_once(tmp_path):
    from dmls.supervisor import processes

    fails = python("import sys, time; time.sleep(0.5); sys.exit(3)")
    with open(tmp_path / "log", "w") as log:
        outcome = processes.start_and_wait([SLEEPS, fails], log, timeout_s=600)
    assert outcome.exit_codes == [-signal.SIGTERM, 3] and outcome.first_failure == 3
    assert not outcome.timed_out and outcome.seconds < 10


def test_past_its_timeout_the_runner_stops_every_launcher_and_says_so(tmp_path, monkeypatch):
    """A launcher that ignores SIGTERM is killed after the grace period."""
    from dmls.supervisor import processes

    monkeypatch.setattr(processes, "STOP_GRACE_S", 1)
    deaf = python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(600)")  # fmt: skip
    with open(tmp_path / "log", "w") as log:
        outcome = processes.start_and_wait([SLEEPS, deaf], log, timeout_s=2)
    assert outcome.timed_out and not outcome.ok and outcome.first_failure is None
    assert outcome.exit_codes == [-signal.SIGTERM, -signal.SIGKILL]
    assert outcome.seconds < 10
    said = (tmp_path / "log").read_text()
    assert "TIMED OUT: still running after 2 s; every launcher is stopped" in said
