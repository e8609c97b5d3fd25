"""The special studies' answers (dmls.report.special_answers) over every study: the
templates proposed for report/studies.yaml filled from every case of every study's facts
(each fact used, no number in a template, at most three sentences), each special section's
'Ran on' line, and the brief and whole answers rendered from the same phrases. The
studies' own facts are tested in tests/test_special_answers_d.py (D1–D6) and
tests/test_special_answers_abc.py (A5 explained, B4, C)."""

import json
import re
import string
from pathlib import Path

import pytest

from dmls import stats
from dmls.report import special_answers as sa
from dmls.report.wording import ratio_strings
from dmls.special import runner
from dmls.special.catalog import STUDIES
from special_fixtures import (
    CONTROL,
    GRADIENT,
    TEMPLATES,
    _doctor,
    facts_of,
    graph_rows,
    shard_rows,
    spark_summary,
    sweep_rows,
)

# Every case each facts function can return, as each study declares them.
CASES = {name: set(spec.cases) for name, spec in STUDIES.items()}


def templates(name, case):
    """The templates of study `name` that case `case` fills."""
    return [e["say"][case] if isinstance(e["say"], dict) else e["say"] for e in TEMPLATES[name]]


def fields(template):
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


# --------------------------------------------------------------------------- templates
@pytest.fixture
def every_case(lenet, spare, b4, c, tmp_path):
    """(study, case, facts) for every case of every study."""
    out = []

    def add(name, summary, folder, edit=None):
        summary = json.loads(json.dumps(summary))
        if edit:
            edit(summary)
        case, facts = facts_of(name, summary, folder)
        out.append((name, case, facts))

    add("lenet_memory", *lenet)
    add("lenet_memory", *lenet, edit=lambda s: s.update(
        estimate=[e for e in s["estimate"] if e["recompute"] != "full"]))  # fmt: skip
    add("spare_failure", *spare)
    add("spare_failure", *spare, edit=lambda s: _doctor(s["rows"][0]))
    add("spare_failure", *spare, edit=lambda s: [_doctor(r) for r in s["rows"][:3]])
    d3 = runner.run_study("float32_bytes", {"title": "D3", "value": 6.342e-5}, tmp_path)
    add("float32_bytes", d3, tmp_path)
    add("float32_bytes", d3, tmp_path, edit=lambda s: s["rows"][0].update(round_trip_exact=False))
    add("graphs", {"status": "ok", "rows": graph_rows(), "control_flow": CONTROL}, tmp_path)
    summary = {"status": "ok", "rows": sweep_rows(), "course_gradient_bytes": GRADIENT}
    add("collectives", summary, tmp_path)
    add("collectives", summary | {"rows": sweep_rows(nccl=False)}, tmp_path)
    add("sharding", {"status": "ok", "rows": shard_rows()}, tmp_path)
    add("profiler", *b4)
    add("fused_conv", *c)
    add("spark_lazy", spark_summary(), tmp_path)
    d7 = runner.run_study("serialization", {"title": "D7"}, tmp_path / "d7")
    add("serialization", d7, tmp_path / "d7")
    return out


def test_every_template_fills_from_its_cases_facts_and_uses_every_fact(every_case):
    seen = {name: set() for name in TEMPLATES}
    for name, case, facts in every_case:
        seen[name].add(case)
        used = set().union(*(fields(t) for t in templates(name, case)))
        assert used == set(facts), (name, case, used ^ set(facts))
        for t in templates(name, case):
            t.format(**facts)
    assert seen == CASES


def test_the_templates_cover_every_case_hold_no_number_and_say_at_most_three_sentences():
    assert set(TEMPLATES) == set(STUDIES) == set(CASES)
    for name, entries in TEMPLATES.items():
        assert len(entries) <= 3, name
        assert len({e["topic"] for e in entries}) == 1, name
        for e in entries:
            says = e["say"].values() if isinstance(e["say"], dict) else [e["say"]]
            if isinstance(e["say"], dict):
                assert set(e["say"]) == CASES[name], name
            for say in says:
                prose = re.sub(r"\{[^}]*\}", "", say)
                # (A digit inside a name, as in LeNet-5 or fp32, is no number.)
                assert not re.search(r"(?<![\w-])\d", prose), (name, say)
                assert prose.count(". ") == 0 and say.endswith("."), (name, say)


