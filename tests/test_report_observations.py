"""dmls.report's observations, computed from a study's numbers: each run against the
baseline over the seeds (and when that is within seed noise), speed-ups against the
single-worker run that stepped and loaded data as it did, the warm process's later seeds,
memory per job, steps that could not use a CUDA graph, the half precision a CPU computes
slowly, sweeps, overfitting beyond seed noise, A5's all-reduce predicted from the
collectives sweep, and what an earlier record version dropped."""

import pandas as pd
import pytest

from conftest import alike
from dmls import record
from dmls.report import figures, observations, overfitting
from dmls.report.cells import MIB
from fake_runs import _on_cpu, a1_study, epochs, fake_metrics, seeds_study


def test_observations_are_computed_from_the_numbers():
    study = a1_study()
    lines = observations.versus_baseline(study)
    assert lines == [
        "ddp_2gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(2 vs 1), global batch (64 vs 32: 0.5× the steps per epoch)): "
        "samples/s over the steady epochs 1,620 vs 1,000 (geometric "
        "means): 1.62×, too few seeds to tell; test accuracy 79.60% vs 80.00%, −0.4 points, too "
        "few seeds to tell; peak GPU memory (max over GPUs) 310.0 vs 300.0 MiB, 1.03×, too few "
        "seeds to tell."
    ]
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.62×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 81%."
    ]
    summary = observations.status_summary(study)
    assert summary == [
        "2 of 3 runs finished; no numbers for dataparallel_2gpu (skipped): the reasons are in "
        "the results table."
    ]


def test_comparisons_are_made_over_the_seeds_and_say_when_they_are_within_noise():
    """Each seed 0.99, 1.00, 1.01 times its run's numbers: ddp_4gpu's 1.01× throughput and
    ddp_2gpu's −0.4 points lie within the seeds' noise; Welch's intervals (checked against
    scipy's ttest_ind, on logs for ratios)."""
    spread = (0.99, 1.0, 1.01)
    metrics = [
        fake_metrics("single_gpu", launcher="single", epochs=3, spread=spread),
        fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0,
                     epochs=3, test_accuracy=0.796, gpu_mib=310.0, spread=spread),
        fake_metrics("ddp_4gpu", launcher="torchrun", nproc_per_node=4, samples_per_s=1010.0,
                     epochs=3, test_accuracy=0.70, spread=spread),
    ]  # fmt: skip
    study = alike("parallelism", {}, metrics)
    assert observations.versus_baseline(study) == [
        "ddp_2gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(2 vs 1), global batch (64 vs 32: 0.5× the steps per epoch)): "
        "samples/s over the steady epochs 1,620 vs 1,000 (geometric "
        "means): 1.62× (95% interval 1.58–1.66×), faster; test accuracy 79.60% vs 80.00%, −0.4 "
        "points (95% interval −2.2 to +1.4), within seed noise; peak GPU memory (max over GPUs) "
        "311.6 vs 301.5 MiB, 1.033× (95% interval 1.003–1.065×), heavier.",
        "ddp_4gpu vs single_gpu (they differ in launcher (torchrun vs single), nproc_per_node "
        "(4 vs 1), global batch (128 vs 32: 0.25× the steps per epoch)): "
        "samples/s over the steady epochs 1,010 vs 1,000 (geometric "
        "means): 1.01× (95% interval 0.99–1.03×), within seed noise; test accuracy 70.00% vs "
        "80.00%, −10.0 points (95% interval −11.7 to −8.3), less accurate; peak GPU memory (max "
        "over GPUs) 301.5 vs 301.5 MiB, 1.00× (the same in every seed), identical in every seed "
        "compared.",
    ]
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.62× (95% interval "
        "1.58–1.66×), faster; ideal 2×, parallel efficiency 81% (95% interval 79–83%).",
        "ddp_4gpu (4 workers): speed-up over single_gpu (1 worker) 1.01× (95% interval "
        "0.99–1.03×), within seed noise; ideal 4×, parallel efficiency 25% (95% interval "
        "25–26%).",
    ]
    assert observations.seed_note(study) == []


