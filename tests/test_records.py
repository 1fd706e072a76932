"""The typed records at the seams read what earlier versions stored and write it back key for key: a cell's
result.json journal (:class:`CellResult`), a grade's per-shape scores (:class:`ShapeScore`), an audit's findings
(:class:`Finding`); and a GPU YAML loaded outside a composed config (:func:`load_gpu`) is checked as a composed one is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbsweep.audit import audit
from kbsweep.audit.kinds import Finding
from kbsweep.config.schema import load_gpu
from kbsweep.errors import KbsweepError
from kbsweep.outcomes import Outcome
from kbsweep.score.roofline import ShapeScore
from kbsweep.tracking.cell_result import CellResult

pytestmark = pytest.mark.fast

STORED = Path(__file__).parent / "support/stored_cells"
AUDITS = Path(__file__).parent / "support/stored_audits"


def test_a_stored_journal_round_trips_key_for_key():
    stored = json.loads((STORED / "demo_pass_2026-12-04.json").read_text())
    result = CellResult.from_json(stored)
    assert result.outcome is Outcome.PASS and result.stop_reason == stored["stop_reason"]
    assert [shape.fraction for shape in result.shapes] == [shape["fraction"] for shape in stored["shapes"]]
    assert json.dumps(result.to_json()) == json.dumps(stored)  # the same keys, in the same order


def test_a_harness_error_and_a_launchers_infra_result_keep_their_few_keys():
    """Neither ran an agent: no scores, no spend; the launcher's has no start nor folder."""
    harness = {
        "outcome": "harness_error",
        "message": "KeyError: 'x'",
        "key": "k",
        "cell": "m · t/p · cpu · r0",
        "started": 1.0,
        "finished": 2.0,
        "folder": "/o/sweeps/s/k",
    }
    infra = {
        "outcome": "node_failure",
        "message": "job 7 failed",
        "key": "k",
        "cell": "m · t/p · cpu · r0",
        "finished": 3.0,
    }
    for stored in (harness, infra):
        result = CellResult.from_json(stored)
        assert result.outcome.is_infra and json.dumps(result.to_json()) == json.dumps(stored)


def test_a_kernelbench_journal_keeps_its_verdicts_and_unknown_keys():
    journal = list(json.loads((STORED / "demo_pass_2026-12-04.json").read_text()).items())
    stamps = [i for i, (key, _) in enumerate(journal) if key == "key"][
        0
    ]  # the verdicts stand between env and the stamps
    stored = dict(
        journal[:stamps]
        + [("verdicts", {"kernelbench": "correct", "kbsweep": "pass"}), ("kernelbench", {"correctness": True})]
        + journal[stamps:]
        + [("written_by_a_newer_version", 1)]
    )
    result = CellResult.from_json(stored)
    assert result.verdicts["kernelbench"] == "correct" and result.extra == {"written_by_a_newer_version": 1}
    assert json.dumps(result.to_json()) == json.dumps(stored)


def test_shape_scores_of_a_collective_and_of_a_baseline_outside_tolerance():
    base = json.loads((STORED / "demo_pass_2026-12-04.json").read_text())["shapes"][0]
    for stored in (
        {**base, "baselines_outside_tolerance": ["compile"]},
        {**base, "busbw_gbps": None, "comm_fraction": None},
    ):
        assert json.dumps(ShapeScore.from_json(stored).to_json()) == json.dumps(stored)
    assert ShapeScore.from_json(base).collective is False


@pytest.mark.parametrize(
    "text, named",
    [
        ("name: x\ndescription: d\nroofline: r\ndevice: tpu\n", "key 'device'"),
        ("name: x\ndescription: d\nroofline: r\ngpus_per_node: many\n", "key 'gpus_per_node'"),
        ("name: x\nroofline: r\n", "key 'description'"),
        ("name: [x\n", "broken YAML"),
    ],
)
def test_a_bad_gpu_yaml_is_one_line_naming_the_file_and_key(tmp_path, text, named):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "bad.yaml").write_text(text)
    with pytest.raises(KbsweepError) as error:
        load_gpu("bad", tmp_path)
    line = str(error.value)
    assert "\n" not in line and str(tmp_path / "gpu" / "bad") in line and named in line


def test_the_repositorys_gpus_load():
    cpu, h200 = load_gpu("cpu"), load_gpu("h200")
    assert not cpu.cuda and cpu.shape_set == "smoke_shapes" and h200.cuda and h200.shape_set == "shapes"


def test_an_audit_writes_what_the_dict_findings_wrote_and_its_findings_round_trip():
    """static_dynamic_2026-12-04.json: an audit of a cached, exec'ing, forbidden-op solution with a helper file and
    two grader findings (one of a kind the table lacks), as the audit wrote it when findings were dicts."""
    stored = json.loads((AUDITS / "static_dynamic_2026-12-04.json").read_text())
    given = stored["inputs"]
    again = audit(given["source"], given["forbidden"], given["grade"], helpers=given["helpers"])
    assert json.dumps(again) == json.dumps(stored["audit"])
    for entry in stored["audit"]["findings"]:
        assert json.dumps(Finding.from_json(entry).to_json()) == json.dumps(entry)
