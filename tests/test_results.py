"""What a run reports (dmls/training/results.py)."""

from dmls.training.results import epoch_times


def test_the_steady_epoch_is_the_median_after_the_warm_up_epoch():
    history = [{"train_time_s": s} for s in (9.0, 1.0, 3.0, 2.0)]
    assert epoch_times(history) == {"first_epoch_s": 9.0, "steady_epoch_s": 2.0}
    assert epoch_times(history[:1]) == {"first_epoch_s": 9.0, "steady_epoch_s": None}
    assert epoch_times([]) == {"first_epoch_s": None, "steady_epoch_s": None}