def test_a_study_of_one_seed_says_once_that_it_has_no_intervals():
    lines = observations.all_observations(a1_study())
    note = (
        "This study ran with one seed, so its numbers have no intervals and no difference "
        "between its runs can be told apart from seed noise."
    )
    assert lines[0] == note and lines.count(note) == 1
    assert not any("interval" in line for line in lines[1:])
    assert observations.warm_process(a1_study()) == []  # no later seeds
    assert observations.seed_note(seeds_study()) == [
        "One seed only, so no interval for their numbers or comparisons: dataparallel_2gpu."
    ]


def test_the_warm_process_compares_later_seeds_steady_epochs_with_the_first_seeds():
    """warm's first seed runs its epochs 2..4 1.2 times as long as the later seeds: 0.83×,
    beyond noise (Welch on the logs of 6 epochs against 3: 0.77–0.90×); same's seeds match;
    short has two epochs, so its first seed one steady epoch and no interval."""
    times = [15, 10.0, 10.4, 9.6]
    metrics = [
        fake_metrics("warm", epochs=4, history=epochs(times), spread=(1.2, 1.0, 1.0)),
        fake_metrics("same", epochs=4, history=epochs(times), spread=(1.0, 1.0, 1.0)),
        fake_metrics("short", epochs=2, spread=(1.0, 1.0)),
        fake_metrics("failed", "failed", epochs=4),
    ]
    study = alike("parallelism", {}, metrics)
    assert observations.warm_process(study) == [
        "Warm process, later seeds' steady epochs against the first seed's: warm 0.83× (95% "
        "interval 0.77–0.90×), faster; same 1.00× (95% interval 0.92–1.08×), within epoch "
        "noise; short 1.00×, too few epochs to tell. The later seeds match the first within the "
        "epochs' noise in same, and are faster beyond the epochs' noise in warm. No interval "
        "for short: the first seed has one steady epoch."
    ]
    assert observations.warm_process(study)[0] in observations.all_observations(study)


def test_a_run_scales_against_the_single_worker_run_that_stepped_as_it_did():
    """Before: A1's DataParallel, which asks for a CUDA graph and steps eagerly, scaled
    against the graph-replayed single_gpu (0.05×, parallel efficiency 3%): the step changed
    with the launcher, unsaid. It scales against the eager single-GPU run."""
    why = "DataParallel copies the model to its GPUs from Python in every step"
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single", samples_per_s=10000.0),
            fake_metrics("single_gpu_eager", launcher="single", step="eager",
                         samples_per_s=1000.0),
            fake_metrics("dp", launcher="dp", nproc_per_node=2, eager_reason=why,
                         samples_per_s=1200.0),
        ],
    )  # fmt: skip
    assert study.scaling_reference("dp") == "single_gpu_eager"
    assert observations.scaling(study) == [
        "dp (2 workers): speed-up over single_gpu_eager (1 worker) 1.20×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 60%."
    ]


def test_runs_that_could_not_use_a_cuda_graph_are_named_with_the_reason():
    dp_reason = "DataParallel copies the model to its GPUs from Python in every step"
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single"),
            fake_metrics("single_gpu_dataloader", launcher="single", loader="torch", step="eager"),
            fake_metrics("dp_a", launcher="dp", nproc_per_node=2, eager_reason=dp_reason),
            fake_metrics("dp_b", launcher="dp", nproc_per_node=2, eager_reason=dp_reason),
        ],
    )
    # Only GPU runs that asked for a graph and didn't get one; eager by request is silent.
    assert observations.step_check(study) == [
        f"Trained eagerly, not from a CUDA graph ({dp_reason}): dp_a, dp_b."
    ]
    assert study.runs.loc["single_gpu", "step_mode"] == "cuda_graph"


