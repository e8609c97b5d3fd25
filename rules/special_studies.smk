# The special studies (B4, C, D1-D7, A5's collectives): not training runs of the engine but small
# scripts over the same models and data, each writing results/studies/<name>/ (config
# `special_studies`). One rule per study, made from its job's declaration (`JOB` in
# dmls/special/<name>/__init__.py: outputs, cores, GPUs, data, the studies it reads); their
# target list is special_study_outputs() in common.smk.


rule build_fused_conv_relu:
    """C's CUDA extension, compiled before the study starts: nvcc needs cores, not the GPU the
    study holds while it runs. Where it can't be built, the record says why (the study tries
    again and reports it)."""
    output:
        record=f"{RESULTS}/build/fused_conv_relu.json",
    log:
        f"{RESULTS}/logs/build/fused_conv_relu.log",
    conda:
        "../envs/pipeline.yaml"
    threads: 2  # two sources (the C++ binding, the CUDA kernels); fewer if --cores is lower
    params:
        build_root=f"{RESULTS}/build/torch_extensions",
    script:
        "../workflow/scripts/build_extension.py"


for _study, _job in SPECIAL_JOBS.items():

    rule:
        name:
            _study
        input:
            **special_study_inputs(_study),
        output:
            **special_study_files(_study),
        log:
            f"{RESULTS}/logs/studies/{_study}.log",
        # The longest jobs start before any run (dmls/config/priority.py).
        priority: LONG_STUDY if _job.long else 0
        conda:
            f"../envs/{_job.environment}.yaml"
        threads: special_study_threads(_study)
        # Locally, the GPUs it reserves, so it starts when they are free (common.smk,
        # LOCAL_GPUS); under Slurm, what its job asks for.
        resources:
            **special_study_resources(_study),
        params:
            study=_study,
            timed=_job.timed,  # reserves its cores and GPUs, where there are any
            gpus=special_study_gpus(_study),
            cfg=special_study_config(_study),
        script:
            "../workflow/scripts/run_special_study.py"
