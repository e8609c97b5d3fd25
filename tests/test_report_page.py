"""dmls.report's HTML page and what the report says around the numbers: the page itself
(escaped config strings, embedded figures and tables, studies not run), the studies'
texts and the figures' captions in both reports, special studies' rows and a section's
model table, the provenance and 'Ran on' lines (isolation, device, data, what shared the
host, who ran alone), the DAG's timeline and the header's wall time per sitting, and the
terminal summary (at the end, and at the start what changed settings will replace)."""

import copy
import html
import re
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pandas as pd
import yaml

from conftest import ROOT, alike
from dmls import summary
from dmls.files import write_json
from dmls.report import captions, page, section, special
from dmls.report.aggregate import read_all, runs_table, seeds_table
from dmls.special.catalog import STUDIES
from fake_runs import a1_study, fake_metrics


def test_each_section_says_whether_its_jobs_had_the_host_to_themselves():
    def shared(*launches):
        metrics = []
        for i, launch in enumerate(launches):
            m = fake_metrics(f"r{i}")
            m["launch"] = launch | {"seconds": 100.0}
            metrics.append(m)
        return alike("parallelism", {}, metrics).provenance()["isolation"]

    # What the config enforced (no other job of the DAG beside it), never that the host was
    # otherwise idle: what else ran there is the measured `load` (below).
    assert shared({"isolation": "host"}, {"isolation": "host"}) == (
        "no other job of this DAG beside it"
    )
    assert "CPU package" in shared({"isolation": "host"}, {"isolation": "devices"})
    assert "not comparable" in shared({"isolation": "devices"}, {"exclusive": False})


def test_a_cpu_run_on_a_gpu_host_says_it_ran_on_the_cpu():
    """The example's B sections said "4× NVIDIA H200" for runs that trained on CPUs."""
    gpu, cpu = fake_metrics("g"), fake_metrics("c")
    cpu["derived"]["device"] = "cpu"
    assert alike("parallelism", {}, [gpu]).provenance()["card"] == "1× NVIDIA H100"
    assert alike("parallelism", {}, [cpu]).provenance()["card"] == "CPU: Xeon"


def test_a_section_whose_runs_overlapped_no_other_job_says_it_ran_alone():
    """The example's B1 and B2 ran one run at a time after the DAG, under `isolation: devices`:
    their provenance said "beside other jobs"."""
    import pandas as pd

    from dmls.report import page
    from dmls.report.study import ALONE, SHARED

    def row(job: str, start: int, end: int, status: str = "ok") -> dict:
        t = pd.Timestamp("2026-11-28T16:00:00")
        return {"job": job, "status": status, "start": t + pd.Timedelta(seconds=start),
                "end": t + pd.Timedelta(seconds=end)}  # fmt: skip

    rows = [row("b1/one", 0, 10), row("b1/two", 10, 20), row("a1/x", 20, 30),
            row("study graphs", 25, 40), row("a1/skipped", 0, 40, "skipped")]  # fmt: skip
    assert page.ran_alone("b1", rows)  # touching ends and a skipped run's span don't overlap
    assert not page.ran_alone("a1", rows)  # beside the graphs study
    assert not page.ran_alone("b1", [*rows, row("b1/three", 15, 25)])  # beside its own run
    assert not page.ran_alone("c", rows)  # no finished run: nothing to say

    def item(key: str, isolation: str) -> dict:
        return {"kind": "runs", "section": {"key": key}, "provenance": {"isolation": isolation}}

    items = [item("b1", SHARED["devices"]), item("a1", SHARED["devices"]),
             item("h", SHARED["host"])]  # fmt: skip
    page.say_who_ran_alone(items, [*rows, row("h/r", 50, 60)])
    said = [i["provenance"]["isolation"] for i in items]
    assert said == [ALONE, SHARED["devices"], SHARED["host"]]


