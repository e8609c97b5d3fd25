"""What the config check refuses before any job, all at once: every run's bad keys, a whole
number written with a fraction, a run name too long for a file name, a batch the training set
can't fill where the config fixes its size, a fault drill that can't fire; and
tools/check_config.py, which checks a --configfile before Snakemake reads it."""

import copy
import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import ROOT, validated
from dmls.config import data_sizes
from dmls.config.spec import RunSpec, SpecError, check_config, load_schema, resolve_runs
from dmls.protocol import Fault

SCHEMA = load_schema()
FOUND_IN_THE_JOB = "(found in the job: this data's size is known only once it is read)"


def raw_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def default_config() -> dict:
    return validated(raw_config())


def refusal(config: dict) -> str:
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    return str(err.value)


# -- every bad run named at once


def test_bad_keys_in_two_runs_are_both_named():
    """Before: only the first run's errors were raised."""
    config = default_config()
    runs = config["studies"]["optimizer"]["runs"]
    runs["sgd"]["optimiser"] = {}
    runs["adam"]["epoch"] = 3
    assert refusal(config) == (
        "invalid run spec:\n"
        "  studies.optimizer.runs.sgd.optimiser: unknown key (did you mean 'optimizer'?); "
        f"allowed: {', '.join(sorted(SCHEMA['$defs']['run']['properties']))}\n"
        "  studies.optimizer.runs.adam.epoch: unknown key (did you mean 'epochs'?); "
        f"allowed: {', '.join(sorted(SCHEMA['$defs']['run']['properties']))}"
    )


def test_schema_errors_constraints_and_a_baseline_of_several_runs_are_listed_together():
    config = default_config()
    config["studies"]["optimizer"]["runs"]["sgd"]["batch_size"] = 0
    config["studies"]["batch_size"]["runs"]["b16"].update(launcher="single")
    config["studies"]["precision"]["runs"]["fp8"]["batch_size"] = 20
    config["studies"]["backend"]["baseline"] = "nccl"
    assert refusal(config) == (
        "invalid run spec:\n"
        "  studies.precision.runs.fp8.batch_size: fp8 matmuls need every dimension divisible "
        "by 16, the batch too (weight gradients); got 20\n"
        "  studies.batch_size.runs.b16: launcher 'single' runs one process on one device, but "
        "nodes × nproc_per_node = 1 × 2; use 'dp', 'torchrun' or 'accelerate' for several\n"
        "  studies.optimizer.runs.sgd.batch_size: 0 is less than the minimum of 1\n"
        "  studies.backend.baseline: 'nccl' is not one of its runs "
        "['nccl_b32', 'gloo_b32', 'nccl_b128', 'gloo_b128']"
    )


def test_a_spec_breaking_several_constraints_names_each():
    spec = resolve_runs(default_config())["optimizer/sgd"]
    data = spec.to_dict() | {"launcher": "single", "precision": "fp8", "batch_size": 20}
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(data)  # (as a job reads its spec, through RunSpec.from_json)
    where = "studies.optimizer.runs.sgd"
    assert str(err.value) == (
        f"{where}: launcher 'single' runs one process on one device, but nodes × "
        "nproc_per_node = 1 × 2; use 'dp', 'torchrun' or 'accelerate' for several\n"
        f"{where}.batch_size: fp8 matmuls need every dimension divisible by 16, the batch too "
        "(weight gradients); got 20"
    )


# -- numbers and names


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (2.5, "seeds: 2.5 is not a whole number; write an integer"),
        (2.0, "seeds: 2.0 is not a whole number written as one (write 2)"),
    ],
)
def test_a_fraction_is_not_told_to_write_a_whole_number_it_is_not(value, said):
    """`--config seeds=2.5` was told "(write 2)"."""
    config = raw_config() | {"seeds": value}
    with pytest.raises(SpecError) as err:
        check_config(config)
    assert str(err.value) == f"invalid config:\n  {said}"


