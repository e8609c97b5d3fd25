"""D5: the course CNN eager, compiled and exported on this host; a data-dependent branch."""

import csv

import pytest

from dmls.report.phrases import full
from dmls.special import runner
from dmls.special.graphs import measure as graphs

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


def test_the_answer_says_what_each_capture_did_with_a_branch_on_a_tensor(summary, tmp_path):
    """What the measuring module once wrote as a note, the report now writes from the rows:
    the branch broke compile's graph, export refused it (its error named), torch.cond
    exported as one graph."""
    from dmls.special.graphs import spec as graphs_spec

    result, out = summary
    case, facts = graphs_spec.facts(result, out)
    assert case == "measured"
    assert facts["branch_compile"].startswith("broke it into 2 graphs at 1 break")
    assert facts["branch_export"].startswith("refused it (") and graphs_spec.SPEC.notes is None
    assert facts["branch_cond"] == "exported it as 1 graph"


def test_the_modes_take_turns_and_each_repeat_keeps_its_start_and_place(summary):
    """D5 once timed each mode in a block of its own: eager's repeats drifted 21.27 -> 24.78 ms,
    enough to read "compiled 1.11x, faster" on the CPU."""
    from dmls import stats

    result, _ = summary
    cpu = {r["mode"]: r for r in result["rows"] if r["device"] == "cpu"}
    orders = stats.turns(list(graphs.MODES), CFG["repeats"], CFG["seed"])
    passes = sorted((t, k, mode) for mode, row in cpu.items()
                    for k, t in enumerate(row["repeat_started_s"]))  # fmt: skip
    # By start time: repeat 0's three modes in its turn's order, then repeat 1's, ...
    assert [(k, mode) for _, k, mode in passes] == [
        (k, mode) for k, order in enumerate(orders) for mode in order
    ]
    for mode, row in cpu.items():
        assert row["repeat_position"] == [order.index(mode) for order in orders]


def test_the_answer_compares_each_mode_with_eager_repeat_by_repeat():
    """A drift both shared cancels: eager and compiled both slowing 20% over the study read
    the same speed-up in every repeat."""
    from dmls.special.graphs.spec import _graph_device

    eager = [20.0, 22.0, 24.0]
    row = {"status": "ok", "steady_step_ms": 11.0, "steady_step_ms_ci95": 1.0,
           "first_call_s": 5.0, "repeat_started_s": [0.1, 1.0, 2.0]}  # fmt: skip
    modes = {
        "eager": row | {"steady_step_ms": 22.0, "repeats": eager, "first_call_s": 0.01},
        "compile": row | {"repeats": [e / 2 for e in eager]},
    }
    steady, _ = map(full, _graph_device("cpu", modes))
    assert steady.startswith("compiled 2.00× (") and "the same in every repeat" not in steady
    assert "faster" in steady and "95% interval" not in steady  # no spread: every repeat 2x
