"""Config → run specs: the schema's defaults, the expansion of studies, and clear errors."""

import copy

import pytest
import yaml

from conftest import ROOT, make_spec, validated
from dmls.config.spec import (
    SpecError,
    check_config,
    load_schema,
    resolve_runs,
    special_study_config,
)


def default_config() -> dict:
    with open(ROOT / "config" / "config.yaml") as f:
        return validated(yaml.safe_load(f))


def test_every_schema_key_has_description_and_default():
    def walk(node, path):
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                assert "description" in sub, f"{path}.{key} has no description"
                assert "default" in sub, f"{path}.{key} has no default"
                walk(sub, f"{path}.{key}")
            for key, sub in (node.get("$defs") or {}).items():
                walk(sub, f"$defs.{key}")

    walk(load_schema(), "config")


def test_default_config_expands_to_every_study_and_each_of_its_runs():
    config = default_config()
    runs = resolve_runs(config)
    per_study = {}
    for run_id in runs:
        study, run = run_id.split("/")
        per_study.setdefault(study, []).append(run)
    assert list(per_study) == list(config["studies"])
    for study, settings in config["studies"].items():
        if settings.get("runs"):  # (a grid study expands nodes x processes instead)
            assert per_study[study] == list(settings["runs"])


def test_layers_merge_defaults_then_study_then_run():
    runs = resolve_runs(default_config())
    ddp = runs["parallelism/ddp_2gpu"]
    assert (ddp.launcher, ddp.nproc_per_node, ddp.replicas, ddp.processes) == ("torchrun", 2, 2, 2)
    assert ddp.optimizer.name == "adamw" and ddp.optimizer.weight_decay == 0.05
    dp = runs["parallelism/dataparallel_2gpu"]
    assert (dp.processes, dp.replicas, dp.global_batch_size) == (1, 2, 64)
    bare = runs["regularization/none"]
    assert bare.optimizer.weight_decay == 0.0 and not bare.augment.random_crop
    assert runs["regularization/dropout"].model.dropout == 0.3
    b = runs["cluster_accelerate/n2xp2"]
    assert (b.dataset, b.model.name, b.device, b.backend, b.processes) == (
        "tabular",
        "mlp",
        "cpu",
        "gloo",
        4,
    )
    assert runs["grad_accumulation/accum4"].global_batch_size == 32 * 2 * 4


def test_cpu_preset_and_test_config_merge_over_the_default():
    from snakemake.utils import update_config

    for overlay in ("config/cpu.yaml", "config/fashion_mnist.yaml", ".test/config.yaml"):
        config = copy.deepcopy(default_config())
        with open(ROOT / overlay) as f:
            update_config(config, yaml.safe_load(f))
        runs = resolve_runs(validated(config))
        assert list(runs) == list(resolve_runs(default_config()))
        assert runs["optimizer/sgd"].device == ("cuda" if "fashion" in overlay else "cpu")
        assert runs["backend/nccl_b32"].backend == "nccl"  # stays, to be reported as skipped


RUN_KEYS = (
    "augment, backend, batch_size, dataset, device, early_stopping_patience, epochs, "
    "grad_accum_steps, label_smoothing, launcher, loader, model, nodes, nproc_per_node, "
    "num_workers, omp_wait_policy, optimizer, precision, replica_threads, scheduler, seed, "
    "seeds, sharding, step, test_samples, train_samples, validation_samples"
)
STUDIES = (
    "backend, batch_size, cluster_accelerate, cluster_precision, cluster_torchrun, "
    "grad_accumulation, optimizer, parallelism, precision, regularization"
)
NAME_RULE = (
    "use letters, digits, '_', '.', '-' only, starting with a letter or digit "
    "(run names become folder names and command-line words)"
)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"optimizer": {"name": "adamx"}},
            "invalid run spec:\n  studies.optimizer.runs.bad.optimizer.name: 'adamx' is not "
            "allowed; allowed: sgd, adam, adamw, rmsprop",
        ),
        (
            {"batch_size": 0},
            "invalid run spec:\n  studies.optimizer.runs.bad.batch_size: 0 is less than the "
            "minimum of 1",
        ),
        (
            {"epochs": "ten"},
            "invalid run spec:\n  studies.optimizer.runs.bad.epochs: 'ten' is not of type "
            "'integer'",
        ),
        (
            {"optimiser": {}},
            "invalid run spec:\n  studies.optimizer.runs.bad.optimiser: unknown key (did you "
            f"mean 'optimizer'?); allowed: {RUN_KEYS}",
        ),
        (
            {"launcher": "single", "nproc_per_node": 2},
            "invalid run spec:\n"
            "  studies.optimizer.runs.bad: launcher 'single' runs one process on one device, but "
            "nodes × nproc_per_node = 1 × 2; use 'dp', 'torchrun' or 'accelerate' for several",
        ),
        (
            {"precision": "fp8", "batch_size": 20},
            "invalid run spec:\n"
            "  studies.optimizer.runs.bad.batch_size: fp8 matmuls need every dimension divisible "
            "by 16, the batch too (weight gradients); got 20",
        ),
    ],
)
def test_bad_run_spec_names_the_key(override, message):
    config = default_config()
    config["studies"]["optimizer"]["runs"]["bad"] = override
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda c: c["studies"].update(paralelism={"runs": {}}),
            f"studies.paralelism: unknown key (did you mean 'parallelism'?); allowed: {STUDIES}",
        ),
        (
            lambda c: c["studies"]["backend"]["runs"].update({"a b": {}, "x'y": {}, "r;rm": {}}),
            f"studies.backend.runs: name 'a b' is not allowed: {NAME_RULE}\n"
            f'  studies.backend.runs: name "x\'y" is not allowed: {NAME_RULE}\n'
            f"  studies.backend.runs: name 'r;rm' is not allowed: {NAME_RULE}",
        ),
        (lambda c: c.update(strict="yes"), "strict: 'yes' is not of type 'boolean'"),
        (
            lambda c: c["defaults"].update(batch_size=0),
            "defaults.batch_size: 0 is less than the minimum of 1",
        ),
        (
            lambda c: c["defaults"]["optimizer"].update(name="lamb"),
            "defaults.optimizer.name: 'lamb' is not allowed; allowed: sgd, adam, adamw, rmsprop",
        ),
    ],
)
def test_bad_config_names_the_key_and_what_is_allowed(mutate, message):
    with open(ROOT / "config" / "config.yaml") as f:
        config = yaml.safe_load(f)
    mutate(config)
    with pytest.raises(SpecError) as err:
        check_config(config)
    assert str(err.value) == f"invalid config:\n  {message}"


