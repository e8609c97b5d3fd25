# The report: one section per study (tables, observations, figures), then one HTML page.
# Figures and tables are also marked for `snakemake --report` (captions in report/*.rst; the
# figures' words come from report/captions.yaml, which the HTML report shows too).


rule report_study:
    """One study's section: what varied, results, observations and figures, from its runs."""
    input:
        metrics=study_metrics,
        compared=compared_metrics,
        # The DAG's A/A jobs: how much identical jobs' speeds differ (dmls.report.quantities).
        identical=identical_jobs_metrics,
        collectives=collectives_table,
        # The questions' answer templates (dmls.report.answers).
        texts="report/studies.yaml",
    output:
        section=f"{RESULTS}/report/{{study}}/section.json",
        table=report(
            f"{RESULTS}/report/{{study}}/results.csv",
            caption="../report/results.rst",
            category=study_title,
            subcategory="Tables",
            labels={"table": "results"},
        ),
        figures=report(
            directory(f"{RESULTS}/report/{{study}}/figures"),
            patterns=["{figure}.png"],
            caption="../report/figure.rst",
            category=study_title,
            subcategory="Figures",
            labels={"figure": "{figure}"},
        ),
        curves=report(
            directory(f"{RESULTS}/report/{{study}}/curves"),
            patterns=["{run}.png"],
            caption="../report/curves.rst",
            category=study_title,
            subcategory="Training curves",
            labels=curve_labels,
        ),
    log:
        f"{RESULTS}/logs/report_study/{{study}}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        study=lambda wildcards: wildcards.study,
        settings=lambda wildcards: config["studies"][wildcards.study],
        compare_with=lambda wildcards: config["studies"][wildcards.study].get(
            "compare_with"
        ),
        compare_settings=lambda wildcards: config["studies"].get(
            config["studies"][wildcards.study].get("compare_with"), {}
        ),
        labels=lambda wildcards: STUDY_LABELS[wildcards.study],
        # Each figure's caption in Snakemake's report (report/figure.rst prints it).
        captions=figure_captions,
    script:
        "../workflow/scripts/report_study.py"


rule render_report:
    """The one self-contained HTML page: header, every study's section, the all-runs table."""
    input:
        sections=expand(f"{RESULTS}/report/{{study}}/section.json", study=STUDY_RUNS),
        specials=special_study_outputs(),
        runs=rules.aggregate_runs.output.table,
        seeds=rules.aggregate_runs.output.seeds,
        metrics=all_run_metrics(),
        manifests=all_manifests(),
        template="report/report.html.j2",
        special="report/special.html.j2",
        captions="report/captions.yaml",
        css="report/report.css",
        texts="report/studies.yaml",
    output:
        html=f"{RESULTS}/report/report.html",
    log:
        f"{RESULTS}/logs/render_report.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        # The page embeds the configuration, so a changed config re-renders it.
        config=config,
        workflow_dir=workflow.basedir,
    script:
        "../workflow/scripts/render_report.py"


rule compare:
    """Two or more results folders side by side (config `compare`: their paths, the reference
    first): one self-contained HTML page (dmls/report/folders.py)."""
    input:
        metrics=compare_metrics,
        template="report/compare.html.j2",
        css="report/report.css",
    output:
        html=compare_page(),
    log:
        f"{RESULTS}/logs/compare.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        folders=config["compare"],
    script:
        "../workflow/scripts/compare_folders.py"
