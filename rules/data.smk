rule prepare_data:
    """Fetch or generate one dataset into results/data/<name>.npz + .json (its manifest).

    Both are always written, so the runs declare both as inputs and Snakemake reruns those whose
    data was prepared again or replaced. When the data can't be obtained the .npz is empty and
    the manifest says why: the runs that need it are skipped with that reason (or the job fails
    under `strict: true`).
    """
    input:
        # The user's own files (data.tabular.dir, data.cifar10.archive, ...): replacing one
        # prepares the data again, and reruns the runs that trained on it.
        data_source_files,
    output:
        manifest=prepared_manifest("{dataset}"),
        arrays=prepared_arrays("{dataset}"),
    log:
        f"{RESULTS}/logs/prepare_data/{{dataset}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        # A changed data config re-runs the preparation.
        cfg=lambda wildcards: config["data"][wildcards.dataset],
        # And so does a changed file, by content: a copy that keeps an older modification
        # time (cp -p, rsync -a) is as new as any other.
        sources=data_source_digests,
    script:
        "../workflow/scripts/prepare_data.py"