def test_strict_refuses_runs_that_pin_the_cpu_but_need_a_gpu():
    config = default_config()
    config["strict"] = True
    config["studies"] = {
        "cluster_precision": {
            "base": {"device": "cpu", "backend": "gloo"},
            "runs": {"fp8": {"precision": "fp8"}},
        },
        "backend": {"base": {"device": "cpu"}, "runs": {"nccl": {"backend": "nccl"}}},
    }
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    assert str(err.value) == (
        "strict: true, but these runs pin device 'cpu' and ask for what only a GPU does, so "
        "they could only be skipped (set strict: false to record them as skipped):\n"
        "  studies.cluster_precision.runs.fp8.precision: 'fp8' needs a CUDA GPU, but device "
        "is 'cpu'; allowed on the CPU: fp32, fp16, bf16\n"
        "  studies.backend.runs.nccl.backend: 'nccl' needs a CUDA GPU, but device is 'cpu'; "
        "allowed on the CPU: gloo"
    )
    config["strict"] = False  # without strict they are planned, to be recorded as skipped
    assert set(resolve_runs(config)) == {"cluster_precision/fp8", "backend/nccl"}


def test_early_stopping_without_a_validation_split_is_refused_naming_both_keys():
    """Early stopping watched the test loss: the test set chose each run's last epoch."""
    config = default_config()
    runs = resolve_runs(config)
    assert runs["regularization/early_stopping"].validation_samples == 5000  # A's, by default
    assert runs["cluster_torchrun/n1xp1"].validation_samples == 0  # B's, the course's
    config["studies"]["regularization"]["runs"]["early_stopping"]["validation_samples"] = 0
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    where = "studies.regularization.runs.early_stopping"
    assert str(err.value) == (
        f"invalid run spec:\n  {where}.early_stopping_patience: 3 watches the validation loss, but "
        f"{where}.validation_samples is 0 (no validation split); hold out the last N training "
        "samples with validation_samples: N, or set early_stopping_patience: 0 (the test set "
        "never decides when to stop)"
    )


def test_replica_threads_is_a_setting_of_dataparallel_only():
    assert make_spec(launcher="dp", nproc_per_node=2, replica_threads="persistent")
    with pytest.raises(SpecError) as err:
        make_spec(launcher="torchrun", nproc_per_node=2, replica_threads="persistent")
    assert str(err.value) == (
        "invalid run spec:\n"
        "  studies.parallelism.runs.r.replica_threads: 'persistent' is a setting of launcher "
        "'dp' (nn.DataParallel); this run's launcher is 'torchrun'"
    )


def raw_config() -> dict:
    with open(ROOT / "config" / "config.yaml") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_number_that_is_not_finite_is_refused_naming_its_key(value):
    """`lr: .nan` passed the schema, launched, and failed as "Invalid learning rate: nan"."""
    config = raw_config()
    config["defaults"]["optimizer"]["lr"] = value
    with pytest.raises(SpecError, match=rf"defaults\.optimizer\.lr: {value} is not a finite"):
        check_config(config)
    config = default_config()
    config["studies"]["optimizer"]["runs"]["sgd"]["optimizer"]["lr"] = value
    with pytest.raises(SpecError, match=r"runs\.sgd\.optimizer\.lr: .* is not a finite number"):
        resolve_runs(config)


