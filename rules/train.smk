rule train:
    """One run of one study: launcher, device, precision... all come from its run spec."""
    input:
        manifest=dataset_manifest,
    output:
        metrics=f"{RESULTS}/runs/{{study}}/{{run}}/metrics.json",
    log:
        f"{RESULTS}/runs/{{study}}/{{run}}/train.log",
    conda:
        "../envs/pipeline.yaml"
    # Runs are timed and compared: each takes every core Snakemake may use, so no two runs
    # (or any other job) share cores or GPUs. Snakemake does not assign GPU ids; the GPU
    # resource lets a cluster executor request the cards and `--resources gpu=N` cap them.
    threads: workflow.cores if config["exclusive_runs"] else 1
    resources:
        gpu=requested_gpus,
    params:
        # The resolved spec is a param, so changing a run's config re-runs that run only.
        spec=spec_json,
    script:
        "../workflow/scripts/run_experiment.py"
