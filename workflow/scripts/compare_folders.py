"""Compare results folders: the `compare` rule's script (Snakemake `script:`), and the same
from the command line (dmls/report/folders.py says what the page shows).

    python workflow/scripts/compare_folders.py results_a results_b [-o compare.html]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dmls.report import folders

if "snakemake" in globals():
    from dmls.joblog import job_log

    with job_log(snakemake.log[0]) as log:  # noqa: F821
        folders.main_from_snakemake(snakemake, log)  # noqa: F821
else:
    sys.exit(folders.main())
