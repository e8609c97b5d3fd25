"""Two or more results folders side by side: one self-contained HTML page.

    python workflow/scripts/compare_folders.py results_h100 results_a100 [-o compare.html]
    snakemake compare --config compare='[results_h100, results_a100]'

Each folder holds runs/<study>/<run>/metrics.json (from any machine). The first folder is the
reference. Per study and run: the numbers of every folder (means over seeds ± their 95%
interval), each other folder's throughput over the steady epochs as a ratio to the reference's
(the report's convention: > 1 is faster) and its test accuracy as a difference in points,
with Welch's interval where both sides have repeats (dmls/stats.py, as the report's
observations); the runs only some folders have, one line per study and folder; where
a run's specs differ (then it is not the same experiment: the keys are named); each folder's
hosts and versions; and, per study, whether the report's conclusions agree: each run against
the study's baseline, faster, slower or within seed noise, in every folder
(dmls/report/observations.baseline_comparisons, the code of the report's own observations).
The baseline is the one the folder's own report used (report/<study>/section.json); in a
folder that keeps no report, the study's `baseline` in the config (`--config`, by default
the repository's config/config.yaml, where the report takes it from too); the page says which.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import yaml

from dmls import record
from dmls.files import atomic_write, read_json
from dmls.report import observations, quantities
from dmls.report.cells import FORMATS, bounds_of, cell
from dmls.report.page import hosts
from dmls.report.study import OK, Study
from dmls.report.wording import ratio_strings

ROOT = Path(__file__).resolve().parents[4]
TEMPLATE = ROOT / "report" / "compare.html.j2"
CONFIG = ROOT / "config" / "config.yaml"
CSS = TEMPLATE.with_name("report.css")
SHOWN = [
    ("test_accuracy", "test acc. (%)"),
    ("steady_epoch_s", "steady epoch (s)"),
    ("samples_per_s", "samples/s (steady epoch)"),
    ("peak_gpu_mem_allocated_bytes", "peak GPU mem. (MiB)"),
    ("steady_epoch_energy_j", "GPU energy, steady epoch (J)"),  # (empty where not measured)
]


class CompareError(ValueError):
    """A folder that can't be compared (names it)."""


