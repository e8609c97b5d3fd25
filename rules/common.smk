# Helpers shared by the rules: the config expanded into runs, and per-run inputs/resources.

import hashlib
import re
import time

from snakemake.exceptions import WorkflowError

# Parse time imports only what declares the DAG, none of it torch or matplotlib
# (tests/test_layers.py): the config, the datasets' file layout, the figure captions, the
# Slurm resources of a run and the count of this host's GPUs.
from dmls import hooks
from dmls.config.priority import LONG_STUDY, run_priority
from dmls.config.spec import load_schema, resolve_runs
from dmls.config.studies import baseline_run, identical_runs, run_labels
from dmls.data import datasets
from dmls.report import captions
from dmls.supervisor import slots
from dmls.special.jobs import JOBS as SPECIAL_JOBS
from dmls.supervisor.slurm import job_resources, study_job_resources

RESULTS = config["results_dir"]
CONFIG_SCHEMA = load_schema()
STUDIES_DIR = f"{RESULTS}/studies"
# Every run of every study, keyed "<study>/<run>"; raises (naming the key) on a bad spec.
RUNS = resolve_runs(config)
# A data path that names nothing, or files its preparation could not read, stop here, naming
# the key, before any job: a failed prepare_data would queue every run of its data again.
if _bad_data := datasets.source_problems(
    config["data"], f"{RESULTS}/data/.sources-read"
):
    raise WorkflowError("invalid config:\n  " + "\n  ".join(_bad_data))
# Study -> its run ids, in config order; only studies with runs get a report section.
STUDY_RUNS = {}
for _run_id, _spec in RUNS.items():
    STUDY_RUNS.setdefault(_spec.study, []).append(_run_id)
# Study -> run -> the settings that vary within the study (labels in Snakemake's report).
STUDY_LABELS = {
    study: run_labels({RUNS[r].run: RUNS[r].to_dict() for r in run_ids})
    for study, run_ids in STUDY_RUNS.items()
}


wildcard_constraints:
    study="[A-Za-z0-9_]+",
    run="[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset="cifar10|fashion_mnist|tabular|synthetic_cifar",


def run_spec(wildcards):
    return RUNS[f"{wildcards.study}/{wildcards.run}"]


def train_priority(wildcards):
    """A run's priority: the longest start first (dmls/config/priority.py)."""
    return run_priority(run_spec(wildcards), config.get("data") or {}, CONFIG_SCHEMA)


def all_run_metrics():
    """The target list: one metrics file per run of every study in config."""
    return [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in RUNS]


def prepared_manifest(dataset):
    """A dataset's manifest, as `prepare_data` writes it (dmls.data.datasets.prepared_files)."""
    return f"{RESULTS}/data/{dataset}.json"


def prepared_arrays(dataset):
    """A dataset's arrays, as `prepare_data` writes them: an empty file where its
    manifest says the data is unavailable (its runs are skipped with the reason)."""
    return f"{RESULTS}/data/{dataset}.npz"


def all_manifests():
    """The manifest of every dataset some run uses."""
    return sorted({prepared_manifest(spec.dataset) for spec in RUNS.values()})


def data_source_files(wildcards):
    """The files of the user's that a dataset is prepared from (dmls.data.datasets)."""
    return datasets.source_files(
        wildcards.dataset, config["data"].get(wildcards.dataset, {})
    )


def data_source_digests(wildcards):
    """The SHA-256 of each of the user's files a dataset is prepared from, by path."""
    return datasets.source_digests(
        wildcards.dataset, config["data"].get(wildcards.dataset, {})
    )


def dataset_manifest(wildcards):
    return prepared_manifest(run_spec(wildcards).dataset)


def dataset_arrays(wildcards):
    """The arrays a run trains on: preparing them again (or replacing them) reruns it."""
    return prepared_arrays(run_spec(wildcards).dataset)


def spec_json(wildcards):
    return run_spec(wildcards).to_json()