@pytest.mark.parametrize(("key", "value"), [("seeds", 2.0), ("batch_size", 32.0)])
def test_a_whole_number_written_as_a_float_is_refused_where_an_integer_is_asked(key, value):
    """`seeds: 2.0` passed the schema and failed at run time ("'float' object cannot be
    interpreted as an integer")."""
    config = raw_config()
    config["defaults"][key] = value
    with pytest.raises(SpecError) as err:
        check_config(config)
    assert str(err.value) == (
        f"invalid config:\n  defaults.{key}: {value!r} is not a whole number written as one "
        f"(write {int(value)})"
    )


def test_seeds_past_numpys_range_are_refused_before_any_job():
    """seed 4294967295 with 2 seeds trained one seed, then failed."""
    config = default_config()
    config["studies"]["optimizer"]["runs"]["sgd"]["seed"] = 2**32 - 1
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    assert str(err.value) == (
        "invalid run spec:\n"
        "  studies.optimizer.runs.sgd.seed: seeds 4294967295 to 4294967297, but a seed ends at "
        "4294967295 (2³² − 1, numpy's); use a seed of at most 4294967293"
    )
    config = raw_config()
    config["defaults"]["seed"] = 99999999999999999999
    with pytest.raises(SpecError, match=r"defaults\.seed: 99999999999999999999 is greater than"):
        check_config(config)


def test_a_baseline_that_names_no_run_is_refused_before_any_job():
    """Every run trained, then the report failed: "baseline: 'n1xp2' is not one of its runs"."""
    config = default_config()
    config["studies"]["optimizer"]["baseline"] = "n1xp2"
    with pytest.raises(SpecError) as err:
        resolve_runs(config)
    assert str(err.value) == (
        "invalid run spec:\n  studies.optimizer.baseline: 'n1xp2' is not one of its runs "
        "['sgd', 'adam', 'adamw', 'rmsprop']"
    )


def test_one_top_level_key_sets_every_runs_seeds_from_the_command_line():
    """`--config seeds=2` was an unknown key, and `--config defaults='{seeds: 2}'` failed."""
    config = default_config()
    config["studies"]["optimizer"]["runs"]["sgd"]["seeds"] = 5
    config["seeds"] = 2
    assert {spec.seeds for spec in resolve_runs(config).values()} == {2}
    config["seeds"] = None
    runs = resolve_runs(config)
    assert runs["optimizer/sgd"].seeds == 5 and runs["optimizer/adam"].seeds == 3


def test_markup_in_a_title_is_refused_before_it_reaches_snakemakes_report():
    """A study title of <script>alert(1)</script> was placed raw inside the `snakemake
    --report` page's script block, where it ran."""
    config = raw_config()
    config["studies"]["parallelism"]["title"] = "<script>alert(1)</script>"
    config["special_studies"]["profiler"]["title"] = "B4 & more"
    with pytest.raises(SpecError) as err:
        check_config(config)
    rule = "plain text (no <, > or &), as it goes into HTML and Snakemake's report"
    assert str(err.value) == (
        "invalid config:\n"
        f"  special_studies.profiler.title: 'B4 & more' is not allowed: {rule}\n"
        f"  studies.parallelism.title: '<script>alert(1)</script>' is not allowed: {rule}"
    )


def test_a_key_given_twice_in_a_config_file_is_named_with_its_lines(tmp_path):
    """YAML keeps the last of two equal keys, so the first setting silently did not apply."""
    from dmls.config.spec import config_file_problems

    path = tmp_path / "c.yaml"
    path.write_text(
        "defaults:\n  epochs: 2\n  seeds: 1\n  epochs: 3\n"
        "studies:\n  b: {base: &a {epochs: 1}}\n  c: {base: {<<: *a, epochs: 2}}\n"
    )
    assert config_file_problems(path) == [f"{path}: line 4: 'epochs' again (first at line 2)"]
    # (config.yaml's `<<:` merges are fine)
    assert config_file_problems(ROOT / "config" / "config.yaml") == []


def test_a_yaml_syntax_error_in_a_config_file_is_named_with_its_line_and_column(tmp_path):
    """Snakemake said only "Config file is not valid JSON or YAML", naming no file or line."""
    from dmls.config.spec import config_file_problems

    path = tmp_path / "c.yaml"
    path.write_text("defaults:\n  epochs: 2\n   seeds: 3\n")
    assert config_file_problems(path) == [
        f"{path}: line 3, column 9: mapping values are not allowed here (YAML syntax)"
    ]


def test_a_special_studys_settings_are_the_configs_over_the_schemas_defaults(tmp_path):
    """What the bench scripts run a study's code with (bench/lenet_recompute_memory.py,
    bench/fused_conv_time.py)."""
    config = tmp_path / "config.yaml"
    config.write_text("special_studies:\n  lenet_memory: {batch_size: 4}\n")
    cfg = special_study_config("lenet_memory", config)
    assert cfg["batch_size"] == 4  # the config's
    assert cfg["recompute"] == ["none", "selective", "full"] and cfg["steps"] == 3  # defaults
    assert special_study_config("lenet_memory")["batch_size"] == 8  # config/config.yaml
