"""Snakemake `script:` entry point: prepare one dataset into <out_dir>/<name>.{npz,json}."""

import logging
import sys
from pathlib import Path

# Snakemake runs this file directly, so the dmls package next to it is not importable yet.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dmls.data import datasets

smk = snakemake  # noqa: F821 (injected by Snakemake)
logging.basicConfig(
    filename=smk.log[0], level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
)
name = smk.wildcards.dataset
manifest_path = Path(smk.output.manifest)
if manifest_path.name != f"{name}.json":
    raise ValueError(f"output.manifest must be <out_dir>/{name}.json, got {manifest_path}")
try:
    datasets.prepare(
        name,
        smk.config["data"].get(name, {}),
        manifest_path.parent,
        smk.config.get("strict", False),
    )
except Exception:
    logging.exception("preparing %s failed", name)
    raise
