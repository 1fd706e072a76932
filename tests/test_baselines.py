"""Baselines cost what they must, once: a GPU baseline stops when its median is known to grade.timing.ci_rel; records
are keyed by card, driver, software and shape; a cache file is shared by every grade under one outputs folder (read
again when another grade wrote it); seeds shipped for a GPU config serve only records whose key matches exactly; a
fresh override times everything again; every served baseline says which record it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbsweep.grader import baselines
from kbsweep.grader.baselines import BaselineCache, entry_key, load_seed, settle
from kbsweep.grader.shared import timing

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
ENV = {
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "cuda": "13.0",
    "runtime": "6.8.0",
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04"}],
    "graded_on": [{"name": "NVIDIA H100 80GB HBM3"}],
}
SHAPE = {"rows": 8192, "cols": 4096}
PARTS = {"problem": "demo/scale_shift", "deck": "abc123", "gpu": "h100", "shapes": [SHAPE]}


def key(env=ENV, shape=SHAPE, deck="abc123", name="eager"):
    return entry_key("demo/scale_shift", deck, "h100", env, shape, name)


def record(**changes):
    base = {
        "problem": "demo/scale_shift",
        "deck": "abc123",
        "shape": dict(SHAPE),
        "baseline": "eager",
        "compile_mode": None,
        "conditions": baselines.conditions(ENV),
        "timing": {"median_ms": 0.14, "ci95_ms": [0.139, 0.141], "runs": 6},
    }
    conds = {k: changes.pop(k) for k in list(changes) if k in baselines.CONDITIONS}
    return {**base, **changes, "conditions": {**base["conditions"], **conds}}


def seed_file(tmp_path, records, gpu="h100"):
    path = tmp_path / "seed" / f"{gpu}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        json.dumps(
            {"format": baselines.SEED_FORMAT, "gpu": gpu, "recorded": {"date": "2026-12-08"}, "records": records}
        )
    )
    return path


# -- the stopping rule -------------------------------------------------------------------------------------------------
def test_a_baseline_stops_once_its_median_is_known_to_ci_rel():
    cfg = timing.TimingConfig(ci_rel=0.01)
    steady = [0.100, 0.1005, 0.0995, 0.1002, 0.0998, 0.1001]
    assert not timing.precise(steady[:5], 0.01)  # five samples: their range is no 95 % interval of the median
    assert timing.precise(steady, 0.01)
    assert not timing.precise([0.100, 0.103, 0.097, 0.101, 0.099, 0.1], 0.01)  # ±3 %: not known to 1 %
    assert timing.precise([0.100, 0.103, 0.097, 0.101, 0.099, 0.1], 0.05)
    # replays scored: six steady replays end it (the candidate's rule would ask MIN_REPLAYS of them)
    assert timing.baseline_done([0.2] * 600, steady, cfg, 0.5, replaying=True, calls=100)
    assert not timing.baseline_done([0.2] * 600, steady[:5], cfg, 0.5, replaying=True, calls=100)
    assert timing.replays_short(steady, cfg)
    # no call count ends a GPU baseline whose median is still unsettled (a spread of two modes), the time cap does
    split = [0.1, 0.2] * 500
    assert not timing.baseline_done(split, [], cfg, 0.5, replaying=False)
    assert timing.baseline_done(split, [], cfg, cfg.max_time_s + 0.1, replaying=False)
    assert timing.baseline_done(
        [0.1, 0.3], [0.1], cfg, cfg.max_time_s + 0.1, replaying=True, calls=8
    )  # the hard cap holds for replays too


def test_host_baselines_and_a_null_ci_rel_keep_the_candidates_rule():
    host = timing.for_device(timing.TimingConfig(), "cpu")
    assert host.ci_rel is None and timing.for_device(timing.TimingConfig(), "cuda").ci_rel == 0.01
    for events, elapsed in (([0.1] * 2, 0.0), ([0.1] * 16, 0.0), ([0.1, 0.3] * 4, 0.0), ([0.1, 0.3], 2.0)):
        assert timing.baseline_done(events, [], host, elapsed, replaying=False) is timing.stop(events, host, elapsed)
    gpu = timing.TimingConfig(ci_rel=None)
    assert not timing.baseline_done(
        [0.1] * 200, [0.1] * 6, gpu, 0.0, replaying=True, calls=100
    )  # MIN_REPLAYS, as before
    assert timing.baseline_done([0.1] * 200, [0.1] * timing.MIN_REPLAYS, gpu, 0.0, replaying=True, calls=100)


# -- keys, cache, seeds, records ---------------------------------------------------------------------------------------
def test_the_key_holds_the_card_and_a_cpu_grade_is_keyed_cpu():
    assert baselines.conditions(ENV)["card"] == "NVIDIA H100 80GB HBM3"
    assert baselines.conditions({**ENV, "graded_on": []})["card"] == "cpu"
    assert (
        baselines.conditions({k: v for k, v in ENV.items() if k != "graded_on"})["card"] == "NVIDIA H100 80GB HBM3"
    )  # an older record
    assert key({**ENV, "graded_on": [{"name": "NVIDIA H100 PCIe"}]}) != key()


def test_a_seed_serves_only_a_record_whose_key_matches_exactly(tmp_path):
    timed = lambda ms: {"timing": {"median_ms": ms}}  # noqa: E731
    others = [
        record(card="NVIDIA H100 PCIe", **timed(0.21)),
        record(driver="575.57.08", **timed(0.22)),
        record(torch="2.12.0", **timed(0.23)),
        record(triton="3.7.0", **timed(0.24)),
        record(shape={"rows": 4096, "cols": 11008}, **timed(0.25)),
        record(deck="def456", **timed(0.26)),
    ]
    cache = BaselineCache(tmp_path / "outputs/h100.json", [seed_file(tmp_path, [*others, record()])])
    assert cache.refused == [] and len(cache.seeds) == 7
    entry, source, where = cache.lookup(key())
    assert (source, entry["median_ms"], where) == ("seed", 0.14, str(tmp_path / "seed/h100.json"))
    median = lambda k: (cache.lookup(k) or ({"median_ms": None},))[0]["median_ms"]  # noqa: E731
    assert median(key({**ENV, "graded_on": [{"name": "NVIDIA H100 PCIe"}]})) == 0.21
    assert median(key({**ENV, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "575.57.08"}]})) == 0.22
    assert (median(key({**ENV, "torch": "2.12.0"})), median(key({**ENV, "triton": "3.7.0"}))) == (0.23, 0.24)
    assert (median(key(shape={"rows": 4096, "cols": 11008})), median(key(deck="def456"))) == (0.25, 0.26)
    for changed in (
        {"graded_on": [{"name": "NVIDIA H200"}]},
        {"cuda": "12.8"},
        {"runtime": "5.15"},
        {"torch": "2.12.0", "triton": "3.7.0"},
    ):
        assert cache.lookup(key({**ENV, **changed})) is None, changed
    assert cache.lookup(key(shape={"rows": 1, "cols": 1})) is None and cache.lookup(key(name="compile")) is None


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"driver": None}, "conditions.driver"),
        ({"card": ""}, "conditions.card"),
        ({"deck": ""}, "deck"),
        ({"shape": {}}, "shape"),
        ({"timer": "8"}, "timer 8"),
        ({"timing": {"ci95_ms": [1, 2]}}, "median_ms"),
        ({"baseline": "cublas"}, "unknown baseline"),
    ],
)
def test_a_seed_record_missing_part_of_its_key_or_of_another_timer_is_refused(tmp_path, bad, why):
    entries, refused = load_seed(seed_file(tmp_path, [record(**bad), record(shape={"rows": 2, "cols": 2})]), "h100")
    assert len(entries) == 1 and len(refused) == 1 and why in refused[0]


def test_a_seed_of_another_gpu_config_or_format_serves_nothing(tmp_path):
    assert load_seed(seed_file(tmp_path, [record()], gpu="h200"), "h100")[0] == {}
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({key(): {"median_ms": 0.1}}))  # the cache's own form is no seed
    entries, refused = load_seed(flat, "h100")
    assert entries == {} and "not a" in refused[0]


def test_a_grade_reads_what_another_grade_stored_after_it_opened_the_cache(tmp_path):
    """A sweep's cells open the cache when they start and grade much later: a cell reads again what others stored."""
    path = tmp_path / "outputs/baselines/h100.json"
    early, other = BaselineCache(path), BaselineCache(path)
    keys = {"eager": [key()]}
    assert early.missing(keys) == ["eager"]
    other.store({key(): {"median_ms": 0.2, "conditions": baselines.conditions(ENV)}})
    assert early.missing(keys) == [] and early.lookup(key())[1] == "cache"