def study_metrics(wildcards):
    """The metrics files of one study's runs, in config order."""
    return [
        f"{RESULTS}/runs/{run_id}/metrics.json"
        for run_id in STUDY_RUNS[wildcards.study]
    ]


# The runs another run repeats in every setting (A/A jobs): every study's section reads them,
# to count how much two jobs of identical settings differ in each speed it compares.
IDENTICAL_RUNS = identical_runs(
    {run_id: spec.to_dict() for run_id, spec in RUNS.items()}
)


def identical_jobs_metrics(wildcards):
    """The metrics files of the DAG's A/A jobs (`IDENTICAL_RUNS`)."""
    return [f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in IDENTICAL_RUNS]


def compared_metrics(wildcards):
    """The runs of the study named by `compare_with` (none when it is unset or has no runs)."""
    other = config["studies"][wildcards.study].get("compare_with")
    return [
        f"{RESULTS}/runs/{run_id}/metrics.json" for run_id in STUDY_RUNS.get(other, [])
    ]


# Report-flag arguments. Snakemake calls them with the wildcards of each reported file (for a
# directory, those of its `patterns`), so the study comes from the job's params.
def study_title(wildcards, params):
    return params.settings.get("title") or params.study


def curve_labels(wildcards, params):
    return params.labels[wildcards.run]


# The figure captions (report/captions.yaml), the same words as in the HTML report.
CAPTIONS = captions.load(Path(workflow.basedir) / "report" / "captions.yaml")


def figure_captions(wildcards):
    """Every figure kind's caption for one study in Snakemake's report, with the study's
    baseline (as dmls.report.study.Study picks it) and the study it is compared with."""
    settings = config["studies"][wildcards.study]
    runs = [RUNS[run_id].run for run_id in STUDY_RUNS[wildcards.study]]
    return captions.for_snakemake_report(
        CAPTIONS,
        baseline=baseline_run(settings, runs),
        compare_with=settings.get("compare_with"),
    )


def special_study_outputs():
    """The target list of the special studies (B4, C, D1-D3): each enabled one's summary."""
    return [
        f"{STUDIES_DIR}/{name}/summary.json"
        for name, cfg in config["special_studies"].items()
        if cfg["enabled"]
    ]


def compare_page():
    """The `compare` rule's page, one per list of folders ("results_h100-vs-results_a100.html"):
    Snakemake removes a job's output before it runs, so a compare of other folders that fails
    leaves this page as it was. Folders of one name are told apart by their paths' digest.
    """
    names = [Path(f).resolve().name or "root" for f in config["compare"]]
    name = "-vs-".join(re.sub(r"[^\w.+-]", "_", n) for n in names) or "compare"
    if len(set(names)) < len(names) or len(name) > 120:
        paths = "\0".join(str(Path(f).resolve()) for f in config["compare"])
        name = f"{name[:100]}-{hashlib.sha256(paths.encode()).hexdigest()[:8]}"
    return f"{RESULTS}/compare/{name}.html"


def compare_metrics(wildcards):
    """The metrics of every results folder the `compare` rule sets side by side."""
    if len(config["compare"]) < 2:
        raise ValueError(
            f"compare: {config['compare']!r}; give two or more results folders, the reference "
            "first, e.g. --config compare='[results_h100, results_a100]'"
        )
    return [
        str(p)
        for f in config["compare"]
        for p in sorted(Path(f).glob("runs/*/*/metrics.json"))
    ]


def collectives_table(wildcards):
    """The collectives sweep's table, where the sweep runs: a study's communication per step is
    predicted from it (A5's backends, B1's processes on one host); else nothing."""
    if config["special_studies"]["collectives"]["enabled"]:
        return special_study_files("collectives")["table"]
    return []


def on_cluster():
    """Whether jobs go to a cluster executor (Slurm): submitted from here, or running in one."""
    return workflow.non_local_exec or workflow.remote_exec


