# Helpers shared by the rules: the config expanded into runs, and per-run inputs/resources.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))

from dmls.spec import resolve_runs

RESULTS = config["results_dir"]
STUDIES_DIR = f"{RESULTS}/studies"
# Every run of every study, keyed "<study>/<run>"; raises (naming the key) on a bad spec.
RUNS = resolve_runs(config)


wildcard_constraints:
    study="[A-Za-z0-9_]+",
    run="[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset="cifar10|fashion_mnist|tabular|synthetic_cifar",


def run_spec(wildcards):
    return RUNS[f"{wildcards.study}/{wildcards.run}"]


def all_run_metrics():
    """The target list: one metrics file per run of every study in config."""
    return [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in RUNS]


def dataset_manifest(wildcards):
    return f"{RESULTS}/data/{run_spec(wildcards).dataset}.json"


def spec_json(wildcards):
    return run_spec(wildcards).to_json()


def requested_gpus(wildcards):
    return run_spec(wildcards).requested_gpus


def special_study_outputs():
    """The target list of the special studies (B4, C, D1-D3): each enabled one's summary."""
    return [
        f"{STUDIES_DIR}/{name}/summary.json"
        for name, cfg in config["special_studies"].items()
        if cfg["enabled"]
    ]