def test_a_run_name_too_long_for_a_file_name_is_refused_before_any_job():
    """A 300-character run name passed; its first job failed with "File name too long"."""
    config = raw_config()
    config["studies"]["optimizer"]["runs"]["a" * 300] = {}
    with pytest.raises(SpecError) as err:
        check_config(config)
    assert str(err.value) == (
        "invalid config:\n  studies.optimizer.runs: name 'aaaaaaaaaaaaaaaaaaaaaaaa'… is 300 "
        "characters long, more than the 100 allowed (a run's name becomes folder and file "
        "names, which hold at most 255 bytes with the pipeline's suffixes)"
    )
    config["studies"]["optimizer"]["runs"] = {"a" * 100: {}}
    check_config(config)


# -- a batch the training set can't fill


B_BASE = {
    "dataset": "tabular", "model": {"name": "mlp", "hidden": 8, "batch_norm": False},
    "device": "cpu", "backend": "gloo", "launcher": "torchrun", "epochs": 3, "seeds": 2,
}  # fmt: skip


def b_config(data: dict | None = None, **runs: dict) -> dict:
    """The config of B1 runs `runs` (torchrun on the CPU, tabular data) on config `data`."""
    studies = {"cluster_torchrun": {"base": B_BASE, "runs": runs}}
    return validated({"data": data or {}, "studies": studies})


def test_a_batch_larger_than_a_synthetic_set_is_refused_naming_the_key_and_the_samples():
    """batch_size 100,000 on 512 samples was refused at run time, and Snakemake exited 0."""
    data = {"tabular": {"synthetic": {"n_train": 512}}}
    assert refusal(b_config(data, big={"batch_size": 100_000}, ok={"batch_size": 512})) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.big.batch_size: 100000 per replica "
        "× 1 replica(s) = 100000 samples per step, but the training set has 512 "
        "(data.tabular.synthetic.n_train); use at most 512"
    )
    # Over the replicas, as the engine counts a step; a split that leaves less than a step.
    two = {"nproc_per_node": 2, "batch_size": 300}
    assert refusal(b_config(data, two=two)) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.two.batch_size: 300 per replica × "
        "2 replica(s) = 600 samples per step, but the training set has 512 "
        "(data.tabular.synthetic.n_train); use at most 256"
    )
    split = {"nproc_per_node": 2, "batch_size": 200}
    assert resolve_runs(b_config(data, split=split | {"validation_samples": 112}))
    assert refusal(b_config(data, split=split | {"validation_samples": 113})) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.split.validation_samples: 113 of "
        "the 512 training samples (data.tabular.synthetic.n_train) held out leave 399 to "
        "train, fewer than one step's batch of 400; use at most 112"
    )


def test_published_sets_have_known_sizes_and_a_users_own_files_are_left_to_the_job():
    config = default_config()
    sgd = config["studies"]["optimizer"]["runs"]["sgd"]
    sgd["batch_size"] = 30_000
    assert refusal(config) == (
        "invalid run spec:\n  studies.optimizer.runs.sgd.batch_size: 30000 per replica × 2 "
        "replica(s) = 60000 samples per step, but the training set has 50000 (CIFAR-10's "
        "published set, as data.cifar10.md5 fixes it); use at most 25000"
    )
    sgd["batch_size"] = 25_000
    assert refusal(config) == (
        "invalid run spec:\n  studies.optimizer.runs.sgd.validation_samples: 5000 of the 50000 "
        "training samples (CIFAR-10's published set, as data.cifar10.md5 fixes it) held out "
        "leave 45000 to train, fewer than one step's batch of 50000; use at most 0"
    )
    sgd.update(batch_size=32, grad_accum_steps=705)
    assert refusal(config) == (
        "invalid run spec:\n  studies.optimizer.runs.sgd.grad_accum_steps: 705 micro-batches "
        "per optimizer step, but an epoch has at most 704 per rank: the training set has 45000 "
        "(CIFAR-10's published set, as data.cifar10.md5 fixes it; validation_samples holds out "
        "5000 more), in micro-batches of 64 over all replicas; use at most 704"
    )
    sgd["grad_accum_steps"] = 704
    assert resolve_runs(config)["optimizer/sgd"].grad_accum_steps == 704
    sgd.update(batch_size=25_000, grad_accum_steps=1)
    config["data"]["cifar10"]["md5"] = "0" * 32  # another archive: any size
    assert resolve_runs(config)["optimizer/sgd"].batch_size == 25_000

    big = {"batch_size": 70_000, "dataset": "fashion_mnist", "model": {"name": "cnn"}}
    assert refusal(b_config(None, big=big)) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.big.batch_size: 70000 per replica "
        "× 1 replica(s) = 70000 samples per step, but the training set has 60000 "
        "(Fashion-MNIST's published set); use at most 60000"
    )
    own = b_config({"fashion_mnist": {"debian_dir": "/my/idx"}, "tabular": {"dir": "/my/npy"}},
                   big=big, tab={"batch_size": 10**6})  # fmt: skip
    assert set(resolve_runs(own)) == {"cluster_torchrun/big", "cluster_torchrun/tab"}