# --------------------------------------------------------------------------- every study
def test_every_special_section_says_what_it_ran_on():
    """Before: B4, C, D1–D7 and A5 explained had no visible "Ran on" line."""
    from dmls.report import special

    host = {"hostname": "h", "gpus": ["NVIDIA H200"], "cpu_model": "Xeon"}
    c = {"config": {"dataset": "fashion_mnist", "train_samples": 2000, "epochs": 2,
                    "repeats": 3}, "host": host,
         "rows": [{"mode": "cudnn", "status": "ok"}, {"mode": "cpu", "status": "ok"}]}  # fmt: skip
    assert special.provenance(c) == (
        "Ran on Fashion-MNIST, 2,000 training samples, 2 epochs; 3 repeats; NVIDIA H200 (GPU) "
        "and the CPU (Xeon)."
    )
    d1 = {
        "config": {"steps": 2},
        "host": host | {"gpus": []},
        "rows": [{"device": "cpu", "status": "ok"}, {"device": "cuda", "status": "skipped"}],
    }
    repeats = STUDIES["lenet_memory"].repeats
    assert special.provenance(d1, repeats) == "Ran on 2 steps; the CPU (Xeon)."
    synthetic = {"config": {"dataset": "synthetic_cifar"}, "host": host,
                 "rows": [{"device": "cuda", "status": "ok"}]}  # fmt: skip
    assert special.provenance(synthetic) == (
        "Ran on SYNTHETIC CIFAR-shaped images; NVIDIA H200 (GPU)."
    )
    # A study that computes on no device of its own (D2, D3, D6) names the machine, so that D6,
    # run where Java is, is told apart from the GPU host of the same hostname.
    arithmetic = {"config": {}, "rows": [{"status": "ok"}]}
    gpu_host = host | {"cpu_count": 64, "gpus": ["NVIDIA H200"] * 4}
    assert special.provenance(arithmetic | {"host": gpu_host}) == (
        "Ran on host h (64 cores of Xeon; 4× NVIDIA H200)."
    )
    assert special.provenance(arithmetic | {"host": host | {"cpu_count": 2, "gpus": []}}) == (
        "Ran on host h (2 cores of Xeon; no GPU)."
    )
    # What shared the host, as measured: its load as the study began, against its cores.
    loaded = arithmetic | {"host": host | {"cpu_count": 2, "gpus": []}}
    assert special.provenance(loaded | {"load_average_before": [4.3, 4.1, 3.0]}) == (
        "Ran on host h (2 cores of Xeon; no GPU); load 4.3/2 cores."
    )


def test_a_special_answers_brief_drops_the_means_and_gives_a_reason_once():
    """The brief is rendered from the same facts (dmls.report.phrases), not edited from the
    whole answer: a ratio without its means, a repeated reason 'as above' in both."""
    entries = [
        {"topic": "steps", "say": "Steps: {steps}."},
        {"topic": "first calls", "say": "First calls: {first}."},
    ]
    gpu = sa.not_measured("it was skipped: no CUDA device on this host")

    def facts(summary, folder):
        steps = "on the CPU " + sa.speed([2.0, 2.1, 1.9], [1.0, 1.1, 0.9], "1 vs 2 ms") + "; "
        return "measured", {"steps": steps + "on the GPU " + gpu, "first": "on the GPU " + gpu}

    whole, brief = sa.special_answer(entries, facts, {}, Path("."))
    value, interval = ratio_strings(stats.ratio([2.0, 2.1, 1.9], [1.0, 1.1, 0.9]))
    assert whole[0].startswith(f"Steps: on the CPU {value} ({interval}; 1 vs 2 ms), faster; ")
    assert brief[0].startswith(f"Steps: on the CPU {value} ({interval}), faster; ")
    for said in (whole, brief):
        assert said[0].endswith("on the GPU not measured here, as it was skipped: no CUDA device "
                                "on this host.")  # fmt: skip
        assert said[1] == "First calls: on the GPU not measured here (as above)."


def test_a_phrase_is_never_flattened_by_a_format():
    """A fact with parts can't be written into an f-string or str.join by mistake: the means
    or the reason would then be text that only a regex could take out again."""
    phrase = sa.not_measured("no GPU")
    with pytest.raises(TypeError):
        f"{phrase}"
    with pytest.raises(TypeError):
        "; ".join([phrase])
