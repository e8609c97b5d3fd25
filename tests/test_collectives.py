"""A5 explained: the collectives' sweep on this host (Gloo on CPU tensors; GPU setups skipped)."""

import csv
import json
import os
import time
from pathlib import Path

import pytest

from dmls.special import ranks, runner
from dmls.special.collectives import measure as collectives
from dmls.special.collectives import spec as collectives_spec

CFG = {
    "title": "A5x", "processes": [2],
    "setups": ["gloo-cpu", "nccl-cuda", "gloo-cpu-nodes", "gloo-cpu-slurm"], "min_bytes": 4,
    "max_bytes": 4 * 16**4, "size_factor": 16, "warmup": 1, "iterations": 8,
    "min_iterations": 6, "time_budget_s": 0.01,
}  # fmt: skip


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    return runner.run_study("collectives", CFG, out, threads=2), out


def test_every_collective_and_size_is_timed_with_nccl_tests_bandwidths(summary):
    result, out = summary
    gloo = [r for r in result["rows"] if r["backend"] == "gloo" and r["placement"] == "host"]
    assert [(r["op"], r["size_bytes"]) for r in gloo] == [
        (op, 4 * 16**k) for op in collectives.OPS for k in range(5)
    ]
    for r in gloo:
        assert r["status"] == "ok" and r["latency_us"] > 0
        assert r["algbw_gb_s"] == pytest.approx(r["size_bytes"] / r["latency_us"] / 1e3)
        # Two ranks: all-reduce's bus factor 2(n-1)/n = 1, the others' (n-1)/n = 1/2.
        factor = 1.0 if r["op"] == "all_reduce" else 0.5
        assert r["busbw_gb_s"] == pytest.approx(factor * r["algbw_gb_s"])
        # Issue #56 (1): sized by time, each size's median with its interval.
        assert 6 <= r["calls"] <= 8
        assert r["latency_low_us"] <= r["latency_us"] <= r["latency_high_us"]
    with open(out / "collectives.csv") as f:
        assert len(list(csv.DictReader(f))) == len(result["rows"])
    assert (out / "bandwidth.png").stat().st_size > 10_000


def test_gloo_also_runs_between_emulated_nodes_and_between_slurm_nodes(summary):
    """2 emulated nodes (a torchrun agent each) always; 2 nodes of a Slurm cluster where this
    host has one that answers (CI starts one), else skipped with the reason (srun not found,
    or sinfo failing where Slurm is installed but no cluster runs)."""
    result, _ = summary
    rows = result["rows"]
    nodes = [r for r in rows if r["placement"] == "nodes"]
    assert [(r["op"], r["size_bytes"]) for r in nodes] == [
        (op, 4 * 16**k) for op in collectives.OPS for k in range(5)
    ]
    assert all(r["status"] == "ok" and r["latency_us"] > 0 for r in nodes)
    slurm = [r for r in rows if r["placement"] == "slurm"]
    if (why := collectives.no_slurm_nodes()) is not None:
        assert slurm == [{"backend": "gloo", "device": "cpu", "placement": "slurm", "op": "all",
                          "processes": 2, "status": "skipped", "reason": why}]  # fmt: skip
    else:
        assert len(slurm) == len(nodes) and all(r["status"] == "ok" for r in slurm)
    notes = collectives_spec.notes(result)
    assert any("over two emulated nodes, 2 processes: all-reduce latency" in n for n in notes)


def test_a_setup_this_host_cannot_run_is_skipped_with_the_reason(summary):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this host has 2 GPUs: the NCCL sweep ran")
    result, _ = summary
    (nccl,) = [r for r in result["rows"] if r["backend"] == "nccl"]
    assert nccl["status"] == "skipped"
    assert nccl["reason"] == f"needs 2 CUDA GPUs, this host has {torch.cuda.device_count()}"


def test_the_notes_give_the_cost_of_all_reducing_the_course_gradient(summary):
    result, _ = summary
    assert result["course_gradient_bytes"] == 4 * 620586  # the course CNN's parameters, fp32
    assert result["gradient_model"] == {"parameters": 620586, "dataset": "cifar10"}
    note = collectives_spec.notes(result)[0]  # written by the report, from the rows
    assert note.startswith("Gloo on CPU tensors, 2 processes: all-reduce latency ")
    # 2.37 MiB lies between 1 MiB and 16 MiB only with a larger sweep: here it is outside.
    assert "course CNN" not in note


def test_the_notes_give_the_gradients_all_reduce_where_the_sweep_spans_it():
    """Interpolated between the two sizes around the gradient; a setup that timed no
    all-reduce has no note."""
    rows = [
        {
            "backend": "gloo",
            "device": "cpu",
            "processes": 2,
            "placement": "host",
            "op": "all_reduce",
            "status": "ok",
            "size_bytes": size,
            "latency_us": us,
            "busbw_gb_s": bw,
        }
        for size, us, bw in ((2**20, 100.0, 10.0), (2**24, 1600.0, 9.0))
    ]
    rows.append({"backend": "nccl", "device": "cuda", "processes": 2, "placement": "host",
                 "op": "all", "status": "skipped", "reason": "needs 2 CUDA GPUs"})  # fmt: skip
    (note,) = collectives_spec.notes({"rows": rows, "course_gradient_bytes": 2**22})
    assert note == (
        "Gloo on CPU tensors, 2 processes: all-reduce latency 100 µs at 1 MiB (the fixed cost "
        "of a call), bus bandwidth up to 10 GB/s (at 1 MiB); all-reducing the course CNN's "
        "4 MiB gradient once takes about 0.4 ms (interpolated between the measured sizes)."
    )


