rule aggregate_runs:
    """One row per run: its config, how it ended (ok/skipped/failed/diverged) and its numbers
    (means over its seeds, with 95% intervals); and one row per seed."""
    input:
        metrics=all_run_metrics(),
    output:
        table=f"{RESULTS}/runs.csv",
        seeds=f"{RESULTS}/seeds.csv",
    log:
        f"{RESULTS}/logs/aggregate_runs.log",
    conda:
        "../envs/pipeline.yaml"
    script:
        "../workflow/scripts/aggregate_runs.py"
