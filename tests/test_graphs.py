"""D5: the course CNN eager, compiled and exported on this host; a data-dependent branch."""

import csv

import pytest

from dmls.special import graphs, runner

CFG = {
    "title": "D5", "devices": ["cpu", "cuda"], "conv_channels": [4, 8], "fc_hidden": 16,
    "batch_size": 8, "lr": 0.01, "warmup_steps": 1, "steps": 3, "repeats": 3, "seed": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("graphs")
    return runner.run_study("graphs", CFG, out, threads=1), out


def test_each_mode_trains_and_says_what_it_captured(summary):
    result, out = summary
    cpu = {r["mode"]: r for r in result["rows"] if r["device"] == "cpu"}
    assert {r["status"] for r in cpu.values()} == {"ok"}
    for row in cpu.values():
        assert row["first_call_s"] > 0 and row["steady_step_ms"] > 0
        assert len(row["repeats"]) == 3 and row["steady_step_ms_ci95"] is not None
    # The CNN has no data-dependent Python: dynamo captures it whole, export as one graph.
    assert (cpu["compile"]["graphs"], cpu["compile"]["graph_breaks"]) == (1, 0)
    assert cpu["compile"]["ops"] > 0 and cpu["export"]["ops"] > 0
    assert cpu["eager"]["graphs"] == 0
    # Capturing costs up front: both static modes' first call exceeds eager's.
    assert cpu["compile"]["first_call_s"] > cpu["eager"]["first_call_s"]
    assert cpu["export"]["first_call_s"] > cpu["eager"]["first_call_s"]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["device"], r["mode"]) for r in rows] == [
        (d, m) for d in ("cpu", "cuda") for m in graphs.MODES
    ]


def test_gpu_rows_are_skipped_with_the_reason_on_a_host_without_one(summary):
    result, _ = summary
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: its rows ran")
    cuda = [r for r in result["rows"] if r["device"] == "cuda"]
    assert [r["status"] for r in cuda] == ["skipped"] * 3
    assert {r["reason"] for r in cuda} == {"no CUDA device on this host"}
    assert result["status"] == "ok" and result["counts"] == {"ok": 3, "skipped": 3}


def test_a_branch_on_data_breaks_compile_and_is_refused_by_export(summary):
    result, _ = summary
    by = {(c["model"], c["capture"]): c for c in result["control_flow"]}
    broken = by[("if h.sum() > 0", "torch.compile")]
    assert (broken["graphs"], broken["graph_breaks"]) == (2, 1)
    assert broken["outcome"] == "graph break" and broken["detail"].startswith(
        "torch._dynamo.explain: "
    )
    refused = by[("if h.sum() > 0", "torch.export")]
    assert refused["outcome"] == "refused" and "data-dependent" in refused["detail"]
    cond = by[("torch.cond(h.sum() > 0, ...)", "torch.export")]
    assert cond["outcome"] == "exported" and cond["ops"] > 0


def test_observations_compare_with_eager_and_quote_the_export_error(summary):
    result, _ = summary
    notes = result["notes"]
    cpu = {r["mode"]: r for r in result["rows"] if r["device"] == "cpu"}
    compiled = next(n for n in notes if n.startswith("cpu, compile: "))
    assert f"first call {cpu['compile']['first_call_s']:.2f} s" in compiled
    assert "95% interval" in compiled and "captured 1 graph(s), 0 break(s)" in compiled
    last = notes[-1]
    assert "2 graphs at 1 graph break(s)" in last and "torch.export refused it" in last
    assert "data-dependent" in last


def test_a_ratio_without_repeats_says_it_has_no_interval():
    rows = [
        {"device": "cpu", "mode": "eager", "status": "ok", "first_call_s": 0.01,
         "steady_step_ms": 2.0, "repeats": [2.0], "graphs": 0, "graph_breaks": 0},
        {"device": "cpu", "mode": "compile", "status": "ok", "first_call_s": 20.0,
         "steady_step_ms": 1.0, "repeats": [1.0], "graphs": 1, "graph_breaks": 0},
    ]  # fmt: skip
    control = [
        {"model": "if h.sum() > 0", "capture": "torch.compile", "graphs": 2, "graph_breaks": 1},
        {"model": "if h.sum() > 0", "capture": "torch.export", "outcome": "refused",
         "detail": "E: data-dependent"},
    ]  # fmt: skip
    first = graphs.observations(rows, control)[0]
    assert first == (
        "cpu, compile: first call 20.00 s against eager's 0.010 s (2000×), then a steady step "
        "of 1.00 ms against 2.00 ms, 0.50× eager's (one repeat on a side: too few repeats to "
        "tell); captured 1 graph(s), 0 break(s)."
    )