def test_train_samples_caps_the_set_even_where_its_size_is_unknown():
    data = {"tabular": {"dir": "/my/npy"}}
    assert refusal(b_config(data, r={"train_samples": 64, "batch_size": 65})) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.r.batch_size: 65 per replica × 1 "
        "replica(s) = 65 samples per step, but the training set has at most 64 "
        "(train_samples); use at most 64"
    )
    accumulated = {"train_samples": 512, "batch_size": 32, "nproc_per_node": 2}
    assert refusal(b_config(data, r=accumulated | {"grad_accum_steps": 9})) == (
        "invalid run spec:\n  studies.cluster_torchrun.runs.r.grad_accum_steps: 9 micro-batches "
        "per optimizer step, but an epoch has at most 8 per rank: the training set has at most "
        "512 (train_samples), in micro-batches of 64 over all replicas; use at most 8"
    )
    assert resolve_runs(b_config(data, r=accumulated | {"grad_accum_steps": 8}))


def test_the_schema_names_the_published_sets_the_data_layer_reads():
    from dmls.data import datasets

    data = SCHEMA["properties"]["data"]["properties"]
    assert data["cifar10"]["properties"]["md5"]["default"] == datasets.CIFAR10_MD5
    # Debian's folder is where the data layer looks when the user set none: a default path would
    # be checked as the user's own, and stop every machine without the package.
    debian_dir = data["fashion_mnist"]["properties"]["debian_dir"]
    assert debian_dir["default"] is None
    assert datasets.FASHION_MNIST_DEBIAN_DIR in debian_dir["description"]