# Locally, with isolation, GPUs are a resource Snakemake schedules by (issue #41): a job starts
# when the GPUs it holds are free, instead of starting and then waiting for them inside its own
# reservation (supervisor/slots.py) with its cores held. `--resources gpu=N` still overrides
# the count; on a cluster the allocation does this.
LOCAL_GPUS = 0 if on_cluster() else slots.gpu_count_here()
if (
    LOCAL_GPUS
    and config["isolation"] != "none"
    and "gpu" not in workflow.global_resources
):
    workflow.global_resources["gpu"] = LOCAL_GPUS


def run_gpus(wildcards, attempt):
    """A run's `gpu` resource: its GPUs (job_resources), as many as this host has at most (a
    run that needs more starts, and is skipped with its reason); unset on a cluster."""
    gpus = run_resource("gpu")(wildcards, attempt)
    return min(gpus, LOCAL_GPUS) if gpus is not None and LOCAL_GPUS else gpus


def study_gpus(wanted):
    """A timed special study's `gpu` resource: the GPUs it reserves (`wanted`, or as many as
    this host has); none on a host without GPUs or on a cluster."""
    return None if on_cluster() else min(wanted, LOCAL_GPUS)


def run_resource(name):
    """One of the `train` rule's resources (dmls.supervisor.slurm.job_resources sizes them all), as the
    Slurm executor plugin names it."""

    def resource(wildcards, attempt):
        resources = job_resources(run_spec(wildcards), config["cluster"], attempt)
        return resources.rule_resources(on_cluster=on_cluster())[name]

    return resource


def local_threads(processes):
    """Cores of a timed job (config `isolation`) with `processes` processes' worth of cores
    (RunSpec.cpu_shares): every core Snakemake may use (`host`: nothing runs beside it),
    `cluster.cpus_per_process` per process at most `--cores` (`devices`: it reserves them and
    its GPUs, dmls/supervisor/slots.py), or one (`none`). A cluster job asks for
    `cluster.cpus_per_process` per process."""
    isolation, per_process = config["isolation"], config["cluster"]["cpus_per_process"]
    if on_cluster():
        return processes * per_process
    if isolation == "none":
        return 1
    # (workflow.cores is only known with --cores, so it is read last.)
    if isolation == "devices":
        return min(workflow.cores, processes * per_process)
    return workflow.cores


def run_threads(wildcards):
    """CPU threads of a run on each of its nodes: what a cluster job asked for, or locally
    what its processes (all on this host) get."""
    spec = run_spec(wildcards)
    if on_cluster():
        return job_resources(spec, config["cluster"]).cpus_per_task
    return local_threads(spec.cpu_shares)


# --- The special studies' rules (rules/special_studies.smk), from each study's JOB ----------


def special_study_files(name):
    """What study `name` writes into its folder: summary.json and its JOB's outputs."""
    folder = f"{STUDIES_DIR}/{name}"
    files = {"summary": f"{folder}/summary.json"}
    for key, file in SPECIAL_JOBS[name].outputs.items():
        files[key] = (
            directory(f"{folder}/{file[:-1]}")
            if file.endswith("/")
            else f"{folder}/{file}"
        )
    return files


def _studies_read(name):
    """The tables (their `table` output) of the studies `name` reads, its JOB's `after`, that
    run in this config."""
    return {
        other: special_study_files(other)["table"]
        for other in SPECIAL_JOBS[name].after
        if config["special_studies"][other]["enabled"]
    }


def special_study_inputs(name):
    """Study `name`'s inputs: its prepared data set, C's built extension, the tables of the
    studies it reads."""
    job, cfg = SPECIAL_JOBS[name], config["special_studies"][name]
    inputs = dict(_studies_read(name))
    if job.data is not None:
        dataset = cfg["dataset"] if job.data == "config" else job.data
        inputs |= {
            "manifest": prepared_manifest(dataset),
            "arrays": prepared_arrays(dataset),
        }
    if job.extension:
        inputs["extension"] = rules.build_fused_conv_relu.output.record
    return inputs


