"""How a DAG says it will replace finished runs as it starts, and how it ended (dmls/dag_outcome.py,
printed by the Snakefile's hooks): per study what finished, was skipped or failed, each reason
once, the special studies, the report and, after a stop, what was kept."""

from dmls.files import write_json
from fake_runs import fake_metrics


def test_the_terminal_summary_counts_each_studys_runs_and_says_each_reason_once(tmp_path):
    from dmls import dag_outcome

    paths = []
    for m in [fake_metrics("single_gpu"), fake_metrics("dp", "skipped"),
              fake_metrics("dp2", "skipped")]:  # fmt: skip
        paths.append(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json")
        write_json(paths[-1], m)
    paths.append(tmp_path / "runs" / "parallelism" / "never" / "metrics.json")
    text = dag_outcome.summary(paths, tmp_path / "report.html")
    assert text.splitlines() == [
        "Runs by study:",
        "  parallelism: 1 ok, 2 skipped, 1 not run",
        "  1 run(s) — dp could not run: no CUDA GPU on this host: parallelism/dp",
        "  1 run(s) — dp2 could not run: no CUDA GPU on this host: parallelism/dp2",
    ]


def test_the_terminal_summary_names_every_run_the_special_studies_and_what_a_stop_kept(tmp_path):
    """Before: "… and 8 more" in place of runs; no word of the special studies' skipped parts;
    a "Report:" line for a report an earlier invocation built; and a stopped DAG said nothing of
    what it kept or how to go on."""
    import os
    import time

    from dmls import dag_outcome
    from dmls import summary as study_record

    paths = []
    for k in range(6):
        m = fake_metrics(f"dp{k}", "skipped")
        m["reason"] = "no CUDA GPU on this host"
        paths.append(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json")
        write_json(paths[-1], m)
    rows = [{"status": "ok", "reason": None, "device": "cpu"},
            {"status": "skipped", "reason": "no CUDA device", "device": "cuda"},
            {"status": "skipped", "reason": "no CUDA device", "device": "cuda"}]  # fmt: skip
    made = study_record.new("fake", "F", {"rows": rows}, config={"title": "F"},
                            host={"hostname": "h", "gpus": []}, threads=1,
                            started_at="2026-11-29T00:00:00+00:00", wall_time_s=1.0)  # fmt: skip
    study = tmp_path / "studies" / "fake" / "summary.json"
    study_record.write(study, made)
    report = tmp_path / "report.html"
    report.write_text("<html>")
    os.utime(report, (time.time() - 3600, time.time() - 3600))
    absent = tmp_path / "studies" / "graphs" / "summary.json"
    text = dag_outcome.summary(paths, report, [study, absent], started=time.time(), stopped=True)
    lines = text.splitlines()
    assert lines[2] == "  6 run(s) — no CUDA GPU on this host: " + ", ".join(
        f"parallelism/dp{k}" for k in range(6)
    )
    assert lines[3:7] == [
        "Special studies:",
        "  fake: ok, 1 of 3 parts ran",
        "  graphs: not run",
        "  fake: 2 part(s) skipped — no CUDA device",
    ]
    assert lines[7].startswith("Report not built by this invocation; the last one (")
    assert lines[8] == dag_outcome.STOPPED
    assert "Report: " in dag_outcome.summary(paths, report, started=time.time() - 7200)


def test_the_start_says_which_finished_runs_changed_settings_will_replace(tmp_path):
    """Before: `--config seeds=1` on a finished folder retrained every run, replacing its
    results, without a word first."""
    from dmls import dag_outcome

    kept, changed = fake_metrics("kept"), fake_metrics("changed")
    for m in (kept, changed):
        write_json(tmp_path / "runs" / m["study"] / m["run"] / "metrics.json", m)
    planned = {f"parallelism/{m['run']}": dict(m["spec"]) for m in (kept, changed)}
    planned["parallelism/changed"]["seeds"] = changed["spec"]["seeds"] + 1
    planned["parallelism/new"] = dict(kept["spec"])  # (no results yet: nothing to replace)
    said = dag_outcome.replaced(planned, tmp_path)
    old = changed["spec"]["seeds"]
    assert said.startswith(
        f"1 run(s) with results in {tmp_path} will train again and replace them: their "
        f"settings changed since (seeds {old} → {old + 1} (1 run(s)))."
    )
    del planned["parallelism/changed"]
    assert dag_outcome.replaced(planned, tmp_path) == ""