def test_the_config_check_refuses_exactly_what_the_engine_refuses(tmp_path):
    """Over sizes, splits, caps, batches, replicas and accumulation: a run is refused before
    any job if and only if the engine's own checks (the loaders' split, the trainer's batch and
    accumulation) refuse it once the data is read (no last batch is dropped here)."""
    import torch

    from dmls.data import datasets, loaders
    from dmls.training.trainer import Trainer

    for total in (100, 128):
        datasets.prepare("tabular", {"synthetic": {"n_train": total, "n_test": 8}}, tmp_path)
        data = {"tabular": {"synthetic": {"n_train": total}}}
        base = resolve_runs(b_config(data, r={}))["cluster_torchrun/r"].to_dict()
        for held, cap, batch, (launcher, replicas), accumulate in itertools.product(
            (0, 20, 100), (0, 50, 200), (16, 40, 64, 130), (("torchrun", 1), ("torchrun", 2),
            ("dp", 2)), (1, 3)
        ):  # fmt: skip
            spec = RunSpec.from_dict(base | dict(
                validation_samples=held, train_samples=cap, batch_size=batch, launcher=launcher,
                nproc_per_node=replicas, grad_accum_steps=accumulate,
            ))  # fmt: skip
            before = data_sizes.problems(spec, data, SCHEMA)
            processes = spec.processes
            per_step = spec.batch_size * (replicas // processes)
            try:
                found = loaders.make_loaders(
                    spec, tmp_path, rank=0, world_size=processes, device=torch.device("cpu"),
                    samples_per_step=per_step, memory_format=torch.contiguous_format,
                )  # fmt: skip
                job = SimpleNamespace(
                    spec=spec, data=found, strategy=SimpleNamespace(samples_per_step=per_step)
                )
                Trainer._check_batches(job)
                in_the_job = []
            except SpecError as e:
                in_the_job = [str(e)]
            case = (total, held, cap, batch, launcher, replicas, accumulate)
            assert bool(before) == bool(in_the_job), (case, before, in_the_job)
            # The same key is named, before the job and in it; a batch above the whole set
            # is named as such before, where the job's split finds no samples left for it.
            if not (held and batch * replicas > total):
                assert [b.split(":")[0] for b in before] == [j.split(":")[0] for j in in_the_job]
            assert all(j.endswith(FOUND_IN_THE_JOB) for j in in_the_job)
        loaders._dataset.cache_clear()


# -- fault drills


def b_runs() -> dict[str, RunSpec]:
    return resolve_runs(b_config(None, n1xp1={}, n1xp2={"nproc_per_node": 2}))


@pytest.mark.parametrize(
    ("drill", "problems"),
    [
        (
            Fault(rank=5, epoch=1, kind="kill"),
            [
                "cluster_torchrun/n1xp1: rank 5, but the run has ranks 0-0",
                "cluster_torchrun/n1xp2: rank 5, but the run has ranks 0-1",
            ],
        ),
        (
            Fault(rank=1, epoch=9, kind="raise"),
            [
                "cluster_torchrun/n1xp1: rank 1, but the run has ranks 0-0 and epoch 9, but the "
                "run trains 3 epoch(s)",
                "cluster_torchrun/n1xp2: epoch 9, but the run trains 3 epoch(s)",
            ],
        ),
        (
            Fault(rank=0, epoch=1, kind="nan", run="cluster_torchrun/n1xp2", seed=7),
            ["cluster_torchrun/n1xp2: seed 7, but the run trains seeds [0, 1]"],
        ),
    ],
)
def test_a_fault_drill_that_cant_fire_is_refused_before_any_job_naming_each_run(drill, problems):
    """rank=5, epoch=9 or seed=7 failed inside the job; Snakemake's onstart passes the runs."""
    with pytest.raises(ValueError) as err:
        drill.check_run_exists(b_runs())
    hint = "" if drill.run else "; name the run it is for with run=<study>/<run>"
    asked = f"rank={drill.rank},epoch={drill.epoch},kind={drill.kind}"
    asked += f",seed={drill.seed}" if drill.seed is not None else ""
    assert str(err.value) == (
        f"DMLS_FAULT ({asked}) can't fire in {len(problems)} run(s) it targets (a drill that "
        f"does nothing would pass as a run that survived it){hint}:\n  " + "\n  ".join(problems)
    )


def test_a_fault_drill_that_can_fire_passes_and_one_for_another_run_leaves_the_rest_alone():
    runs = b_runs()
    Fault(rank=1, epoch=3, kind="kill", run="cluster_torchrun/n1xp2", seed=1).check_run_exists(runs)
    Fault(rank=0, epoch=1, kind="raise").check_run_exists(runs)
    Fault(rank=1, epoch=9, kind="raise").check_run_exists(list(runs))  # ids only: names only


# -- tools/check_config.py


def check_tool(*files, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DMLS_FAULT"}
    if fault:
        env["DMLS_FAULT"] = fault
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_config.py"), *map(str, files)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


def test_the_check_tool_names_a_yaml_syntax_errors_file_line_and_column(tmp_path):
    """Snakemake said only "Config file is not valid JSON or YAML" of a --configfile."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("defaults:\n  epochs: 2\n   seeds: 3\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text("defaults:\n  epochs: 2\n  epochs: 3\n")
    out = check_tool(broken, twice)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.splitlines() == [
        f"{broken}: line 3, column 9: mapping values are not allowed here (YAML syntax)",
        f"{twice}: line 3: 'epochs' again (first at line 2)",
    ]


def test_the_check_tool_names_every_problem_at_its_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "studies:\n  optimizer:\n    runs:\n      sgd: {optimizer: {name: adamx}}\n"
        "      v1.5: {batch_size: 30000}\n"
    )
    over = tmp_path / "over.yaml"
    over.write_text("seeds: 2.5\n")
    out = check_tool(bad)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "invalid config:",
        f"  {bad}:4: studies.optimizer.runs.sgd.optimizer.name: 'adamx' is not allowed; "
        "allowed: sgd, adam, adamw, rmsprop",
        "invalid run spec:",
        f"  {bad}:5: studies.optimizer.runs.v1.5.batch_size: 30000 per replica × 2 replica(s) "
        "= 60000 samples per step, but the training set has 50000 (CIFAR-10's published set, "
        "as data.cifar10.md5 fixes it); use at most 25000",
    ]
    # A key every run shares is bad: every bad key is still named, at every level; the
    # constraints between a run's keys wait for it (they would be checked against a guess).
    out = check_tool(bad, over)
    assert out.stderr.splitlines() == [
        "invalid config:",
        f"  {over}:1: seeds: 2.5 is not a whole number; write an integer",
        f"  {bad}:4: studies.optimizer.runs.sgd.optimizer.name: 'adamx' is not allowed; "
        "allowed: sgd, adam, adamw, rmsprop",
    ]


def test_bad_keys_of_the_defaults_a_base_and_the_runs_come_in_one_message(tmp_path):
    """Issue #55 (6): bad `defaults` keys were named first, bad run keys only once those were
    fixed, in the workflow and in tools/check_config.py alike."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        'defaults:\n  epochs: "two"\nstudies:\n  parallelism:\n    base: {optimizer: {lr: fast}}\n'
        '    runs:\n      single_gpu: {batch_size: 3.5}\n      ddp_2gpu: {nodes: "1"}\n'
    )
    expected = [
        "invalid config:",
        "  defaults.epochs: 'two' is not of type 'integer'",
        "  studies.parallelism.base.optimizer.lr: 'fast' is not of type 'number'",
        "  studies.parallelism.runs.single_gpu.batch_size: 3.5 is not a whole number; write an "
        "integer",
        "  studies.parallelism.runs.ddp_2gpu.nodes: '1' is not of type 'integer'",
    ]
    with pytest.raises(SpecError) as err:
        check_config(yaml.safe_load(bad.read_text()) | {"data": {}})
    assert str(err.value).splitlines() == expected
    at = iter((2, 5, 7, 8))  # each key's line in the file
    out = check_tool(bad)
    assert out.stderr.splitlines() == [
        f"  {bad}:{next(at)}: {line.strip()}" if line.startswith("  ") else line
        for line in expected
    ]
    snakemake = Path(sys.executable).parent / "snakemake"
    dry = subprocess.run(
        [str(snakemake), "-n", "--configfile", str(bad), "--config", f"results_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "\n".join(expected) in said, said


def test_the_check_tool_passes_a_good_config_with_one_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("defaults: {epochs: 2}\nspecial_studies: {profiler: {enabled: false}}\n")
    config = copy.deepcopy(raw_config())
    specials = sum(1 for s in validated(config)["special_studies"].values() if s["enabled"])
    runs = len(resolve_runs(config))
    out = check_tool(good)
    assert (out.returncode, out.stdout, out.stderr) == (
        0, f"{runs} runs, {specials - 1} special studies: ok\n", "",
    )  # fmt: skip
    out = check_tool(good, fault="rank=0,epoch=3,kind=kill,run=optimizer/sgd")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        "DMLS_FAULT (rank=0,epoch=3,kind=kill) can't fire in 1 run(s) it targets (a drill that "
        "does nothing would pass as a run that survived it):\n"
        "  optimizer/sgd: epoch 3, but the run trains 2 epoch(s)\n"
    )


def test_a_nested_command_line_value_is_read_as_yaml(tmp_path):
    """Issue #55 (9): `--config 'cluster={runtime_minutes: 600}'` failed with "'600' is not of
    type 'integer'" (Snakemake reads a nested value's scalars as strings), and no way of
    writing it passed. It is read as a config file's would be: 0 is the number 0 (too few
    epochs), 600 an integer, and a word stays a word."""
    from dmls.config.spec import yaml_scalars

    assert yaml_scalars(
        {
            "cluster": {"runtime_minutes": "600"},
            "d": {"lr": "0.5", "x": ["true", "null", "adam", "1e3"]},
        }
    ) == {
        "cluster": {"runtime_minutes": 600},
        "d": {"lr": 0.5, "x": [True, None, "adam", "1e3"]},
    }
    snakemake = Path(sys.executable).parent / "snakemake"

    def dry(*config):
        out = subprocess.run(
            [str(snakemake), "-n", "--config", *config, f"results_dir={tmp_path}"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return out.returncode, out.stdout + out.stderr

    code, said = dry("cluster={runtime_minutes: 600}", "defaults={epochs: 2, optimizer: {lr: 0.5}}")
    assert code == 0, said
    code, said = dry("defaults={epochs: 0}")
    assert code != 0 and "defaults.epochs: 0 is less than the minimum of 1" in said, said