def test_half_precision_a_cpu_computes_slowly_is_named_with_its_cause():
    def study(kernels, flags):
        runs = [_on_cpu(fake_metrics(p, study="precision", precision=p), kernels, flags)
                for p in ("fp32", "bf16", "fp16")]  # fmt: skip
        return alike("precision", {}, runs)

    # The development machine: AVX-512 without bf16 or fp16 instructions.
    lines = observations.cpu_half_precision(study({"bf16": True, "fp16": False}, []))
    assert len(lines) == 2
    assert lines[0].startswith("fp16: the oneDNN probe of this host found no fp16 kernel for this")
    assert "(convolutions: aten::_slow_conv2d_forward and _backward, as bench" in lines[0]
    assert lines[1].startswith("bf16: the CPU flags of this host show no bf16 instructions")
    # A CPU with AMX for both computes both natively: nothing to explain.
    assert not observations.cpu_half_precision(
        study({"bf16": True, "fp16": True}, ["avx512_bf16", "amx_bf16", "amx_fp16"])
    )
    # The lent H200 hosts' Xeon: oneDNN has fp16 kernels, but its weight gradient without
    # AMX-FP16 is oneDNN's reference code (bench/cpu_autocast.py, ONEDNN_VERBOSE).
    [line] = observations.cpu_half_precision(
        study({"bf16": True, "fp16": True}, ["avx512_bf16", "avx512_fp16", "amx_bf16"])
    )
    assert line.startswith("fp16: this CPU has oneDNN fp16 kernels but no AMX-FP16")
    assert "(ref:any in ONEDNN_VERBOSE)" in line
    # A record older than these facts says nothing it doesn't know.
    old = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in old:
        m["derived"]["device"] = "cpu"
    assert not observations.cpu_half_precision(alike("precision", {}, old))
    # GPU runs are not the CPU's business.
    gpu = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in gpu:
        m["host"]["cpu_half_precision"] = {"onednn_kernels": {"bf16": True, "fp16": False},
                                           "flags": []}  # fmt: skip
    assert not observations.cpu_half_precision(alike("precision", {}, gpu))


@pytest.mark.parametrize("storage", ["python", "pyarrow"])
def test_half_precision_note_on_a_study_of_gpu_runs_whatever_backs_pandas_strings(storage):
    """A study whose runs all trained on GPUs of a host whose CPU has bf16 instructions: no
    CPU line, with pandas' strings backed by Python or by Arrow (pyarrow installed, as on the
    lent GPU hosts, where masks mapped from an empty string column stayed strings and `&`
    raised in report_study: 2x H200, pandas 3.0.6, pyarrow 25.0.1)."""
    gpu = [fake_metrics(p, study="precision", precision=p) for p in ("fp32", "fp16")]
    for m in gpu:
        m["host"]["cpu_half_precision"] = {"onednn_kernels": {"bf16": True, "fp16": True},
                                           "flags": ["avx512_bf16", "amx_bf16"]}  # fmt: skip
    with pd.option_context("mode.string_storage", storage):
        study = alike("precision", {}, gpu)
        assert study.ok["cpu_half_flags"].dtype.storage == storage
        assert observations.cpu_half_precision(study) == []


