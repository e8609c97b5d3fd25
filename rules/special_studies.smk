# The special studies (B4, C, D1-D7, A5's collectives): not training runs of the engine but small scripts over
# the same models and data, each writing results/studies/<name>/ (config `special_studies`).
# Their target list is special_study_outputs() in common.smk.


rule profile_b_model:
    """B4. torch.profiler over test batches of the B model: time and memory per module."""
    input:
        manifest=prepared_manifest("tabular"),
        arrays=prepared_arrays("tabular"),
    output:
        summary=f"{STUDIES_DIR}/profiler/summary.json",
        modules=f"{STUDIES_DIR}/profiler/modules.csv",
        measurements=f"{STUDIES_DIR}/profiler/measurements.csv",
        repeats=f"{STUDIES_DIR}/profiler/repeats.csv",
        figure=f"{STUDIES_DIR}/profiler/profile.png",
        traces=directory(f"{STUDIES_DIR}/profiler/traces"),
    log:
        f"{RESULTS}/logs/studies/profiler.log",
    conda:
        "../envs/pipeline.yaml"
    threads: timed_threads
    # Locally, the GPU it reserves, so it starts when one is free (common.smk, LOCAL_GPUS).
    resources:
        gpu=study_gpus(1),
    params:
        study="profiler",
        timed=True,  # reserves its cores and a GPU, where there is one
        cfg=config["special_studies"]["profiler"],
    script:
        "../workflow/scripts/run_special_study.py"


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


rule fused_conv_benchmark:
    """C. CNNs with cuDNN, the FusedConvReLU kernel, cuDNN disabled, and on the CPU."""
    input:
        manifest=prepared_manifest(config["special_studies"]["fused_conv"]["dataset"]),
        arrays=prepared_arrays(config["special_studies"]["fused_conv"]["dataset"]),
        extension=rules.build_fused_conv_relu.output.record,
    output:
        summary=f"{STUDIES_DIR}/fused_conv/summary.json",
        results=f"{STUDIES_DIR}/fused_conv/results.csv",
        repeats=f"{STUDIES_DIR}/fused_conv/repeats.csv",
        accuracy=f"{STUDIES_DIR}/fused_conv/accuracy.csv",
        figure=f"{STUDIES_DIR}/fused_conv/times.png",
    log:
        f"{RESULTS}/logs/studies/fused_conv.log",
    # Among the longest jobs: started before any run (dmls/config/priority.py).
    priority: LONG_STUDY
    conda:
        "../envs/pipeline.yaml"
    threads: timed_threads
    # Locally, the GPU it reserves, so it starts when one is free (common.smk, LOCAL_GPUS).
    resources:
        gpu=study_gpus(1),
    params:
        study="fused_conv",
        timed=True,  # reserves its cores and a GPU, where there is one
        cfg=config["special_studies"]["fused_conv"],
    script:
        "../workflow/scripts/run_special_study.py"


rule lenet_memory:
    """D1. LeNet-5 parameters and training memory: closed-form estimate vs measured peaks."""
    output:
        summary=f"{STUDIES_DIR}/lenet_memory/summary.json",
        parameters=f"{STUDIES_DIR}/lenet_memory/parameters.csv",
        activations=f"{STUDIES_DIR}/lenet_memory/activations.csv",
        estimate=f"{STUDIES_DIR}/lenet_memory/estimate.csv",
        measured=f"{STUDIES_DIR}/lenet_memory/measured.csv",
        figure=f"{STUDIES_DIR}/lenet_memory/memory.png",
    log:
        f"{RESULTS}/logs/studies/lenet_memory.log",
    conda:
        "../envs/pipeline.yaml"
    threads: timed_threads
    # Locally, the GPU it reserves, so it starts when one is free (common.smk, LOCAL_GPUS).
    resources:
        gpu=study_gpus(1),
    params:
        study="lenet_memory",
        timed=True,  # reserves its cores and a GPU, where there is one
        cfg=config["special_studies"]["lenet_memory"],
    script:
        "../workflow/scripts/run_special_study.py"


rule spare_failure:
    """D2. Failure probability without and with a spare: closed forms vs Monte Carlo."""
    output:
        summary=f"{STUDIES_DIR}/spare_failure/summary.json",
        vectors=f"{STUDIES_DIR}/spare_failure/vectors.csv",
        curve=f"{STUDIES_DIR}/spare_failure/curve.csv",
        figure=f"{STUDIES_DIR}/spare_failure/failure_vs_n.png",
    log:
        f"{RESULTS}/logs/studies/spare_failure.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        study="spare_failure",
        cfg=config["special_studies"]["spare_failure"],
    script:
        "../workflow/scripts/run_special_study.py"


rule float32_bytes:
    """D3. IEEE-754 bits and byte orders of a float32, computed on this host."""
    output:
        summary=f"{STUDIES_DIR}/float32_bytes/summary.json",
        table=f"{STUDIES_DIR}/float32_bytes/bytes.csv",
        figure=f"{STUDIES_DIR}/float32_bytes/bits.png",
    log:
        f"{RESULTS}/logs/studies/float32_bytes.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        study="float32_bytes",
        cfg=config["special_studies"]["float32_bytes"],
    script:
        "../workflow/scripts/run_special_study.py"


