"""dmls.report's figures: the seeds' intervals drawn as error bars and bands, every figure a
section builds (the overview, curves, speed-up, a sweep, a grid's heatmap), the figure
that draws the reasons where nothing ran, and a log axis for a panel whose runs differ more
than tenfold."""

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from matplotlib.container import ErrorbarContainer

from conftest import alike
from dmls.report import figures, section
from fake_runs import fake_metrics, seeds_study


def test_figures_draw_the_seeds_intervals(tmp_path, monkeypatch):
    """Error bars of the overview and the speed-up, bands of the curves, at the intervals of
    the seeds' numbers (single_gpu's samples/s 1000 / 0.9, 1000 / 1.0, 1000 / 1.1)."""
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.stem, fig))
    study = seeds_study()
    figures.overview(study, tmp_path / "overview.png")
    (time_bars,) = [c for c in drawn["overview"].axes[0].containers
                    if isinstance(c, ErrorbarContainer)]  # fmt: skip
    time_bars = time_bars.lines[2][0].get_segments()
    speeds = [1000 / f for f in (0.9, 1.0, 1.1)]
    half = scipy.stats.t.ppf(0.975, 2) * np.std(speeds, ddof=1) / np.sqrt(3)
    mean = np.mean(speeds)
    assert time_bars[0][:, 0] == pytest.approx([mean - half, mean + half], abs=1e-3)
    assert np.isnan(time_bars[2]).all()  # one seed: no whisker, no cap
    assert drawn["overview"].axes[0].get_xscale() == "linear"  # (runs within tenfold)

    figures.overlay(study, tmp_path / "curves.png")
    accuracy = drawn["curves"].axes[1]
    band = accuracy.collections[0].get_paths()[0].vertices  # single_gpu's test accuracy
    at_last_epoch = sorted(band[band[:, 0] == 3][:, 1])
    assert at_last_epoch[0] == pytest.approx(80 - 19.873, abs=1e-3)
    assert at_last_epoch[-1] == pytest.approx(80 + 19.873, abs=1e-3)
    assert len(accuracy.collections) == 2  # the test bands of the two runs with seeds

    figures.speedup(study, tmp_path / "speedup.png")
    bars = {c.get_label(): c for c in drawn["speedup"].axes[0].containers}
    (segment,) = bars["ddp_2gpu: 1.62×"].lines[2][0].get_segments()
    logs = [np.log(rate / np.array(spread)) for rate, spread in
            ((1620.0, (0.95, 1.0, 1.05)), (1000.0, (0.9, 1.0, 1.1)))]  # fmt: skip
    ci = scipy.stats.ttest_ind(*logs, equal_var=False).confidence_interval(0.95)
    assert segment[:, 1] == pytest.approx(np.exp([ci.low, ci.high]))

    figures.run_curves(study, "single_gpu", tmp_path / "single_gpu.png")
    assert len(drawn["single_gpu"].axes[0].collections) == 2  # train and test loss bands


def test_a_study_with_seeds_builds_every_figure(tmp_path):
    metrics = [
        fake_metrics(f"b{b}", study="batch_size", batch_size=b, gpu_mib=100 + 2.5 * b, epochs=2,
                     spread=(0.95, 1.0, 1.05))
        for b in (16, 32, 64)
    ]  # fmt: skip
    study = alike("batch_size", {}, metrics)
    built = section.build(study, None, tmp_path, tmp_path / "curves", tmp_path / "figures")
    assert [f["name"] for f in built["figures"]] == ["overview", "curves", "sweep",
                                                     "generalization"]  # fmt: skip
    for item in built["figures"] + built["curves"]:
        assert (tmp_path / item["file"]).read_bytes()[:4] == b"\x89PNG"
    csv = pd.read_csv(tmp_path / "results.csv")
    assert list(csv["n_seeds"]) == [3, 3, 3] and csv["test_accuracy_ci95"].gt(0).all()


def test_grid_study_draws_a_heatmap_and_the_speedup(tmp_path):
    metrics = [
        fake_metrics(
            f"n{n}xp{p}",
            study="cluster_torchrun",
            nodes=n,
            nproc_per_node=p,
            launcher="torchrun",
            samples_per_s=1000.0 if n * p == 1 else 900.0 * n * p,
            gpu_mib=None,
            epochs=2,
        )
        for n in (1, 2)
        for p in (1, 2)
    ]
    study = alike("cluster_torchrun", {}, metrics)
    assert study.is_grid and study.scales_workers
    built = section.build(study, None, tmp_path, tmp_path / "curves", tmp_path / "figures")
    names = [f["name"] for f in built["figures"]]
    assert names == ["overview", "curves", "speedup", "grid", "generalization"]
    for item in built["figures"] + built["curves"]:
        assert (tmp_path / item["file"]).read_bytes()[:4] == b"\x89PNG"
    assert (
        "n2xp2 (4 workers): speed-up over n1xp1 (1 worker) 3.60×, too few seeds to tell; ideal "
        "4×, parallel efficiency 90%." in built["observations"]
    )
    # CSV: numbers only for ok runs; the memory is host RSS here (no GPU).
    csv = (tmp_path / "results.csv").read_text()
    assert csv.splitlines()[0].startswith("run,status,reason,spec.nodes,spec.nproc_per_node")


def test_a_study_where_nothing_ran_draws_its_reasons(tmp_path):
    metrics = [fake_metrics("fp8", "skipped", study="precision", epochs=2)]
    built = section.build(
        alike("precision", {}, metrics), None, tmp_path, tmp_path / "c", tmp_path / "f"
    )
    assert [f["name"] for f in built["figures"]] == ["no_results"]
    assert built["curves"][0]["file"] == "c/fp8.png"


def test_a_panel_whose_runs_differ_more_than_tenfold_has_a_log_axis(tmp_path, monkeypatch):
    """Before: A1's overview on a linear axis, where DDP's graph-replayed 122,938 samples/s
    left the DataLoader runs the answer reads (3,848) as slivers."""
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.stem, fig))
    runs = [fake_metrics("graphs", samples_per_s=120_000.0),
            fake_metrics("dataloader", samples_per_s=3_800.0)]  # fmt: skip
    figures.overview(alike("parallelism", {}, runs), tmp_path / "overview.png")
    throughput, memory, accuracy = drawn["overview"].axes
    assert throughput.get_xscale() == "log" and "log scale" in throughput.get_xlabel()
    assert memory.get_xscale() == accuracy.get_xscale() == "linear"
    assert figures.wide([1.0, 10.5]) and not figures.wide([1.0, 10.0, float("nan")])
