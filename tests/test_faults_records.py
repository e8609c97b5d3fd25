"""A metrics.json with impossible values of the right type (more finished seeds than the run
asked for, an accuracy above 1) is refused by record.read, and so by the aggregation, naming
the file, the key and the value. Before, `summary.n_finished: 5` on a 2-seed run and a test
accuracy mean of 1.7 reached runs.csv and the report ("170.00 ± 34.74")."""

import copy

import pytest

from conftest import make_spec
from dmls import record
from dmls.files import write_json

HOST = {"hostname": "h", "gpus": []}


def seed(k: int, accuracy: float) -> dict:
    """One finished seed of a 2-epoch run (record.new_seed's shape)."""
    history = [
        {"epoch": e, "train_loss": 1.0 / e, "train_accuracy": accuracy, "test_loss": 1.0 / e,
         "test_accuracy": accuracy, "train_time_s": 1.0, "eval_time_s": 0.1, "lr": 0.01}
        for e in (1, 2)
    ]  # fmt: skip
    final = {"train_loss": 0.5, "train_accuracy": accuracy, "test_loss": 0.5,
             "test_accuracy": accuracy, "best_test_accuracy": accuracy, "epochs_completed": 2,
             "stopped_early_epoch": None, "diverged_epoch": None}  # fmt: skip
    timing = {"setup_s": 0.5, "train_time_s": 2.0, "eval_time_s": 0.2, "checkpoint_time_s": 0.0,
              "fit_s": 2.2, "first_epoch_s": 1.0, "steady_epoch_s": 1.0,
              "samples_per_s": 100.0}  # fmt: skip
    return {
        "seed": k, "status": "ok", "reason": None, "kept": False, "history": history,
        "final": final, "timing": timing, "peak_gpu_mem_allocated_bytes": None,
        "peak_gpu_mem_reserved_bytes": None, "effective_precision": "fp32",
        "fp8_linear_layers": 0, "parameters": 10,
        "step": {"requested": "eager", "mode": "eager", "compiled": False, "eager_reason": None},
        "data": {"name": "tabular", "synthetic": True},
    }  # fmt: skip


def two_seed_record() -> dict:
    """A valid record of a run that asked for 2 seeds, 2 epochs each, both finished."""
    spec = make_spec(dataset="tabular", model={"name": "mlp"}, device="cpu", seeds=2, epochs=2)
    built = record.Builder(spec, device="cpu", host=HOST, nodes_emulated=False)
    timing = dict(setup_s=1.0, process_group_s=0.1, fit_s=4.4, teardown_s=0.1, wall_time_s=5.6)
    job = {
        "seeds": [seed(0, 0.80), seed(1, 0.84)],
        "timing": timing,
        "world_size": 1,
        "ranks": [{"rank": 0, "hostname": "h", "gpus": [], "peak_host_rss_bytes": 2**30}],
        "energy": {"measured": False, "reason": "CPU", "counts": "", "update_period_s": None},
    }
    return built.trained(job) | {"finished_at": record.now()}


def test_the_record_built_here_is_valid(tmp_path):
    path = tmp_path / "metrics.json"
    record.write(path, two_seed_record())
    assert record.read(path)["summary"]["n_finished"] == 2


def skipped_with_a_summary(m: dict) -> None:
    """A skipped run's record that still carries a summary: no seeds to count against."""
    summary = m["summary"] | {"n_finished": 5}
    for key in ("seeds", "final", "history", "ranks", "timing", "step", "data"):
        m.pop(key)
    m |= {"status": "skipped", "reason": "no CUDA GPU on this host", "summary": summary}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        # The two records.
        (lambda m: m["summary"].update(n_finished=5), "summary/n_finished: 5 of 2 seeds"),
        (lambda m: m["summary"]["test_accuracy"].update(mean=1.7),
         "summary/test_accuracy/mean: 1.7 is greater than the maximum of 1"),
        # Their neighbours: the same counts and accuracies elsewhere in the record.
        (skipped_with_a_summary, "summary/n_finished: 5, but the spec asks for 2 seeds"),
        (lambda m: m["summary"]["best_test_accuracy"].update(mean=-0.1),
         "summary/best_test_accuracy/mean: -0.1 is less than the minimum of 0"),
        (lambda m: m["final"].update(test_accuracy=1.7),
         "final/test_accuracy: 1.7 is greater than the maximum of 1"),
        (lambda m: m["seeds"][1]["final"].update(test_accuracy=1.7),
         "seeds/1/final/test_accuracy: 1.7 is greater than the maximum of 1"),
        (lambda m: m["history"][0].update(n_seeds=3),
         "history/0/n_seeds: 3, more than the 2 seeds that finished"),
        (lambda m: m["summary"]["train_time_s"].update(n=4),
         "summary/train_time_s/n: 4, more than the 2 seeds that finished"),
        (lambda m: m["seeds"][0]["final"].update(epochs_completed=9),
         "seeds/0/final/epochs_completed: 9, but the spec asks for 2"),
    ],
)  # fmt: skip
def test_an_impossible_value_is_refused_naming_the_file_the_key_and_the_value(
    tmp_path, damage, named
):
    metrics = copy.deepcopy(two_seed_record())
    damage(metrics)
    path = tmp_path / "runs" / "t" / "r" / "metrics.json"
    write_json(path, metrics)  # as a damaged or hand-edited file would be: unchecked
    with pytest.raises(record.RecordError) as err:
        record.read(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert named in message
    assert message.endswith(f"rebuild that run: snakemake --forcerun {path}")
    # Nor can a writer write it.
    with pytest.raises(record.RecordError, match="breaks its schema"):
        record.write(tmp_path / "new.json", metrics)
    assert not (tmp_path / "new.json").exists()


def test_the_aggregation_refuses_them_before_runs_csv(tmp_path):
    """The aggregate step reads every record through record.read: neither value reaches
    runs.csv (Snakemake then removes the table it was building)."""
    from dmls.report import aggregate

    good = tmp_path / "good.json"
    record.write(good, two_seed_record())
    for name, damage, named in [
        ("seeds.json", lambda m: m["summary"].update(n_finished=5), "n_finished: 5 of 2"),
        ("accuracy.json", lambda m: m["summary"]["test_accuracy"].update(mean=1.7),
         "summary/test_accuracy/mean: 1.7 is greater than the maximum of 1"),
    ]:  # fmt: skip
        metrics = two_seed_record()
        damage(metrics)
        write_json(tmp_path / name, metrics)
        with pytest.raises(record.RecordError) as err:
            aggregate.read_all([good, tmp_path / name])
        assert str(err.value).startswith(f"{tmp_path / name}: ") and named in str(err.value)
