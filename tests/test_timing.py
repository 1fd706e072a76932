"""The timer's rules that hold without a GPU: which figure is scored when replays run beside event-timed batches,
a replay's per-call figure, and the spins a batch opens with (the GPU paths run in scripts/timer_fidelity.py)."""
import pytest

from kbsweep.grader import timing

pytestmark = pytest.mark.fast


def summary(ms: float) -> dict:
    return timing.summarize([ms * 0.99, ms, ms * 1.01], [ms] * 3)


@pytest.mark.parametrize("events_ms, replay_ms, timer", [
    (0.177, 0.173, "replay"),  # the event pair's ~2 us and CUPTI's share dropped: within the band
    (1.538, 1.540, "replay"),  # a replay reading slower than the events is never refused
    (0.010, 0.006, "replay"),  # 4 us under a 10 us call: the band's floor in ms
    (0.200, 0.150, "events"),  # 25% under: the captured calls ran differently, the events' figure stands
    (0.004, 0.0001, "events"),  # never under half the events' figure, however small the call
])
def test_the_replay_is_scored_only_within_the_band_under_the_events(events_ms, replay_ms, timer):
    figure = timing.scored(summary(events_ms), summary(replay_ms))
    assert figure["timer"] == timer
    assert figure["median_ms"] == pytest.approx(replay_ms if timer == "replay" else events_ms)
    assert figure["events"]["median_ms"] == pytest.approx(events_ms) and figure["replay"]["median_ms"] == pytest.approx(replay_ms)
    assert ("replay_refused" in figure) == (timer == "events")


@pytest.mark.parametrize("events_ms, replay, looks_again", [
    (0.960, summary(0.825), True),  # the replays read 14% under: a second pass decides
    (0.832, summary(0.825), False),  # within the band: scored as it is
    (0.500, {"error": "capture failed: operation not permitted when stream is capturing"}, False),  # no replay to doubt
    (0.500, None, False),  # replays off, or a mode without them
])
def test_a_second_pass_runs_only_where_the_replays_read_under_the_band(events_ms, replay, looks_again):
    assert timing.second_look(summary(events_ms), replay) is looks_again


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
    assert shape["replay_spin_us"] == pytest.approx(min(1.5 * shape["warm_calls"] * behind_us + 1000, timing.MAX_BATCH_SPIN_US))
    if behind_us and shape["per_batch"]:
        assert shape["spin_us"] > shape["replay_spin_us"] or shape["spin_us"] == timing.MAX_BATCH_SPIN_US


def test_spans_answer_membership_as_a_scan_of_every_span_would():
    import random

    from kbsweep.grader.profiling import Spans

    rng = random.Random(7)
    spans = [(a, a + rng.randrange(0, 50)) for a in (rng.randrange(0, 1000) for _ in range(60))]
    found = Spans(spans)
    for t in range(-5, 1100):
        assert (t in found) == any(start <= t <= end for start, end in spans)


@pytest.mark.parametrize("replays, min_runs, short", [(3, 3, True), (timing.MIN_REPLAYS, 3, False), (timing.MIN_REPLAYS, 20, True), (20, 20, False)])
def test_a_shape_with_replays_runs_enough_of_them_for_several_draws(replays, min_runs, short):
    assert timing.replays_short([0.1] * replays, timing.TimingConfig(min_runs=min_runs)) is short


def test_a_shape_is_timed_again_once_where_its_first_pass_read_under_the_band_and_the_last_pass_is_scored():
    passes = iter([(summary(0.960), summary(0.825)), (summary(0.832), summary(0.826)), (summary(0.960), summary(0.825))])
    looks = timing.looks(lambda: next(passes))
    assert [e["median_ms"] for e, _ in looks] == pytest.approx([0.960, 0.832])  # never a third pass
    steady = iter([(summary(0.832), summary(0.826))])
    assert len(timing.looks(lambda: next(steady))) == 1
