"""Results folders side by side (dmls/report/folders.py): ratios with intervals, runs one side
lacks, specs that differ, and whether the conclusions agree."""

import html
import re

import pytest

from dmls.files import write_json
from dmls.report import folders as folders_page
from fake_runs import epochs, fake_metrics
from test_energy import with_energy


def folder(root, name, runs):
    for m in runs:
        write_json(root / name / "runs" / m["study"] / m["run"] / "metrics.json", m)
    return root / name


@pytest.fixture
def folders(tmp_path):
    """A: single_gpu (seeds ×0.9, 1, 1.1 of 15/10/10 s epochs), ddp_2gpu at 1.62× its
    throughput, dataparallel_2gpu. B: single_gpu twice as fast (its GPU energy measured, at
    100 W), ddp_2gpu at batch 64 and 1.4× its throughput, no dataparallel_2gpu. Each folder has
    single_gpu_again, single_gpu's A/A twin at its speed: jobs of identical settings that did
    not differ, so that a speed between runs has a verdict."""
    spread = (0.9, 1.0, 1.1)
    a = folder(tmp_path, "a", [
        fake_metrics("single_gpu", launcher="single", epochs=3, history=epochs([15, 10, 10]),
                     spread=spread),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0,
                     epochs=3, history=epochs([15, 10, 10]), spread=spread),
        fake_metrics("dataparallel_2gpu", launcher="dp", nproc_per_node=2, epochs=3),
        fake_metrics("single_gpu_again", launcher="single", epochs=3, history=epochs([15, 10, 10]),
                     spread=spread),
    ])  # fmt: skip
    b = folder(tmp_path, "b", [
        with_energy(fake_metrics("single_gpu", launcher="single", epochs=3, spread=spread,
                                 history=epochs([7.5, 5, 5]), samples_per_s=2000.0), 100, 50),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=2800.0,
                     epochs=3, batch_size=64, history=epochs([15, 10, 10]), spread=spread),
        fake_metrics("single_gpu_again", launcher="single", epochs=3, spread=spread,
                     history=epochs([7.5, 5, 5]), samples_per_s=2000.0),
    ])  # fmt: skip
    return a, b


def test_two_folders_compare_with_ratios_spec_differences_and_missing_runs(folders, tmp_path):
    result = folders_page.write(list(folders), tmp_path / "c.html")
    (section,) = result["sections"]
    assert section["only"] == ["1 of 4 runs not in b: dataparallel_2gpu"]
    assert section["different"] == [
        "ddp_2gpu on b: differs from a in batch_size (not the same experiment)"
    ]
    rows = {(r[0], r[1]): r for r in section["rows"]}
    columns = result["columns"]
    # b's single_gpu: each seed twice a's samples/s: 2.00×, one convention (> 1: faster).
    faster = rows[("single_gpu", "b")][columns.index("samples/s vs a (> 1: faster)")]
    assert faster.startswith("2.00")
    assert rows[("single_gpu", "a")][columns.index("samples/s vs a (> 1: faster)")] == ""
    assert rows[("ddp_2gpu", "b")][columns.index("spec differs in")] == "batch_size"
    # Energy where a folder measured it (b's single_gpu: 100 W × 5 s × 0.9, 1, 1.1), else empty.
    energy = columns.index("GPU energy, steady epoch (J)")
    assert rows[("single_gpu", "b")][energy].startswith("500 ± ")
    assert rows[("single_gpu", "a")][energy] == ""
    # The report's own verdicts, per folder: ddp_2gpu faster than single_gpu in a (1.62×), in b
    # (1.40×); each ratio's interval over the seeds' ×0.9..1.1 spread excludes 1. b's ddp_2gpu
    # trained at another batch: whether the two folders agree is not judged (issue #55, 4),
    # nor its numbers against a's.
    line, _ = section["conclusions"]
    assert line.startswith("ddp_2gpu's throughput against single_gpu's: faster on a, 1.62×")
    assert "faster on b, 1.40×" in line
    assert line.endswith("not judged: not the same experiment in every folder.")
    ddp = rows[("ddp_2gpu", "b")]
    for text in ddp[columns.index("samples/s vs a (> 1: faster)") :][:2]:
        assert text.endswith("no verdict: not the same experiment (batch_size differ)"), text
    page = (tmp_path / "c.html").read_text()
    assert '<section id="parallelism">' in page and "Not the same experiment" in page
    assert not re.search(r">\s*(nan|NaN|None)\s*<", page)
    assert not re.search(r'(src|href)="(?!data:|#)', page)  # self-contained


def test_disagreeing_conclusions_are_named(folders, tmp_path):
    a, b = folders
    slow = fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=700.0,
                        epochs=3, history=epochs([15, 10, 10]), spread=(0.9, 1.0, 1.1))  # fmt: skip
    folder(tmp_path, "b", [slow])
    (section,) = folders_page.compare([a, b])["sections"]
    line, _ = section["conclusions"]
    assert "slower on b, 0.35×" in line and line.endswith("they DISAGREE.")


def test_a_folder_without_runs_or_a_single_folder_is_a_clear_error(folders, tmp_path, capsys):
    empty = r"empty: no runs/<study>/<run>/metrics.json"
    with pytest.raises(folders_page.CompareError, match=empty):
        folders_page.compare([folders[0], tmp_path / "empty"])
    assert folders_page.main([str(folders[0]), "-o", str(tmp_path / "x.html")]) == 2
    assert "compare needs two or more results folders, got 1" in capsys.readouterr().err


