rule train:
    """One run of one study: launcher, device, precision... all come from its run spec."""
    input:
        manifest=dataset_manifest,
        arrays=dataset_arrays,
    output:
        metrics=f"{RESULTS}/runs/{{study}}/{{run}}/metrics.json",
    log:
        f"{RESULTS}/runs/{{study}}/{{run}}/train.log",
    # The job's whole wall time, Snakemake's own start of the script included (the run's
    # metrics time the launcher and the ranks); bench/dag_table.py reads both.
    benchmark:
        f"{RESULTS}/benchmarks/train/{{study}}/{{run}}.tsv"
    # Longest first, where jobs wait for cores or GPUs (dmls/config/priority.py).
    priority: train_priority
    conda:
        "../envs/pipeline.yaml"
    # Runs are timed and compared: locally each takes every core Snakemake may use, so no two
    # runs (or any other job) share cores or GPUs; on Slurm each gets the CPUs it asked for.
    # Snakemake does not assign GPU ids; locally it counts them (`gpu`, LOCAL_GPUS in
    # common.smk, or `--resources gpu=N`) and the job reserves which (supervisor/slots.py).
    threads: run_threads
    # What the run asks Slurm for, derived from its spec and the config's `cluster` section.
    resources:
        nodes=run_resource("nodes"),
        tasks=run_resource("tasks"),
        mpi=run_resource("mpi"),
        cpus_per_task=run_resource("cpus_per_task"),
        mem_mb=run_resource("mem_mb"),
        runtime=run_resource("runtime"),
        gpu=run_gpus,
        gres=run_resource("gres"),
        tasks_per_gpu=run_resource("tasks_per_gpu"),
    params:
        # The resolved spec is a param, so changing a run's config re-runs that run only.
        spec=spec_json,
    script:
        "../workflow/scripts/train.py"
