"""C's CUDA extension, compiled before the study starts (the `build_fused_conv_relu` rule): nvcc
needs cores, not the GPU the study holds while it runs. Where it can't be built, the record says
why (the study tries again and reports it)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import IO, Any

from dmls.files import read_json
from dmls.special.fused_conv.kernels import fused_conv_relu
from dmls.special.runner import StudyIncomplete
from dmls.supervisor import launch, processes


def build_from_snakemake(snakemake: Any, log: IO[str]) -> None:
    """Entry of the `build_fused_conv_relu` rule (workflow/scripts/build_extension.py): compile
    C's CUDA extension, record how. It logs through `logging` into the rule's `log`, open
    (dmls.joblog)."""
    build_root, out = Path(snakemake.params.build_root), Path(snakemake.output.record)
    # The build runs in a process of its own, its environment given to it (one policy).
    code = (
        "import sys; from pathlib import Path\n"
        "from dmls.files import write_json\n"
        "from dmls.special.fused_conv.kernels.fused_conv_relu import prebuild\n"
        "write_json(Path(sys.argv[2]), prebuild(Path(sys.argv[1])))"
    )
    env = fused_conv_relu.build_environment(build_root, snakemake.threads)
    command = launch.Command(
        [sys.executable, "-c", code, str(build_root), str(out)], env | launch.python_path()
    )
    log.flush()
    outcome = processes.start_and_wait([command], log)
    if not outcome.ok:
        raise StudyIncomplete(f"building the extension exited with {outcome.exit_codes[0]}")
    record = read_json(out)
    logging.info("%s", record)
    if snakemake.config["strict"] and record["status"] == "failed":
        raise StudyIncomplete(f"{record['extension']}: {record['reason']}")