def test_page_escapes_config_strings_and_embeds_everything(tmp_path):
    hostile = '<script>alert("x")</script>'
    study = a1_study(title=f"A1 {hostile}")
    section.build(
        study,
        None,
        tmp_path / "parallelism",
        tmp_path / "parallelism" / "curves",
        tmp_path / "parallelism" / "figures",
    )
    metrics_paths = []
    for m in study.metrics.values():
        path = tmp_path / "runs" / m["run"] / "metrics.json"
        write_json(path, m)
        metrics_paths.append(path)
    runs_csv, seeds_csv = tmp_path / "runs.csv", tmp_path / "seeds.csv"
    records = read_all(metrics_paths)
    runs_table(records).to_csv(runs_csv, index=False)
    seeds_table(records).to_csv(seeds_csv, index=False)
    manifest = tmp_path / "data.json"
    write_json(
        manifest,
        {
            "name": "synthetic_cifar",
            "status": "ok",
            "synthetic": True,
            "source": "synthetic, seed 0",
            "n_train": 10,
            "n_test": 5,
        },
    )
    config = {"studies": {"parallelism": {"title": f"A1 {hostile}"}},
              "special_studies": {"spark_lazy": {"enabled": False}}}  # fmt: skip
    rendered = page.render(
        template_dir=ROOT / "report",
        texts_path=ROOT / "report" / "studies.yaml",
        section_paths=[tmp_path / "parallelism" / "section.json"],
        special_paths=[],
        runs_csv=runs_csv,
        seeds_csv=seeds_csv,
        metrics_paths=metrics_paths,
        manifest_paths=[manifest],
        config=copy.deepcopy(config),
        workflow_dir=ROOT,
        studies=STUDIES,
    )
    assert hostile not in rendered and "&lt;script&gt;alert(" in rendered
    assert rendered.count("<script>") == 1  # only the all-runs table's script of the template
    # overview, curves, speedup, generalization; 3 runs' curves; A2's generalization again;
    # the DAG's timeline.
    assert len(re.findall(r'src="data:image/png;base64,', rendered)) == 4 + 3 + 1 + 1
    assert '<section id="timeline">' in rendered
    assert 'download="runs.csv"' in rendered and 'download="seeds.csv"' in rendered
    assert "SYNTHETIC" in rendered and "1 × NVIDIA H100" in rendered and "580.1" in rendered
    assert "Course reference (other students" in rendered  # labelled apart from our numbers
    assert "no CUDA GPU on this host" in rendered
    # A study of the report's text this folder did not run is listed with why, never missing.
    assert ("Not run: this folder&#39;s config turns it off (special_studies.spark_lazy.enabled: "
            "false).") in rendered  # fmt: skip
    assert "Not run: this folder&#39;s config has no study precision." in rendered
    assert '<section id="spark_lazy" class="study">' in rendered
    # No number from the skipped run anywhere in its row of the results table.
    row = re.search(r"<tr class=\"not-ok\"><td>dataparallel_2gpu</td>.*?</tr>", rendered, re.S)
    assert row and not re.search(r">\s*\d", row.group(0).split("colspan")[0])


def test_every_study_of_the_config_has_its_text():
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    runs = {e.get("from") or e["study"] for e in texts["sections"] if "special" not in e}
    assert set(config["studies"]) <= runs
    assert {e["study"] for e in texts["sections"] if "from" in e} == {"overfitting"}
    specials = {e["special"] for e in texts["sections"] if "special" in e}
    assert specials == set(config["special_studies"])


def test_rst_captions_of_the_rules_exist():
    rules = (ROOT / "rules" / "report.smk").read_text()
    for caption in re.findall(r'caption="\.\./(report/[\w.]+)"', rules):
        assert Path(ROOT / caption).is_file(), caption


def test_both_reports_caption_each_figure_kind_with_the_same_words():
    """report/captions.yaml is the one source: the HTML report escapes the study's names,
    report/figure.rst (rendered as Snakemake renders captions) shows them as literals."""
    texts = captions.load(ROOT / "report" / "captions.yaml")
    kinds = {
        "overview",
        "curves",
        "speedup",
        "grid",
        "sweep",
        "generalization",
        "comparison",
        "time_to_accuracy",
        "energy",
    }
    assert set(texts["figures"]) == kinds | {"no_results"}
    rst = captions.for_snakemake_report(texts, baseline="b<1>", compare_with="c")
    figure_rst = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        (ROOT / "report" / "figure.rst").read_text()
    )
    for kind in texts["figures"]:
        shown = captions.for_html(texts, kind, {"baseline": "b<1>", "compare_with": "c"})
        assert html.unescape(shown) == rst[kind].replace("``", "")
        job = SimpleNamespace(
            wildcards=SimpleNamespace(figure=kind), params=SimpleNamespace(captions=rst)
        )
        assert figure_rst.render(snakemake=job).strip() == rst[kind]
    assert "b&lt;1&gt;" in captions.for_html(
        texts, "speedup", {"baseline": "b<1>", "compare_with": None}
    )
    assert "comparison" not in captions.for_snakemake_report(texts, baseline="b", compare_with=None)