def test_a_fresh_cache_serves_nothing_and_replaces_what_it_times(tmp_path):
    path = tmp_path / "h100.json"
    BaselineCache(path).store({key(): {"median_ms": 0.2}})
    fresh = BaselineCache(path, [seed_file(tmp_path, [record()])], fresh=True)
    assert fresh.missing({"eager": [key()]}) == ["eager"] and fresh.lookup(key()) is None
    fresh.store({key(): {"median_ms": 0.3}})
    assert BaselineCache(path).lookup(key())[0]["median_ms"] == 0.3


def test_every_baseline_of_a_grade_names_its_record(tmp_path):
    path = tmp_path / "h100.json"
    cache = BaselineCache(path, [seed_file(tmp_path, [record(baseline="compile", compile_mode="default")])])
    cache.store({key(name="sota"): {"median_ms": 0.05, "conditions": baselines.conditions(ENV)}})
    keys = {
        name: [entry_key("demo/scale_shift", "abc123", "h100", ENV, SHAPE, name, "default")]
        for name in ("eager", "compile", "sota")
    }
    timings = [{"shape": SHAPE, "baselines": {"eager": {"median_ms": 0.14, "runs": 6}}}]  # the referee timed eager only
    settle(timings, keys, cache, ENV, "default", PARTS)
    got = timings[0]["baselines"]
    assert {name: got[name]["record"]["source"] for name in got} == {
        "eager": "timed",
        "compile": "seed",
        "sota": "cache",
    }
    assert all(got[name]["record"]["key"] == keys[name][0] for name in got)
    assert got["eager"]["of"] == {
        "problem": "demo/scale_shift",
        "deck": "abc123",
        "gpu": "h100",
        "shape": SHAPE,
        "baseline": "eager",
        "compile_mode": None,
    }
    assert BaselineCache(path).lookup(keys["eager"][0])[0]["median_ms"] == 0.14  # stored for the next grade