def load(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """A results folder's metrics, by study, in run-name order."""
    paths = sorted(Path(folder).glob("runs/*/*/metrics.json"))
    if not paths:
        raise CompareError(f"{folder}: no runs/<study>/<run>/metrics.json in it")
    by_study: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        metrics = record.read(path)
        by_study.setdefault(metrics["study"], []).append(metrics)
    return by_study


def spec_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The dotted spec keys whose values differ between two runs' specs."""
    flat = pd.json_normalize([a, b], sep=".").drop(columns=["study", "run"], errors="ignore")
    return [c for c in flat.columns if str(flat[c].iloc[0]) != str(flat[c].iloc[1])]


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two runs' records: their spec keys, and the data they trained on
    (the prepared arrays' SHA-256, where both recorded it)."""
    found = spec_differences(a["spec"], b["spec"])
    digests: list[Any] = [(m.get("data") or {}).get("sha256") for m in (a, b)]  # str or None
    if None not in digests and digests[0] != digests[1]:
        found.append(f"data (sha256 {digests[0][:12]}… vs {digests[1][:12]}…)")
    return found


def report_baseline(folder: Path, study: str) -> str | None:
    """The baseline the folder's own report compared the study against (its section.json),
    None where the folder holds no report."""
    path = Path(folder) / "report" / study / "section.json"
    return read_json(path).get("baseline") if path.exists() else None


def common_baseline(
    present: dict[str, list[dict[str, Any]]],
    reported: Sequence[str | None] = (),
    configured: str | None = None,
) -> tuple[str | None, str]:
    """The run every folder's study is compared against, and where it comes from: the
    baseline the reference folder's report used (`reported`, per folder) where every folder
    has that run; else the config's (`configured`, the study's `baseline` key, as the report
    picks it); else, of the runs all folders have, the one with the fewest workers (then by
    name). None when the folders share no run."""
    names = [{m["run"] for m in ms} for ms in present.values()]
    shared = set.intersection(*names)
    if not shared:
        return None, "the folders share no run"
    for baseline in reported:
        if baseline in shared:
            return baseline, "the baseline of the folder's own report"
    if configured in shared:
        return configured, "the study's baseline in the config (the folders keep no report)"
    first = next(iter(present.values()))
    workers = {m["run"]: m["derived"]["replicas"] for m in first}
    chosen = min(shared, key=lambda run: (workers[run], run))
    return chosen, "no report or config names one: the shared run with the fewest workers"


def configured_baselines(config: Path | dict[str, Any] | None) -> dict[str, str]:
    """Each study's `baseline` in a config (a file or its dict), by study."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        if not Path(config).exists():
            raise CompareError(f"--config {config}: no such file")
        config = yaml.safe_load(Path(config).read_text()) or {}
    studies = config.get("studies") or {}
    return {k: v["baseline"] for k, v in studies.items() if (v or {}).get("baseline")}


def _numbers(study: Study, run: str) -> list[str]:
    row = study.runs.loc[run]
    ok = row["status"] == OK
    return [
        cell(
            row.get(col), FORMATS[col], shown=ok, ci95=row.get(f"{col}_ci95"), bounds=bounds_of(col)
        )
        if ok
        else row["status"]
        for col, _ in SHOWN
    ]


def _against(study: Study, run: str, ref: Study, differs: Sequence[str] = ()) -> list[str]:
    """Throughput as a ratio to the reference's (> 1: faster), accuracy in points; where the
    two runs' specs or data differ (`differs`, the keys), the numbers without a verdict: the
    difference is not the compared setting's alone."""
    if study.runs.at[run, "status"] != OK or ref.runs.at[run, "status"] != OK:
        return ["", ""]
    out = []
    for metric in ("samples_per_s", "test_accuracy"):
        comparison = quantities.between(study, run, ref, metric)
        if comparison is None:
            out.append("")
            continue
        if differs:
            keys = ", ".join(dict.fromkeys(d.split(" (")[0] for d in differs))
            why = f"not the same experiment ({keys} differ)"
            comparison = replace(comparison, untold=why)
        if quantities.kind(metric) == "ratio":
            out.append(observations.ratio_text(comparison, *observations.WORDS[metric]))
        else:
            out.append(observations.points_text(comparison))
    return out


def _ratio(ratio: quantities.Comparison) -> str:
    """'1.62× (95% interval 1.55–1.70×)' (the verdict stands before it)."""
    value, interval = ratio_strings(ratio)
    return f"{value} (95% interval {interval})" if interval else value


def conclusions(studies: dict[str, Study]) -> list[str]:
    """Per run against its study's baseline (throughput), in every folder: agree or not."""
    per_folder = {name: observations.baseline_comparisons(s) for name, s in studies.items()}
    first = next(iter(studies.values()))
    runs = [r for r in first.runs.index if all(r in c for c in per_folder.values())]
    lines = []
    for run in runs:
        parts, verdicts = [], set()
        for name, comparisons in per_folder.items():
            throughput = comparisons[run][0]
            verdicts.add(observations.verdict(throughput))
            parts.append(f"{observations.verdict(throughput)} on {name}, {_ratio(throughput)}")
        if any(differences(first.metrics[run], s.metrics[run]) for s in studies.values()):
            agree = "whether they agree, not judged: not the same experiment in every folder"
        elif any(c[run][0].finding == quantities.TOO_FEW for c in per_folder.values()):
            agree = "whether they agree, not judged without a verdict on each"
        else:
            agree = "they agree" if len(verdicts) == 1 else "they DISAGREE"
        lines.append(
            f"{run}'s throughput against {first.baseline}'s: " + "; ".join(parts) + f": {agree}."
        )
    return lines


def _rows(
    runs: list[str], studies: dict[str, Study], names: list[str]
) -> tuple[list[list[Any]], list[str], dict[str, list[str]]]:
    """One study's table rows, a run per folder that has it (each against the reference's
    run, `names[0]`), the runs that differ from the reference's in their spec, and per folder
    the runs it lacks."""
    ref_name = names[0]
    ref = studies.get(ref_name)
    rows, different = [], []
    absent: dict[str, list[str]] = {}  # folder -> the study's runs it lacks
    for run in runs:
        holders = [n for n, s in studies.items() if run in s.runs.index]
        for name in names:
            if name not in holders:
                absent.setdefault(name, []).append(run)
        for name in holders:
            study = studies[name]
            diff, against = [], ["", ""]
            if ref is not None and name != ref_name and run in ref.runs.index:
                diff = differences(ref.metrics[run], study.metrics[run])
                against = _against(study, run, ref, diff)
                if diff:
                    keys = ", ".join(diff)
                    different.append(
                        f"{run} on {name}: differs from {ref_name} in {keys} (not the same "
                        "experiment)"
                    )
            rows.append([run, name, *_numbers(study, run), *against, ", ".join(diff)])
    return rows, different, absent


def compare(
    folders: list[Path],
    names: list[str] | None = None,
    config: Path | dict[str, Any] | None = CONFIG,
) -> dict[str, Any]:
    """Everything the page shows, computed from the folders' metrics (the first is the
    reference); `config` gives each study's baseline where a folder keeps no report."""
    if len(folders) < 2:
        raise CompareError(f"compare needs two or more results folders, got {len(folders)}")
    names = names or [Path(f).resolve().name for f in folders]
    if len(set(names)) != len(names):  # same folder names: tell them apart by position
        names = [f"{i + 1}: {n}" for i, n in enumerate(names)]
    loaded = {name: load(folder) for name, folder in zip(names, folders, strict=True)}
    configured = configured_baselines(config)
    paths = dict(zip(names, folders, strict=True))
    ref_name = names[0]
    all_studies = list(dict.fromkeys(s for by in loaded.values() for s in by))
    # How much jobs of identical settings differ in speed, from every folder's A/A jobs: each
    # speed compared between two runs, of one folder or two, counts it (quantities.compare).
    noise = quantities.job_noise(*([m for ms in by.values() for m in ms] for by in loaded.values()))
    sections = []
    for key in all_studies:
        present = {name: by[key] for name, by in loaded.items() if key in by}
        reported = [report_baseline(paths[name], key) for name in present]
        baseline, source = common_baseline(present, reported, configured.get(key))
        settings = {"baseline": baseline}
        studies = {
            name: replace(Study.from_metrics(key, settings, ms), job_noise=noise)
            for name, ms in present.items()
        }
        runs = list(dict.fromkeys(m["run"] for ms in present.values() for m in ms))
        rows, different, absent = _rows(runs, studies, names)
        same = [n for n in studies if n in names]
        agree = conclusions({n: studies[n] for n in same}) if len(same) >= 2 else []
        only = [
            f"{len(lacking)} of {len(runs)} runs not in {name}: {', '.join(lacking)}"
            if len(lacking) < len(runs)
            else f"{name} has no run of this study"
            for name, lacking in absent.items()
        ]
        sections.append(
            {
                "key": key,
                "rows": rows,
                "only": only,
                "different": different,
                "conclusions": agree,
                "folders": same,
                "baseline": baseline,
                "baseline_source": source,
            }
        )
    columns = [
        "run",
        "folder",
        *(h for _, h in SHOWN),
        f"samples/s vs {ref_name} (> 1: faster)",
        f"test acc. vs {ref_name}",
        "spec differs in",
    ]
    machines = {name: hosts([m for ms in by.values() for m in ms]) for name, by in loaded.items()}
    return {
        "folders": dict(zip(names, map(str, folders), strict=True)),
        "reference": ref_name,
        "columns": columns,
        "shown": len(SHOWN),
        "sections": sections,
        "hosts": machines,
    }


def render(result: dict[str, Any]) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE.parent),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(TEMPLATE.name).render(**result, css=CSS.read_text())


def write(
    folders: list[Path],
    out: Path,
    names: list[str] | None = None,
    config: Path | dict[str, Any] | None = CONFIG,
) -> dict[str, Any]:
    result = compare(folders, names, config)
    page = render(result)
    atomic_write(out, lambda f: f.write(page.encode()))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="results folders, reference first")
    parser.add_argument(
        "-o",
        "--out",
        default="compare.html",
        help="the page to write; a folder (existing, or written with a "
        "trailing /) gets compare.html in it",
    )
    parser.add_argument("--names", nargs="+", help="a label per folder (default: its name)")
    parser.add_argument(
        "--config",
        type=Path,
        default=CONFIG,
        help="the config the folders were made with: each study's baseline "
        "where a folder keeps no report (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    folder = args.out.endswith(("/", os.sep))  # (Path drops the slash that says "a folder")
    args.out = Path(args.out)
    if folder or args.out.is_dir():
        args.out.mkdir(parents=True, exist_ok=True)
        args.out = args.out / "compare.html"
    try:
        result = write(args.folders, args.out, args.names, args.config)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for section in result["sections"]:
        for line in section["only"] + section["different"] + section["conclusions"]:
            print(f"{section['key']}: {line}")
    print(f"wrote {args.out}")
    return 0


def main_from_snakemake(snakemake: Any, log: Any) -> None:
    """Entry of the `compare` rule (workflow/scripts/compare_folders.py)."""
    result = write(
        [Path(f) for f in snakemake.params.folders],
        Path(snakemake.output.html),
        config=snakemake.config,
    )
    for section in result["sections"]:
        for line in section["only"] + section["different"] + section["conclusions"]:
            print(f"{section['key']}: {line}", file=log)