def test_special_study_rows_without_numbers_keep_only_their_reason(tmp_path):
    folder = tmp_path / "fused_conv"
    folder.mkdir()
    rows = [
        {"device": "cuda", "depth": 2, "mode": "fused", "status": "skipped",
         "reason": "'fused' needs a CUDA GPU"},
        {"device": "cpu", "depth": 2, "mode": "cpu", "status": "ok", "reason": None},
    ]  # fmt: skip
    verdicts = {"convention": "cudnn / fused", "by_depth": {}}
    result = {"rows": rows, "data": None, "cudnn_version": None, "repeats": 1,
              "accuracy_seeds": 1, "verdicts": verdicts}  # fmt: skip
    summary.write(
        folder / "summary.json",
        summary.new(
            "fused_conv", "C. FusedConvReLU", result, config={"title": "C. FusedConvReLU"},
            host={"hostname": "h", "gpus": [], "torch": "2.14"}, threads=1,
            started_at="2026-01-01T00:00:00+00:00", wall_time_s=1.0,
        ),
    )  # fmt: skip
    (folder / "results.csv").write_text(
        "depth,title,status,reason,device_name,fused_layers,epochs,forward_ms,"
        "backward_ms,test_accuracy\n"
        "2,FusedConvReLU kernel,skipped,'fused' needs a CUDA GPU,,,,,,\n"
        '2,"baseline, CPU",ok,,cpu,0,1,0.06531,0.0693,0.9012\n'
    )
    section = special.load(folder / "summary.json", STUDIES)
    table = section["tables"][0]
    skipped, ok = table["rows"]
    assert skipped["reason"] == "'fused' needs a CUDA GPU"
    assert skipped["cells"] == ["2", "FusedConvReLU kernel"] + [""] * 6
    assert ok["cells"][-4:] == ["0.06531", "0.0693", "1", "0.9012"]
    assert section["skipped"] == ["cuda 2 fused: skipped — 'fused' needs a CUDA GPU"]


def test_the_timeline_puts_gpu_jobs_on_their_gpus_and_stacks_cpu_jobs_side_by_side():
    from dmls.report import timeline

    def run(name, start, end, gpus=(), status="ok"):
        stamp = "2026-11-27T10:00:{:02d}+00:00"
        return {"job": name, "status": status, "gpu_ids": list(gpus), "gpus": len(gpus),
                "start": pd.Timestamp(stamp.format(start)), "end": pd.Timestamp(stamp.format(end)),
                "train_s": 1.25}  # fmt: skip

    rows = timeline.with_offsets([
        run("a/ddp", 5, 20, gpus=("0", "1")), run("a/cpu1", 0, 10), run("a/cpu2", 2, 8),
        run("a/cpu3", 12, 30, status="failed"), run("b/single", 21, 25, gpus=("1",)),
        {"job": "study x", "status": "ok", "start": None, "end": None},  # never started
    ])  # fmt: skip
    assert [r["job"] for r in rows] == ["a/cpu1", "a/cpu2", "a/ddp", "a/cpu3", "b/single"]
    bars = [(lane, r["job"]) for lane, r in timeline.lanes(rows)]
    assert bars == [("CPU 1", "a/cpu1"), ("CPU 2", "a/cpu2"), ("GPU 0", "a/ddp"),
                    ("GPU 1", "a/ddp"), ("CPU 1", "a/cpu3"), ("GPU 1", "b/single")]  # fmt: skip
    table = timeline.table(rows)
    assert table["columns"][:4] == ["job", "status", "start (s)", "end (s)"]
    assert table["rows"][0][:4] == ["a/cpu1", "ok", "0.0", "10.0"]
    assert table["rows"][0][table["columns"].index("training (s)")] == "1.2"
    assert timeline.summary(rows) == (
        "5 jobs over 30 s; their own times add up to 53 s (1.8 jobs at a time on average)."
    )
    timeline.figure(rows)  # draws
    # A short idle gap inside a DAG is no second sitting (runs added later: below).
    pause = timeline.with_offsets([run("a/cpu1", 0, 10), run("b/next", 50, 55)])
    assert timeline.summary(pause) == (
        "2 jobs over 55 s; their own times add up to 15 s (0.3 jobs at a time on average)."
    )


