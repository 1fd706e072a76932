"""The timer's rules that hold without a GPU: which figure is scored when replays run beside event-timed batches,
a batch's figure on the referee's clock, the stopping rule over batches, and the spins a batch opens with (the GPU
paths run in scripts/timer_fidelity.py)."""

import pytest

from kbsweep.grader.shared import timing

pytestmark = pytest.mark.fast


def summary(ms: float) -> dict:
    return timing.summarize([ms * 0.99, ms, ms * 1.01])


@pytest.mark.parametrize("events_ms, replay_ms", [(0.177, 0.173), (1.538, 1.540), (0.200, 0.150), (0.004, 0.0001)])
def test_a_captured_replay_is_scored_whatever_the_events_read(events_ms, replay_ms):
    """Both figures are the referee's clock: a graph's one launch amortizes what eager launches cost a small call."""
    figure = timing.scored(summary(events_ms), summary(replay_ms))
    assert figure["timer"] == "replay" and figure["median_ms"] == pytest.approx(replay_ms)
    assert figure["events"]["median_ms"] == pytest.approx(events_ms) and figure["replay"]["median_ms"] == pytest.approx(
        replay_ms
    )
    assert "replay_refused" not in figure


def test_a_capture_that_failed_leaves_the_events_figure_with_the_reason():
    figure = timing.scored(summary(0.5), {"error": "capture failed: operation not permitted when stream is capturing"})
    assert figure["timer"] == "events" and figure["median_ms"] == pytest.approx(0.5)
    assert "not permitted" in figure["replay_refused"]
    assert timing.scored(summary(0.5), None) == {**summary(0.5), "timer": "events", "events": summary(0.5)}


def test_a_replay_sample_is_what_the_calls_added_per_call():
    assert timing.replay_sample(replay_ms=5.5, bare_ms=0.7, calls=32) == pytest.approx(0.15)


@pytest.mark.parametrize("enqueue_us, gpu_ms", [(1000.0, 0.15), (900.0, 1.5), (40.0, 0.02)])
def test_a_replay_batch_opens_behind_a_spin_for_its_warm_calls_only(enqueue_us, gpu_ms):
    shape = timing.batch_shape({"enqueue_us": [enqueue_us] * 3, "ms": [gpu_ms] * 3}, latency=False)
    assert shape["replay_spin_us"] <= shape["spin_us"]
    behind_us = max(enqueue_us - gpu_ms * 1e3, 0.0)
    assert shape["replay_spin_us"] == pytest.approx(
        min(1.5 * shape["warm_calls"] * behind_us + 1000, timing.MAX_BATCH_SPIN_US)
    )
    if behind_us and shape["per_batch"]:
        assert shape["spin_us"] > shape["replay_spin_us"] or shape["spin_us"] == timing.MAX_BATCH_SPIN_US


def test_spans_answer_membership_as_a_scan_of_every_span_would():
    import random

    from kbsweep.grader.shared.profiling import Spans

    rng = random.Random(7)
    spans = [(a, a + rng.randrange(0, 50)) for a in (rng.randrange(0, 1000) for _ in range(60))]
    found = Spans(spans)
    for t in range(-5, 1100):
        assert (t in found) == any(start <= t <= end for start, end in spans)


@pytest.mark.parametrize(
    "replays, min_runs, short",
    [(3, 3, True), (timing.MIN_REPLAYS, 3, False), (timing.MIN_REPLAYS, 20, True), (20, 20, False)],
)
def test_a_shape_with_replays_runs_enough_of_them_for_several_draws(replays, min_runs, short):
    assert timing.replays_short([0.1] * replays, timing.TimingConfig(min_runs=min_runs)) is short