def test_the_compare_target_of_the_workflow_writes_the_page(folders, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT

    snakemake = Path(sys.executable).parent / "snakemake"
    out = tmp_path / "results"

    def compare(*pair):
        return subprocess.run(
            [str(snakemake), "compare", "--cores", "1", "--config",
             f"compare=[{','.join(map(str, pair))}]", f"results_dir={out}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    done = compare(*folders)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "compare" / "a-vs-b.html").read_text()
    assert "1 of 4 runs not in b: dataparallel_2gpu" in page
    assert "disagree" not in (out / "logs" / "compare.log").read_text()
    # Issue #55 (5): a compare of other folders that fails leaves this page as it was
    # (Snakemake removes a job's output before it runs: each list of folders has its own page).
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    failed = compare(folders[0], tmp_path / "empty")
    assert failed.returncode != 0
    assert (
        "empty: no runs/<study>/<run>/metrics.json"
        in failed.stderr + (out / "logs" / "compare.log").read_text()
    )
    assert (out / "compare" / "a-vs-b.html").read_text() == page
    assert not (out / "compare" / "a-vs-empty.html").exists()


def test_the_committed_example_folders_compare(tmp_path):
    """docs/example-report/results: the GPU example run and its isolation: host twin, as their
    README rebuilds the comparison page: both hosts, the runs the second lacks, DDP's
    throughput conclusion on both."""
    from conftest import ROOT

    results = ROOT / "docs" / "example-report" / "results"
    page = tmp_path / "compare.html"
    assert folders_page.main([str(results / "example"), str(results / "example-host"),
                         "-o", str(page)]) == 0  # fmt: skip
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text())))
    assert text.count("4 × NVIDIA H200") == 2
    assert re.search(r"\d+ of \d+ runs not in example-host: [\w, ]*dataparallel_2gpu", text)
    assert re.search(r"ddp_2gpu's throughput against single_gpu's: faster on example, "
                     r"1\.\d\d×.*faster on example-host, 1\.\d\d×.*they agree", text)  # fmt: skip


def test_runs_of_the_same_spec_on_different_data_are_not_the_same_experiment(tmp_path):
    """Synthetic data of seed 0 against seed 1 compared as the same experiment: "spec differs
    in" was empty and the page reported a difference in points."""
    runs = []
    for name, digest in (("a", "0" * 64), ("b", "f" * 64)):
        m = fake_metrics("single_gpu", launcher="single", epochs=2)
        m["data"]["sha256"] = digest
        runs.append(folder(tmp_path, name, [m]))
    result = folders_page.write(runs, tmp_path / "c.html")
    (section,) = result["sections"]
    assert section["different"] == [
        "single_gpu on b: differs from a in data (sha256 000000000000… vs ffffffffffff…) (not "
        "the same experiment)"
    ]
    # Issue #55 (4): the numbers side by side, no verdict word ("more accurate") on them.
    row = next(r for r in section["rows"] if r[1] == "b")
    accuracy = row[result["columns"].index("test acc. vs a")]
    assert accuracy.endswith(", no verdict: not the same experiment (data differ)"), accuracy
    assert "accurate" not in accuracy and "noise" not in accuracy


def test_an_output_that_names_a_folder_gets_compare_html_in_it(folders, tmp_path, capsys):
    """`-o results/` raised a bare IsADirectoryError."""
    assert folders_page.main([*map(str, folders), "-o", str(tmp_path)]) == 0
    assert (tmp_path / "compare.html").exists()
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'compare.html'}\n")
    # A folder that does not exist yet, said with a trailing slash (before: a file of that name).
    assert folders_page.main([*map(str, folders), "-o", f"{tmp_path / 'new'}/"]) == 0
    assert (tmp_path / "new" / "compare.html").is_file()


def test_a_folder_without_its_report_is_compared_against_the_configs_baseline(tmp_path):
    """Before: the example's batch-size study was compared against b128 (the first name of the
    runs with the fewest workers) while its report, and the config, use b32."""
    runs = [fake_metrics(f"b{b}", launcher="single", batch_size=b, epochs=3, spread=(0.9, 1.0, 1.1))
            for b in (128, 32)]  # fmt: skip
    a, b = folder(tmp_path, "a", runs), folder(tmp_path, "b", runs)
    config = {"studies": {"parallelism": {"baseline": "b32"}}}
    (section,) = folders_page.compare([a, b], config=config)["sections"]
    assert section["baseline"] == "b32"
    assert section["baseline_source"].startswith("the study's baseline in the config")
    assert all("against b32's" in line for line in section["conclusions"])
    (section,) = folders_page.compare([a, b], config=None)["sections"]
    assert (section["baseline"], section["baseline_source"]) == (
        "b128",
        "no report or config names one: the shared run with the fewest workers",
    )
    # The folder's own report outranks the config.
    write_json(a / "report" / "parallelism" / "section.json", {"baseline": "b128"})
    (section,) = folders_page.compare([a, b], config=config)["sections"]
    assert section["baseline"] == "b128"
    assert section["baseline_source"] == "the baseline of the folder's own report"