def test_the_header_gives_each_sittings_wall_time_when_runs_were_added_later():
    from dmls.report import timeline
    from dmls.report.page import wall_time

    def m(start: str, end: str) -> dict:
        return timeline.run_row({"study": "s", "run": start, "status": "ok",
                "started_at": f"2026-11-28T{start}+00:00", "finished_at": f"2026-11-28T{end}+00:00",
                "launch": {"seconds": 60.0}})  # fmt: skip

    dag = [m("13:00:00", "13:10:00"), m("13:05:00", "13:22:00")]
    assert wall_time(dag)["sittings_s"] == [1320.0] and wall_time(dag)["span_s"] == 1320.0
    later = wall_time([*dag, m("16:13:00", "16:14:00"), m("16:14:10", "16:18:00")])
    assert later["sittings_s"] == [1320.0, 300.0] and later["runs_s"] == 240.0
    # The timeline draws each sitting on an axis of its own, without the idle hours between,
    # and its summary does not count them as the DAG's.
    rows = timeline.with_offsets([*dag, m("16:13:00", "16:14:00"), m("16:14:10", "16:18:00")])
    assert timeline.sittings(rows) == [(0.0, 1320.0), (11580.0, 11880.0)]
    assert timeline.summary(rows) == (
        "4 jobs over 11880 s, 10260 s of it between 2 sittings with none running (runs added "
        "later); their own times add up to 1910 s (1.2 jobs at a time within the sittings)."
    )
    axes = timeline.figure(rows).axes
    assert [a.get_title() for a in axes] == ["sitting 1", "sitting 2"]
    assert axes[1].get_xlim()[0] > 11000 and axes[0].get_xlim()[1] < 1400


def test_a_study_trained_again_on_another_machine_is_a_sitting_and_a_host_of_its_own():
    """Before: the example's A4, trained again on a 2-GPU host minutes after the DAG on a
    4-GPU one (both named "vm"), merged into one 29.9-minute "DAG wall time", and the hardware
    table counted all runs on one host "vm" with the 4-GPU host's GPUs."""
    from dmls.report import page, timeline

    def m(start: str, end: str, gpus: int) -> dict:
        host = {"hostname": "vm", "cpu_model": "Xeon", "cpu_count": 16 * gpus,
                "gpus": ["NVIDIA H200"] * gpus, "python": "3.12", "torch": "2.11",
                "accelerate": "1.15", "platform": "Linux"}  # fmt: skip
        return {"study": "s", "run": start, "status": "ok", "host": host,
                "started_at": f"2026-11-28T{start}+00:00", "finished_at": f"2026-11-28T{end}+00:00",
                "launch": {"seconds": 60.0}}  # fmt: skip

    dag = [m("13:00:00", "13:10:00", 4), m("13:05:00", "13:20:00", 4)]
    again = [m("13:24:00", "13:25:00", 2), m("13:25:05", "13:26:00", 2)]
    rows = timeline.with_offsets([timeline.run_row(r) for r in dag + again])
    assert timeline.sittings(rows) == [(0.0, 1200.0), (1440.0, 1560.0)]
    assert [a.get_title() for a in timeline.figure(rows).axes] == [
        "sitting 1\nhost vm (64 cores of Xeon; 4× NVIDIA H200)",
        "sitting 2\nhost vm (32 cores of Xeon; 2× NVIDIA H200)",
    ]
    # The same machine after a short pause stays one sitting (a DAG's jobs, then B alone).
    same = timeline.with_offsets(
        [timeline.run_row(r) for r in [*dag, m("13:24:00", "13:25:00", 4)]]
    )
    assert len(timeline.sittings(same)) == 1
    table = page.hosts(dag + again)
    assert [(h["hostname"], h["runs"], h["gpus"]) for h in table] == [
        ("vm", 2, "4 × NVIDIA H200"), ("vm", 2, "2 × NVIDIA H200")]  # fmt: skip


