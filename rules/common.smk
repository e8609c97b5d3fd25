# Helpers shared by the rules: the config expanded into runs, and per-run inputs/resources.

from dmls.spec import resolve_runs

RESULTS = config["results_dir"]
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