def test_a_cache_file_becomes_a_seed_that_serves_the_same_keys(tmp_path):
    """scripts/store_baselines.py: what grades on a card cached becomes the checkout's seed for its GPU config."""
    cache = BaselineCache(tmp_path / "outputs/h100.json")
    timings = [
        {
            "shape": SHAPE,
            "baselines": {"eager": {"median_ms": 0.14, "runs": 6}, "compile": {"median_ms": 0.1, "runs": 6}},
        }
    ]
    keys = {
        name: [entry_key("demo/scale_shift", "abc123", "h100", ENV, SHAPE, name, "max-autotune")]
        for name in ("eager", "compile")
    }
    settle(timings, keys, cache, ENV, "max-autotune", PARTS)
    out = tmp_path / "baselines/h100.json"
    subprocess.run(
        [sys.executable, str(REPO / "scripts/store_baselines.py"), "h100", str(cache.path), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    entries, refused = load_seed(out, "h100")
    assert refused == [] and sorted(entries) == sorted(k for ks in keys.values() for k in ks)
    assert entries[keys["compile"][0]]["median_ms"] == 0.1


def test_the_config_passes_the_fresh_override_and_the_gpu_to_the_cache(problem, roofline, tmp_path):
    from kbsweep.config.gpus import GpuSpec
    from kbsweep.grader.request import GradeRequest

    gpu = GpuSpec("cpu", "a CPU", "cpu", device="cpu", shape_set="smoke_shapes", baselines=["eager"])
    track = {"name": "demo", "grade_timeout_s": 240, "world_size": 1, "sandbox": {"mode": "unsafe"}}
    paths = {"outputs": str(tmp_path / "outputs"), "problems": [str(tmp_path / "problems")]}
    for fresh in (False, True):
        grade = {
            "baselines": ["eager"],
            "memory_mib": 2048,
            "timing": {},
            "compile_mode": None,
            "timers": None,
            "fresh_baselines": fresh,
        }
        cache = GradeRequest.from_config(problem, roofline, gpu, track, grade, paths).baseline_cache
        assert (cache.fresh, cache.gpu) == (fresh, "cpu")


# -- the referee's side ------------------------------------------------------------------------------------------------
def test_the_referee_times_a_baseline_until_its_rule_ends_it_and_records_its_cost(monkeypatch):
    """time_here's batches end by timing.baseline_done: per-call figures 1 % apart are known to ci_rel after one batch
    of 8, where the candidate's rule (the mean's 0.1 % error) would ask four; each baseline carries what it cost."""
    from types import SimpleNamespace

    import torch

    from kbsweep.grader.referee import timing_stage
    from kbsweep.grader.referee.baseline_stage import time_baselines
    from kbsweep.grader.referee.timing_stage import TimingStage

    batches = []

    def run_batch(steps, mode, *args, **kwargs):
        batches.append(len(steps))
        return {"ms": [1.0 + 0.01 * (i % 2) for i in range(len(steps))], "enqueue_us": [], "loop_ms": 1.0}

    monkeypatch.setattr(timing_stage.timing, "run_batch", run_batch)
    stage = object.__new__(TimingStage)
    stage.device, stage.spec, stage.barrier, stage.req = (
        torch.device("cpu"),
        {},
        None,
        SimpleNamespace(l2_bytes=0, timers=[]),
    )
    stage.cfg = timing.TimingConfig(ci_rel=0.01)
    assert stage.time_here(lambda x: x, [[torch.ones(2)]])["runs"] == 8 and batches == [8]
    stage.cfg = timing.TimingConfig(ci_rel=None)
    assert stage.time_here(lambda x: x, [[torch.ones(2)]])["runs"] == 32
    request = SimpleNamespace(spec={}, baselines=["eager"], reference="/deck/reference.py", compile_mode=None)
    timed = time_baselines(
        request, lambda x: x, [[torch.ones(2)]], lambda: False, lambda name, fn, sets: {"median_ms": 1.0}
    )
    assert set(timed["eager"]["cost_s"]) == {"check", "timing"}