def test_provenance_names_the_data_the_course_used_where_ours_stands_in_and_emulated_nodes():
    """Before: A sections said "Ran on fashion_mnist" and never that it stands in for CIFAR-10;
    B's emulated nodes were said only in the header."""
    from dmls.report.cells import stand_in

    assert stand_in("fashion_mnist", "CIFAR-10") == " (real; a stand-in for the course's CIFAR-10)"
    assert stand_in("cifar10", "CIFAR-10") == ""
    assert stand_in("synthetic_cifar", "CIFAR-10") == " (a stand-in for the course's CIFAR-10)"
    grid = fake_metrics("n2xp1", launcher="torchrun", nodes=2, epochs=3)
    grid["derived"]["nodes_emulated"] = True
    p = alike("cluster_torchrun", {}, [grid]).provenance()
    assert p["nodes"].startswith("nodes emulated on one host") and p["data"] == "CIFAR-10"
    assert a1_study().provenance()["nodes"] == ""


def test_a_section_describes_the_model_as_it_ran():
    """Before: A1 never described the CNN; A3's background quoted the CIFAR model's shape."""
    study = a1_study()
    assert study.model_table() is None  # (records from before the layers were recorded)
    layers = [
        {"layer": "features.0", "kind": "Conv2d", "output_shape": [8, 28, 28], "parameters": 72},
        {"layer": "classifier.1", "kind": "Linear", "output_shape": [10], "parameters": 62730},
    ]
    study.metrics["single_gpu"]["layers"] = layers
    table = study.model_table()
    assert table["run"] == "single_gpu" and table["rows"][0] == [
        "features.0",
        "Conv2d",
        "8 × 28 × 28",
        "72",
    ]
    assert table["total"] == "62,802 parameters, 0.24 MiB of fp32 gradient"


def test_what_shared_the_host_is_said_from_what_was_measured():
    """On a CPU host shared with other work, every provenance line said "each job had the host
    to itself" while one seed's epochs of identical work ranged 1.56–18.56 s."""
    m = fake_metrics("r0", epochs=3)
    m["launch"] = {"isolation": "host", "seconds": 100.0, "load_average_before": [3.2, 2.0, 1.0]}
    for seed in m["seeds"]:
        seed["history"][1]["train_time_s"], seed["history"][2]["train_time_s"] = 1.56, 18.56
    p = alike("parallelism", {}, [m]).provenance()
    cores = m["host"]["cpu_count"]
    assert p["load"] == f"load 3.2/{cores} cores; epochs ≤11.90× apart"


def test_a_special_study_says_what_else_of_the_dag_ran_while_it_did():
    """Before: a special study's line never said it ran beside other jobs. From the stamps."""
    import pandas as pd

    from dmls.report import timeline

    t = pd.Timestamp("2026-12-06 10:00:00")
    rows = [
        {"job": "study profiler", "status": "ok", "start": t, "end": t + pd.Timedelta(seconds=100)},
        {"job": "a/x", "status": "ok", "start": t - pd.Timedelta(seconds=10),
         "end": t + pd.Timedelta(seconds=20)},
        {"job": "a/y", "status": "ok", "start": t + pd.Timedelta(seconds=10),
         "end": t + pd.Timedelta(seconds=30)},
        {"job": "a/z", "status": "skipped", "start": t, "end": t + pd.Timedelta(seconds=100)},
        {"job": "study graphs", "status": "ok", "start": t + pd.Timedelta(seconds=200),
         "end": t + pd.Timedelta(seconds=300)},
    ]  # fmt: skip
    assert timeline.beside("study profiler", rows) == (
        "beside 2 other jobs of this DAG for 30% of its time"
    )
    assert timeline.beside("study graphs", rows) == "no other job of this DAG ran meanwhile"
    assert timeline.beside("study none", rows) is None
