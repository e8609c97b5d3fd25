# Rebuilds every experiment of the Distributed ML Systems course from one DAG.
# config key -> rule -> script: studies live in config/config.yaml, runs are expanded in
# rules/common.smk, and every run is the same engine (workflow/scripts/dmls/training/trainer.py).

import sys
from pathlib import Path

from snakemake.utils import min_version, update_config, validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))

from dmls.config.spec import SpecError, check_config, config_file_problems, yaml_scalars

min_version("9.0")


# A YAML syntax error or a key given twice, with its file and line, before Snakemake reads the
# file. (A --configfile with a syntax error fails earlier, in Snakemake's command line, which
# names neither: tools/check_config.py does.)
for _path in ["config/config.yaml", *workflow.overwrite_configfiles]:
    if _problems := config_file_problems(Path(_path)):
        raise SpecError("invalid config file:\n  " + "\n  ".join(_problems))


configfile: "config/config.yaml"


# A nested `--config` value's numbers and booleans, read as a config file's are (Snakemake
# reads them as strings: `--config 'defaults={epochs: 3}'` would give epochs '3').
update_config(config, yaml_scalars(dict(workflow.config_settings.config)))


# Every config error at once, each naming its key and what is allowed there; then Snakemake's
# validate fills in the schema's defaults.
check_config(config)
validate(config, "config/schemas/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"
include: "rules/special_studies.smk"


# Under a cluster executor, collecting the runs' files takes a second: no job to queue for.
localrules:
    aggregate_runs,


rule all:
    default_target: True
    input:
        rules.aggregate_runs.output.table,
        rules.render_report.output.html,
        special_study_outputs(),