def special_study_config(name):
    """Study `name`'s config, with the path of each table it reads (`<study>_csv`) and, for A5
    explained, the model and data set the A runs train (the defaults)."""
    cfg = dict(config["special_studies"][name])
    for other, table in _studies_read(name).items():
        cfg[f"{other}_csv"] = table
    if SPECIAL_JOBS[name].a_runs_model:
        defaults = config["defaults"]
        model = {k: defaults["model"][k] for k in ("conv_channels", "fc_hidden")}
        cfg["gradient_model"] = {"dataset": defaults["dataset"], **model}
    return cfg


def special_study_gpus(name):
    """The GPUs study `name` uses: its JOB's count, or its largest number of processes."""
    gpus = SPECIAL_JOBS[name].gpus
    return (
        max(config["special_studies"][name]["processes"])
        if gpus == "processes"
        else gpus
    )


def special_study_threads(name):
    """Study `name`'s cores: a fixed count, one process's (a timed study, held like a training
    run's) or its largest number of processes' (local_threads)."""
    threads = SPECIAL_JOBS[name].threads
    if threads == "timed":
        return lambda wildcards: local_threads(1)
    if threads == "processes":
        processes = max(config["special_studies"][name]["processes"])
        return lambda wildcards: local_threads(processes)
    return threads


def special_study_resources(name):
    """Study `name`'s resources: locally the GPUs it reserves (study_gpus); under Slurm, for a
    study whose setups place ranks on Slurm nodes (its JOB's `slurm_nodes`), the nodes its srun
    steps span (2 where a setup ends in `-slurm`, one task each: with 1 node, `srun --nodes 2`
    failed) and the cores of its ranks on each (dmls.supervisor.slurm.study_job_resources).
    """
    job, cfg = SPECIAL_JOBS[name], config["special_studies"][name]
    resources = {}
    if job.gpus:
        resources["gpu"] = study_gpus(special_study_gpus(name))
    if job.slurm_nodes:
        nodes = 2 if any(s.endswith("-slurm") for s in cfg["setups"]) else 1

        def slurm(key):
            def resource(wildcards, attempt):
                asked = study_job_resources(
                    max(cfg["processes"]), nodes, config["cluster"], attempt
                )
                return asked.rule_resources(on_cluster=on_cluster())[key]

            return resource

        for key in ("nodes", "tasks", "mpi", "cpus_per_task", "mem_mb", "runtime"):
            resources[key] = slurm(key)
    return resources


# The hooks: what they do is dmls/hooks.py's (unit-tested there); here, only what they are
# handed. A hook's refusal (HookError) stops the workflow before any job, as Snakemake's own.
def hook(step, *args):
    try:
        return step(*args)
    except hooks.HookError as e:
        raise WorkflowError(str(e)) from None


# The results folder's claim (dmls.files.claim_folder), held by this Snakemake while it runs.
RESULTS_CLAIM = []


def release_results_dir():
    """Let another workflow have the results folder (the process's end would, too)."""
    while RESULTS_CLAIM:
        RESULTS_CLAIM.pop().close()


onstart:
    RESULTS_CLAIM.append(hook(hooks.claim_results_dir, workflow, RESULTS))
    hook(hooks.check_slurm_status_checks, workflow)
    hooks.watch_slurm(workflow, STARTED)
    hooks.check_fault_drill(RUNS)
    hooks.advise_bytecode_cache(config)
    hooks.advise_cores(workflow, RUNS, config["isolation"], on_cluster())
    hooks.say_what_this_host_will_run(
        workflow, RUNS, RESULTS, config, CONFIG_SCHEMA
    )
    hooks.say_what_will_be_replaced(workflow, RUNS, RESULTS)


# When this invocation started: a report older than this was built by an earlier one.
STARTED = time.time()


def say_how_it_ended(stopped):
    hooks.say_how_it_ended(
        all_run_metrics(), RESULTS, special_study_outputs(), STARTED, stopped
    )


onsuccess:
    say_how_it_ended(stopped=False)
    release_results_dir()


onerror:
    say_how_it_ended(stopped=True)
    release_results_dir()