def test_latency_is_interpolated_log_log_and_past_the_sweep_at_its_bandwidth():
    from dmls import comm

    rows = [{"status": "ok", "size_bytes": 1000, "latency_us": 10.0},
            {"status": "ok", "size_bytes": 100000, "latency_us": 1000.0}]  # fmt: skip
    assert comm.latency_at(rows, 10000) == pytest.approx(100.0)
    assert comm.latency_at(rows, 10**6) == pytest.approx(10000.0)  # the largest's bandwidth
    assert comm.latency_at(rows, 10**6, extrapolate=False) is None
    assert comm.latency_at(rows, 10) is None  # below the sweep: the fixed cost is unknown
    reduce = [r | {"op": "all_reduce"} for r in rows]
    calls = [("all_reduce", 1000), ("all_reduce", 10000)]
    assert comm.calls_ms(reduce, calls) == pytest.approx(0.11)
    assert comm.calls_ms(reduce, [("all_gather", 1000)]) is None  # not swept


def test_ddp_all_reduces_a_gradient_in_a_1_mib_bucket_then_25_mib_ones():
    from dmls import comm

    mib = 2**20
    assert comm.ddp_buckets(int(2.37 * mib)) == [mib, int(2.37 * mib) - mib]
    assert comm.ddp_buckets(60 * mib) == [mib, 25 * mib, 25 * mib, 9 * mib]
    assert comm.ddp_buckets(1000) == [1000]


def ranks_of_rank_program(tmp_path, monkeypatch, **program) -> tuple[dict, Path, Path]:
    """The arguments of tests/rank_program.py, a rank that fails or sleeps, for `ranks.run`."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # where rank_program is
    pids, folder = tmp_path / "pids", tmp_path / "ranks" / "g"
    pids.mkdir()
    return {"reports": str(folder), "pids": str(pids)} | program, folder, pids


def ended(pids: Path) -> bool:
    """Whether every rank that wrote its pid into `pids` has ended."""
    for path in pids.iterdir():
        try:
            os.kill(int(path.read_text()), 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_when_a_rank_of_a_study_fails_its_peers_are_stopped_at_once_and_it_is_named(
    tmp_path, monkeypatch
):
    """2 emulated nodes, a torchrun agent each (as `gloo-cpu-nodes` places them): rank 1
    raises; rank 0 sleeps in no collective, so only being stopped ends it, long before the
    timeout."""
    args, folder, pids = ranks_of_rank_program(tmp_path, monkeypatch, fails=1, after_s=1.0)
    start = time.monotonic()
    with pytest.raises(ranks.RanksFailed) as failed:
        ranks.run("rank_program", [json.dumps(args)], name="t", folder=folder, nodes=2,
                  nproc_per_node=1, timeout_s=600)  # fmt: skip
    assert time.monotonic() - start < 120
    assert str(failed.value) == (
        f"rank 1 raised RuntimeError: rank 1 gave up (their output is in {folder / 'ranks.log'})"
    )
    assert sorted(p.name for p in pids.iterdir()) == ["rank0", "rank1"] and ended(pids)
    assert [p.name for p in folder.glob("error-rank*.json")] == ["error-rank1.json"]


def test_a_study_whose_ranks_hang_is_stopped_at_the_timeout_and_says_so(tmp_path, monkeypatch):
    args, folder, pids = ranks_of_rank_program(tmp_path, monkeypatch, fails=None, after_s=0)
    start = time.monotonic()
    with pytest.raises(ranks.RanksFailed, match=r"^still running after 8 s, so every rank was "):
        ranks.run("rank_program", [json.dumps(args)], name="t", folder=folder,
                  nproc_per_node=2, timeout_s=8)  # fmt: skip
    assert time.monotonic() - start < 60
    assert ended(pids)
    assert "TIMED OUT" in (folder / "ranks.log").read_text()


def test_the_gradient_is_the_one_of_the_model_the_a_runs_train():
    """Before: A5 explained reasoned with the CIFAR model's 2.37 MiB while A5 trained a
    Fashion-MNIST model of 390,634 parameters (1.49 MiB)."""
    from dmls.special.collectives.measure import course_gradient

    model = {"dataset": "fashion_mnist", "conv_channels": [32, 64, 128], "fc_hidden": 256}
    assert course_gradient({"gradient_model": model}) == {
        "bytes": 4 * 390634,
        "parameters": 390634,
        "dataset": "fashion_mnist",
    }


def test_the_calls_per_size_fit_a_time_budget_between_the_fewest_and_the_most():
    """Issue #56 (1): the sweep sized its loops by count (20 calls at 256 MiB as at 4 B: Gloo's
    largest messages held all four GPUs for most of its 234 s); now by time, as nccl-tests and
    the OSU benchmarks do."""
    cfg = {"time_budget_s": 0.25, "min_iterations": 6, "iterations": 200}
    assert collectives.calls(50e-6, cfg) == 200  # a 4 B all-reduce: the most
    assert collectives.calls(0.01, cfg) == 25  # 10 ms a call: as many as fit in 0.25 s
    assert collectives.calls(0.15, cfg) == 6  # a 256 MiB Gloo all-reduce: the fewest
    assert collectives.calls(0.15, cfg | {"iterations": 3}) == 3  # never more than the most