rule spark_lazy:
    """D6. Question 4's PySpark program, line by line: jobs, stages, tasks, rows per line."""
    output:
        summary=f"{STUDIES_DIR}/spark_lazy/summary.json",
        lines=f"{STUDIES_DIR}/spark_lazy/lines.csv",
        plans=f"{STUDIES_DIR}/spark_lazy/plans.txt",
    log:
        f"{RESULTS}/logs/studies/spark_lazy.log",
    conda:
        "../envs/spark.yaml"
    threads: 2  # Spark's local[2]
    params:
        study="spark_lazy",
        cfg=config["special_studies"]["spark_lazy"],
    script:
        "../workflow/scripts/run_special_study.py"


rule serialization:
    """D7. Serialization's pitfalls, run: representation, references, depth, trust."""
    output:
        summary=f"{STUDIES_DIR}/serialization/summary.json",
        representation=f"{STUDIES_DIR}/serialization/representation.csv",
        references=f"{STUDIES_DIR}/serialization/references.csv",
        depth=f"{STUDIES_DIR}/serialization/depth.csv",
        trust=f"{STUDIES_DIR}/serialization/trust.csv",
    log:
        f"{RESULTS}/logs/studies/serialization.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        study="serialization",
        cfg=config["special_studies"]["serialization"],
    script:
        "../workflow/scripts/run_special_study.py"


rule graphs:
    """D5. The course CNN eager, compiled and exported: first call, steady step, captures."""
    output:
        summary=f"{STUDIES_DIR}/graphs/summary.json",
        results=f"{STUDIES_DIR}/graphs/results.csv",
        control_flow=f"{STUDIES_DIR}/graphs/control_flow.csv",
        figure=f"{STUDIES_DIR}/graphs/graphs.png",
    log:
        f"{RESULTS}/logs/studies/graphs.log",
    # Among the longest jobs: started before any run (dmls/config/priority.py).
    priority: LONG_STUDY
    conda:
        "../envs/pipeline.yaml"
    threads: timed_threads
    # Locally, the GPU it reserves, so it starts when one is free (common.smk, LOCAL_GPUS).
    resources:
        gpu=study_gpus(1),
    params:
        study="graphs",
        timed=True,  # reserves its cores and a GPU, where there is one
        cfg=config["special_studies"]["graphs"],
    script:
        "../workflow/scripts/run_special_study.py"


rule collectives:
    """A5 explained: all-reduce, all-gather, reduce-scatter against message size."""
    output:
        summary=f"{STUDIES_DIR}/collectives/summary.json",
        table=f"{STUDIES_DIR}/collectives/collectives.csv",
        figure=f"{STUDIES_DIR}/collectives/bandwidth.png",
    log:
        f"{RESULTS}/logs/studies/collectives.log",
    # Among the longest jobs: started before any run (dmls/config/priority.py).
    priority: LONG_STUDY
    conda:
        "../envs/pipeline.yaml"
    threads: special_study_threads("collectives")
    # Under Slurm: the nodes its srun steps span, and the cores of its ranks on each.
    resources:
        nodes=collectives_resource("nodes"),
        tasks=collectives_resource("tasks"),
        mpi=collectives_resource("mpi"),
        cpus_per_task=collectives_resource("cpus_per_task"),
        mem_mb=collectives_resource("mem_mb"),
        runtime=collectives_resource("runtime"),
        # Locally, the GPUs it reserves, so it starts when they are free (common.smk).
        gpu=study_gpus(max(config["special_studies"]["collectives"]["processes"])),
    params:
        study="collectives",
        timed=True,  # reserves its cores and its GPUs, where there are any
        gpus=max(config["special_studies"]["collectives"]["processes"]),
        cfg=collectives_config(),
    script:
        "../workflow/scripts/run_special_study.py"


rule sharding:
    """D4. DDP, ZeRO-1, ZeRO-2 and ZeRO-3 through the engine: memory per rank, step time."""
    input:
        manifest=prepared_manifest(config["special_studies"]["sharding"]["dataset"]),
        arrays=prepared_arrays(config["special_studies"]["sharding"]["dataset"]),
        # After the sweep, whose table predicts the communication (and which would otherwise
        # time its collectives beside this study's training).
        collectives=(
            rules.collectives.output.table
            if config["special_studies"]["collectives"]["enabled"]
            else []
        ),
    output:
        summary=f"{STUDIES_DIR}/sharding/summary.json",
        table=f"{STUDIES_DIR}/sharding/sharding.csv",
        figure=f"{STUDIES_DIR}/sharding/memory.png",
    log:
        f"{RESULTS}/logs/studies/sharding.log",
    # Among the longest jobs: started before any run (dmls/config/priority.py).
    priority: LONG_STUDY
    conda:
        "../envs/pipeline.yaml"
    threads: special_study_threads("sharding")
    # Locally, the GPUs it reserves, so it starts when they are free (common.smk).
    resources:
        gpu=study_gpus(max(config["special_studies"]["sharding"]["processes"])),
    params:
        study="sharding",
        timed=True,  # reserves its cores and its GPUs, where there are any
        gpus=max(config["special_studies"]["sharding"]["processes"]),
        cfg=sharding_params(),
    script:
        "../workflow/scripts/run_special_study.py"
