"""Config → run specs: the schema's defaults, the expansion of studies, and clear errors."""

import copy

import pytest
import yaml

from conftest import EXPECTED_RUNS, ROOT, validated
from dmls.spec import SpecError, load_schema, resolve_runs


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


def test_default_config_expands_to_every_study():
    runs = resolve_runs(default_config())
    per_study = {}
    for run_id in runs:
        study = run_id.split("/")[0]
        per_study[study] = per_study.get(study, 0) + 1
    assert per_study == EXPECTED_RUNS


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
        assert len(runs) == sum(EXPECTED_RUNS.values())
        assert runs["optimizer/sgd"].device == ("cuda" if "fashion" in overlay else "cpu")
        assert runs["backend/nccl_b32"].backend == "nccl"  # stays, to be reported as skipped


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"optimizer": {"name": "adamx"}},
            "studies.optimizer.runs.bad.optimizer.name: 'adamx' is not one of",
        ),
        (
            {"batch_size": 0},
            "studies.optimizer.runs.bad.batch_size: 0 is less than the minimum of 1",
        ),
        ({"epochs": "ten"}, "studies.optimizer.runs.bad.epochs: 'ten' is not of type 'integer'"),
        ({"optimiser": {}}, "Additional properties are not allowed ('optimiser' was unexpected)"),
        ({"launcher": "single", "nproc_per_node": 2}, "launcher 'single' runs one process"),
        (
            {"precision": "fp8", "batch_size": 20},
            "studies.optimizer.runs.bad.batch_size: fp8 matmuls need every dimension divisible "
            "by 16, the batch too (weight gradients); got 20",
        ),
    ],
)
def test_bad_run_spec_names_the_key(override, message):
    config = default_config()
    config["studies"]["optimizer"]["runs"]["bad"] = override
    with pytest.raises(SpecError, match=None) as err:
        resolve_runs(config)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["studies"].update(paralelism={"runs": {}}), "'paralelism' was unexpected"),
        (lambda c: c["studies"]["backend"]["runs"].update({"a b;rm": {}}), "does not match"),
        (lambda c: c.update(strict="yes"), "'yes' is not of type 'boolean'"),
    ],
)
def test_bad_config_fails_schema_validation(mutate, message):
    from snakemake.exceptions import WorkflowError

    with open(ROOT / "config" / "config.yaml") as f:
        config = yaml.safe_load(f)
    mutate(config)
    with pytest.raises(WorkflowError) as err:
        validated(config)
    assert message in str(err.value)
