"""The run spec and the config schema, read at Snakemake parse time: no torch here."""
