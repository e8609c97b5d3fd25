"""Check config files as `snakemake --configfile` would take them, naming every problem with its
file, line and key, before Snakemake reads them.

    python3 tools/check_config.py my.yaml [more.yaml ...]

Snakemake reads a `--configfile` before the workflow runs, and says of a YAML syntax error only
"Config file is not valid JSON or YAML". This reads each file as the Snakefile reads
config/config.yaml (a syntax error, a key given twice: file, line and column), merges them over
config/config.yaml as Snakemake does (each file's keys over the ones before), and checks the
result as the workflow does before any job: the schema (`check_config`), every run
(`resolve_runs`: its keys, the constraints between them, a batch larger than a training set
whose size the config fixes) and the fault drill `DMLS_FAULT`, when set. A problem whose key a
file sets is shown at that file's line. Exits 1 when there is any, else 0 with one line:
"N runs, M special studies: ok". The data files themselves are not read: the workflow checks
them when it starts.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls.config.spec import (  # noqa: E402
    SCHEMA_PATH,
    SpecError,
    check_config,
    config_file_problems,
    resolve_runs,
)
from dmls.protocol import Fault  # noqa: E402

DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
# A problem's line begins with the dotted key path it is about.
KEY_PATH = re.compile(r"^([A-Za-z0-9_.-]+):")


def key_lines(path: Path) -> dict[str, int]:
    """Each key path a YAML file sets (dotted), with the line it is set at."""
    found: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and not key.tag.endswith(":merge"):
                dotted = f"{prefix}{key.value}"
                found.setdefault(dotted, key.start_mark.line + 1)
                walk(value, f"{dotted}.")

    walk(yaml.compose(path.read_text(), Loader=yaml.SafeLoader), "")
    return found


def locate(line: str, files: dict[Path, dict[str, int]]) -> str:
    """`line` (a problem naming a key path) prefixed with `file:line:` of the deepest key of its
    path that a file sets, the last file where several do (its keys win); as it is otherwise."""
    if not (match := KEY_PATH.match(line)):
        return line
    dotted, best = match[1], None
    for path, keys in files.items():
        for key, number in keys.items():
            if (dotted == key or dotted.startswith(f"{key}.")) and (
                best is None or len(key) >= len(best[0])
            ):
                best = (key, path, number)
    return line if best is None else f"{best[1]}:{best[2]}: {line}"


def read_files(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Each file's mapping, and what is wrong with the files (none may be merged while any
    can't be read)."""
    problems, loaded = [], []
    for path in paths:
        if not path.is_file():
            problems.append(f"{path}: no such file")
            continue
        problems += config_file_problems(path)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue  # (config_file_problems named its line)
        if not isinstance(data, dict):
            problems.append(f"{path}: holds no mapping of keys at its top level, as a config must")
        loaded.append(data)
    return loaded, problems


def check(paths: list[Path]) -> tuple[list[str], str]:
    """Every problem of the config files `paths` over config/config.yaml, each a line; and,
    when there is none, the summary."""
    files = [DEFAULT_CONFIG, *paths]
    loaded, problems = read_files(files)
    if len(loaded) < len(files) or any(not isinstance(d, dict) for d in loaded):
        return problems, ""
    from snakemake.utils import update_config, validate

    # As Snakemake merges them: the --configfiles in order, then the workflow's config under
    # them (its keys, and so the runs, in the order this gives).
    overwrite: dict = {}
    for overlay in loaded[1:]:
        update_config(overwrite, copy.deepcopy(overlay))
    config = copy.deepcopy(overwrite)
    update_config(config, loaded[0])
    update_config(config, overwrite)
    try:
        check_config(config)
        validate(config, str(SCHEMA_PATH))  # the schema's defaults, as the Snakefile fills them
        runs = resolve_runs(config)
    except SpecError as e:
        where = {path: key_lines(path) for path in files}
        for line in str(e).splitlines():
            indent = line[: len(line) - len(line.lstrip())]
            problems.append(indent + locate(line.lstrip(), where))
        return problems, ""
    try:  # the fault drill, as the workflow checks it when it starts
        if (fault := Fault.from_env()) is not None:
            fault.check_run_exists(runs)
    except ValueError as e:
        return [*problems, str(e)], ""
    special = sum(1 for study in config["special_studies"].values() if study["enabled"])
    return problems, f"{len(runs)} runs, {special} special studies: ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configfile", nargs="+", type=Path, help="as given to --configfile")
    args = parser.parse_args(argv)
    problems, summary = check(args.configfile)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