def test_each_data_path_scales_against_its_own_single_worker_run(tmp_path):
    course = {"loader": "torch", "step": "eager"}
    study = alike(
        "parallelism",
        {},
        [
            fake_metrics("single_gpu", launcher="single", samples_per_s=10000.0),
            fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, samples_per_s=18000.0),
            fake_metrics(
                "single_gpu_dataloader", launcher="single", samples_per_s=1000.0, **course
            ),
            fake_metrics(
                "ddp_2gpu_dataloader", launcher="torchrun", nproc_per_node=2,
                samples_per_s=1500.0, **course,
            ),
        ],
    )  # fmt: skip
    assert study.scales_workers
    assert observations.scaling(study) == [
        "ddp_2gpu (2 workers): speed-up over single_gpu (1 worker) 1.80×, too few seeds to "
        "tell; ideal 2×, parallel efficiency 90%.",
        "ddp_2gpu_dataloader (2 workers): speed-up over single_gpu_dataloader (1 worker) 1.50×, "
        "too few seeds to tell; ideal 2×, parallel efficiency 75%.",
    ]
    # The throughput comparison still shows what the data path itself is worth.
    assert observations.versus_baseline(study)[1].startswith(
        "single_gpu_dataloader vs single_gpu (they differ in loader (torch vs device), step (eager "
        "vs CUDA graph)): samples/s over the steady epochs 1,000 vs 10,000 "
        "(geometric means): 0.10×, too few seeds to tell;"
    )
    figures.speedup(study, tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_a_cpu_runs_memory_is_one_value_per_job_and_its_verdict_says_so():
    """Before: a CPU run's peak host RSS (one value per job) read "too few seeds to tell" in
    the observations and "too few jobs to tell" in the answer."""
    runs = [fake_metrics("single_gpu", launcher="single", gpu_mib=None, spread=(1.0, 1.1)),
            fake_metrics("ddp_2gpu", launcher="torchrun", nproc_per_node=2, gpu_mib=None,
                         spread=(1.0, 1.1))]  # fmt: skip
    for m in runs:
        m["derived"]["device"] = "cpu"
    [line] = observations.versus_baseline(alike("parallelism", {}, runs))
    assert line.endswith("peak host RSS (max over ranks) 2000.0 vs 2000.0 MiB, 1.00×, too few "
                         "jobs to tell.")  # fmt: skip


def test_a_skipped_baseline_gives_no_comparison():
    lines = observations.versus_baseline(a1_study(baseline="dataparallel_2gpu"))
    assert lines == [
        "The baseline dataparallel_2gpu has no numbers (skipped), so no run is compared with it."
    ]


def test_sweep_fits_memory_against_the_swept_setting():
    metrics = [
        fake_metrics(
            f"b{b}",
            study="batch_size",
            batch_size=b,
            gpu_mib=100 + 2.5 * b,
            epochs=2,
            test_accuracy=0.9 - b / 1000,
        )
        for b in (16, 32, 64, 128)
    ]
    study = alike("batch_size", {"baseline": "b32"}, metrics)
    assert study.sweep_key == "batch_size"
    lines = observations.sweep(study)
    # The answer's fit (comparisons.fit), so that the section gives one line, not two.
    assert lines[0].startswith(
        "peak GPU memory vs batch_size: grows along a line within noise, 2.500 MiB per unit of "
        "batch_size"
    )
    assert "plus 100.0 MiB" in lines[0] and "R² = 1.000" in lines[0]
    assert lines[1] == (
        "From batch_size 16 to 128: samples/s over the steady epochs 1,000 → 1,000 (geometric "
        "means), 1.00×, too few seeds to tell; test accuracy 88.40% → 77.20%, −11.2 points, too "
        "few seeds to tell; the means are falling at every step."
    )


def test_generalization_flags_test_loss_rising_while_train_loss_falls():
    losses = [(2.0, 1.9), (1.5, 1.6), (1.0, 1.7), (0.5, 1.9)]  # train falls, test turns up
    history = [
        {
            "epoch": e,
            "train_loss": tr,
            "test_loss": te,
            "train_accuracy": 0.5 + 0.1 * e,
            "test_accuracy": 0.5,
            "train_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e, (tr, te) in enumerate(losses, start=1)
    ]
    metrics = [
        fake_metrics("steady", epochs=3),
        # Three seeds, each rising from epoch 2 (the rule: an interval over the seeds).
        fake_metrics("overfits", epochs=4, history=history, spread=(0.95, 1.0, 1.05)),
    ]
    result = overfitting.generalization(alike("parallelism", {}, metrics))
    rows = {row[0]: row for row in result["rows"]}
    assert rows["overfits"][3] == "2 of 4" and rows["overfits"][5] == "yes"
    assert rows["overfits"][1] == "40.0"  # train 90% vs test 50% at the end
    assert rows["steady"][5] == "no"
    assert "overfits" in result["summary"]


def test_a5_predicts_each_backends_all_reduce_from_the_collectives_sweep():
    """The course CNN's 620,586 parameters: a 2.37 MiB gradient, all-reduced by DDP in a 1 MiB
    bucket and a 1.37 MiB one; 50,000 images at 32 per rank on 2 ranks: 782 steps per epoch.
    The sweep's latencies grow as size^0.5 (NCCL: 50 µs at 1 MiB, 100 at 4 MiB) and size^1
    (Gloo: 500 and 2000 µs): 0.1085 and 1.1837 ms per step, 0.0848 and 0.926 s per epoch."""

    def run(name: str, backend: str, epoch_s: float) -> dict:
        metrics = fake_metrics(name, study="backend", launcher="torchrun", nproc_per_node=2,
                               backend=backend, epochs=3, history=epochs([2 * epoch_s, epoch_s,
                               epoch_s]), spread=(0.9, 1.0, 1.1))  # fmt: skip
        metrics |= {"parameters": 620586}
        metrics["data"]["n_train"] = 50000
        for rank in metrics["ranks"]:
            rank["device"] = f"cuda:{rank['rank']}"
        return metrics

    study = alike("backend", {}, [run("nccl_b32", "nccl", 0.44), run("gloo_b32", "gloo", 4.1)])
    sweep = pd.DataFrame(
        [{"backend": b, "device": "cuda", "op": "all_reduce", "processes": 2, "status": "ok",
          "size_bytes": size, "latency_us": us}
         for b, points in (("nccl", ((MIB, 50.0), (4 * MIB, 100.0))),
                           ("gloo", ((MIB, 500.0), (4 * MIB, 2000.0))))
         for size, us in points]
    )  # fmt: skip
    nccl, gloo, pair = observations.communication(study, sweep)
    assert "2.37 MiB gradient (nccl, cuda tensors, 2 processes" in nccl
    assert "at 0.108 ms; its 782 steps per epoch make 0.08 s" in nccl
    assert "at 1.18 ms; its 782 steps per epoch make 0.93 s" in gloo
    # Measured: 4.1 vs 0.44 s (seeds ×0.9, 1, 1.1); predicted 0.841 s of the 3.66 s gap.
    assert pair.startswith("gloo_b32 vs nccl_b32: their steady epochs differ by 3.66 s")
    assert pair.endswith("the sweep puts 23% of the gap on the all-reduce; 77% of it stays "
                         "unexplained here.")  # fmt: skip
    assert observations.communication(study, None) == []
    # Gloo's epoch at 1.3 s: a 0.86 s gap (95% interval 0.57 to 1.15 s) holds the 0.84 s.
    study = alike("backend", {}, [run("nccl_b32", "nccl", 0.44), run("gloo_b32", "gloo", 1.3)])
    *_, pair = observations.communication(study, sweep)
    assert pair.endswith("98% of the gap on the all-reduce, and the prediction lies inside the "
                         "measured interval.")  # fmt: skip


def test_figures_an_earlier_version_dropped_are_said_where_the_tables_omit_them():
    """A version-3 record read now loses a graph step's step figure (dmls/versions.py): the
    section says which runs, what and why, instead of a column that silently goes."""
    from dmls import versions

    metrics = [fake_metrics(f"b{b}", study="batch_size", batch_size=b, spread=(1.0, 1.0))
               for b in (16, 32)]  # fmt: skip
    metrics[1]["earlier_version"] = {
        "metrics_version": 3, "dropped": ["step_gpu_mem_bytes"], "why": versions.V3_STEP_WHY
    }  # fmt: skip
    study = alike("batch_size", {}, metrics)
    assert observations.earlier_versions(study) == [
        f"Not shown for b32: step_gpu_mem_bytes, {versions.V3_STEP_WHY}; a run trained again "
        "with this pipeline records them."
    ]


def test_overfitting_is_a_rise_beyond_seed_noise_not_a_share_of_the_mean():
    """A rise was once called overfitting when the mean curve ended 1% above its minimum, a
    threshold with no seeds in it. Now each seed's rise from the minimum's epoch to the last
    is compared with 0 over the seeds: rises that disagree in sign are seed noise, however
    large the mean's; one seed tells none."""

    def run(name, seeds):
        m = fake_metrics(name, epochs=3, spread=(1.0,) * len(seeds))
        for seed, (mid, last) in zip(m["seeds"], seeds, strict=True):
            for row, loss in zip(seed["history"], (2.0, mid, last), strict=True):
                row["test_loss"], row["train_loss"] = loss, 3.0 / row["epoch"]
        return m | record.combine(m)

    study = alike("parallelism", {}, [
        run("rises", [(1.0, 1.10), (1.0, 1.12), (1.0, 1.11)]),
        run("noise", [(1.0, 1.30), (1.0, 0.98), (1.0, 0.99)]),
        run("one", [(1.0, 1.5)]),
    ])  # fmt: skip
    flags = {r[0]: r[5] for r in overfitting.generalization(study)["rows"]}
    assert flags == {"rises": "yes", "noise": "no", "one": "no"}