@pytest.mark.parametrize(
    "batches, calls, stops",
    [
        (1, 32, False),  # one batch: no standard error yet
        (2, 1, False),  # 2 calls, under min_runs
        (4, 32, True),  # 128 calls: past max_runs
        (2, 8, False),  # 16 calls of noisy batches: the error is still large
    ],
)
def test_the_stopping_rule_counts_each_batch_figure_as_its_calls(batches, calls, stops):
    noisy = [0.1, 0.2, 0.1, 0.2][:batches]
    assert timing.stop(noisy, timing.TimingConfig(), 0.0, calls) is stops


def test_a_steady_figure_stops_at_two_batches_and_time_runs_out_whatever_the_error():
    assert timing.stop([0.1, 0.1], timing.TimingConfig(), 0.0, 8)
    assert timing.stop([0.1, 0.3], timing.TimingConfig(max_time_s=1.0), 1.5, 8)


def test_the_referee_sample_is_the_wall_less_its_null_per_call():
    assert timing.referee_sample(wall_ms=10.0, null_ms=2.0, calls=16) == pytest.approx(0.5)
    assert timing.referee_sample(wall_ms=1.0, null_ms=2.0, calls=16) > 0  # a wall under the null is no negative time


@pytest.mark.parametrize(
    "gpu_ms, host_ms", [(0.035, 0.885), (2.0, 0.3), (0.2, 0.25)]
)  # launch-bound (topk b64 on an H100), GPU-bound, mixed
def test_the_runners_account_of_an_event_batch_never_exceeds_the_referees_wall_unless_forged(gpu_ms, host_ms):
    from kbsweep.grader.referee.corroboration import FLOOR

    calls, steps_ms, copies_ms = 53, 0.27, 2.0  # steps_ms: a call's host steps around it (flush, copies, event records)
    loop = lambda call_ms, host=host_ms: calls * max(host, steps_ms + call_ms) + 0.05  # noqa: E731 - the slower of host and GPU, a sync
    wall_ms, null_ms = (
        copies_ms + loop(gpu_ms),
        copies_ms + loop(0.0, steps_ms),
    )  # the referee's, around the same and around nothing
    seen = timing.referee_sample(wall_ms, null_ms, calls)
    honest = timing.events_claim([gpu_ms] * calls, loop(gpu_ms), loop(0.0, steps_ms), calls)
    assert seen / honest >= FLOOR
    inflated = timing.events_claim([gpu_ms * 5] * calls, loop(gpu_ms * 5, host_ms * 5), loop(0.0, steps_ms), calls)
    assert seen / inflated < FLOOR
    assert timing.events_claim([gpu_ms] * calls, None, 0.0, calls) == pytest.approx(
        gpu_ms
    )  # no loop reported: the GPU's alone


@pytest.mark.parametrize("n, lower, upper", [(100, 40, 61), (10, 2, 9), (5, 1, 5), (1, 1, 1)])
def test_the_interval_beside_the_median_is_the_binomial_order_statistics(n, lower, upper):
    """Textbook distribution-free 95 % intervals of a median: the 40th and 61st of 100, the 2nd and 9th of 10, the
    whole range of 5 (too few for 95 %)."""
    samples = [float(i) for i in range(n, 0, -1)]  # given unsorted
    assert timing.summarize(samples)["ci95_ms"] == [float(lower), float(upper)]


def test_the_interval_holds_the_scored_median_of_a_skewed_sample_and_covers_the_true_one():
    """A slow tail pulls the mean's interval off the median the score uses; the median's own holds it, and over many
    draws covers the distribution's median at least ~95 % of the time."""
    import math
    import random

    skewed = [1.0 + 0.001 * i for i in range(90)] + [5.0] * 10
    summary = timing.summarize(skewed)
    lower, upper = summary["ci95_ms"]
    assert lower <= summary["median_ms"] <= upper and summary["mean_ms"] > upper
    draws = random.Random(7)
    covered = sum(
        lo <= math.log(2) <= hi
        for lo, hi in (timing.summarize([draws.expovariate(1.0) for _ in range(30)])["ci95_ms"] for _ in range(2000))
    )
    assert covered / 2000 >= 0.94
