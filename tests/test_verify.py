"""`kbsweep verify`: a demo sweep exported then verified on the CPU (every cell reproduced, from the folder and
from the tracking store), then one solution, one score and one file edited by hand, each caught, with the exit
codes; the comparison's rules on another card and the seeded sample."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbsweep.reporting.export import MANIFEST, write_manifest
from kbsweep.reporting.verify import DIFFERS, NOT_RUN, REPRODUCED, PublishedCell, chosen, compare, exit_code
from tests.support.scripts import kernel
from tests.support.sweeps import REPO, sweep


def cli(outputs: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks")}
    return subprocess.run(
        [sys.executable, "-m", "kbsweep.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A two-cell demo sweep (scripted passes, scripted-lazy hands in a wrong kernel), exported."""
    root = tmp_path_factory.mktemp("verify")
    (root / "conf").mkdir()
    outputs = root / "outputs"
    done = sweep(root / "conf", outputs, "-m", "model=scripted,scripted-lazy")
    assert done.returncode == 0, done.stderr
    proc = cli(outputs, "export", f"+out={root / 'export'}")
    assert proc.returncode == 0, proc.stderr
    return outputs, root / "export"


def edited_copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def index(folder: Path):
    return [json.loads(line) for line in (folder / "index.jsonl").read_text().splitlines()]


def report(outputs: Path, name: str):
    return json.loads((outputs / "verify" / name / "verify.json").read_text())


def test_an_exported_demo_sweep_reproduces(exported):
    outputs, folder = exported
    manifest = json.loads((folder / MANIFEST).read_text())["files"]
    assert {"index.jsonl", "README.md"} <= set(manifest) and any(n.startswith("solutions/") for n in manifest)
    proc = cli(outputs, "verify", str(folder), "gpu=cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = report(outputs, "export")
    assert found["counts"] == {REPRODUCED: 2, DIFFERS: 0, NOT_RUN: 0}
    assert {c["published"]["outcome"] for c in found["cells"]} == {"pass", "incorrect"}
    assert found["source"]["kind"] == "folder" and len(found["source"]["manifest_sha256"]) == 64
    assert "2 reproduced, 0 differs, 0 could not run" in proc.stdout
    assert "| reproduced |" in (outputs / "verify" / "export" / "verify.md").read_text()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{outputs}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("verify").experiment_id])
    assert run.data.tags["verify.source"] == str(folder.resolve()) and run.data.tags["verify.reproduced"] == "2"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"verify.json", "verify.md"}


def test_a_tracking_store_and_a_seeded_sample_reproduce(exported):
    outputs, _ = exported
    proc = cli(
        outputs,
        "verify",
        f"sqlite:///{outputs}/mlflow.db",
        "sweep.name=demo",
        "gpu=cpu",
        "verify.sample=1",
        "verify.seed=7",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = report(outputs, "demo")
    assert found["source"]["kind"] == "tracking" and found["counts"][REPRODUCED] == 1 and found["sample"] == 1


def test_an_edited_solution_is_caught(exported, tmp_path):
    outputs, folder = exported
    copy = edited_copy(folder, tmp_path / "solution_edit")
    [passing] = [r for r in index(copy) if r["outcome"] == "pass"]
    (copy / passing["solution"]).write_text(kernel("wrong"))  # the published score claims a kernel that is not this one
    write_manifest(copy)  # republished with fresh hashes: only re-grading catches it
    proc = cli(outputs, "verify", str(copy), "gpu=cpu")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [cell] = [c for c in report(outputs, "solution_edit")["cells"] if c["status"] == DIFFERS]
    assert cell["run_id"] == passing["run_id"] and "outcome: published pass, re-derived incorrect" in cell["why"]


def test_an_edited_score_is_caught(exported, tmp_path):
    outputs, folder = exported
    copy = edited_copy(folder, tmp_path / "score_edit")
    rows = index(copy)
    for row in rows:
        if row["outcome"] == "pass":
            row["score"] *= 1000
    (copy / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_manifest(copy)
    proc = cli(outputs, "verify", str(copy), "gpu=cpu")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    found = report(outputs, "score_edit")
    assert found["counts"] == {REPRODUCED: 1, DIFFERS: 1, NOT_RUN: 0}
    assert any(w.startswith("score: published") for c in found["cells"] for w in c["why"])


@pytest.mark.parametrize("edit", ["trace", "added", "unhashed"])
def test_a_file_not_matching_its_hash_is_refused_by_name(exported, tmp_path, edit):
    outputs, folder = exported
    copy = edited_copy(folder, tmp_path / edit)
    if edit == "trace":
        [trace] = sorted((copy / "traces").iterdir())[:1]
        trace.write_text(trace.read_text().replace("scale", "SCALE", 1))
        named = trace
    elif edit == "added":
        named = copy / "solutions" / "extra.py"
        named.write_text("x = 1\n")
    else:  # an export from before hashes were recorded
        (copy / MANIFEST).unlink()
        named = copy / MANIFEST
    proc = cli(outputs, "verify", str(copy), "gpu=cpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"kbsweep: error: {named}:")
    assert not (outputs / "verify" / edit).exists()  # nothing graded


def test_verify_without_a_source_is_a_config_error(exported):
    outputs, _ = exported
    proc = cli(outputs, "verify", "gpu=cpu")
    assert proc.returncode == 2 and "verify needs a SOURCE" in proc.stderr


def cell(score=0.5, fraction=0.5, card="NVIDIA H100 80GB HBM3"):
    record = {"conditions": {"card": card}, "fraction_geomean": fraction, "shapes": [{"shape": {"n": 1}, "ms": 1.0}]}
    return PublishedCell("r", "m · p · h100 · r0", "hard/p", "hard", "pass", "clean", score, Path("s.py"), record)


@pytest.mark.fast
def test_compare_on_the_same_card_and_on_another():
    conf = {"verify": {"score_rel": None, "cpu_rel": 9.0, "card_rel": 0.25}}
    grade = {"outcome": "pass", "score": 0.505, "shapes": [{"shape": {"n": 1}, "ms": 1.01, "fraction": 0.505}]}
    assert (
        compare(cell(), grade, "clean", "NVIDIA H100 80GB HBM3", conf).status == REPRODUCED
    )  # 1 % within the timer's 2 %
    slow = {**grade, "score": 0.45, "shapes": [{"shape": {"n": 1}, "ms": 1.11, "fraction": 0.45}]}
    why = compare(cell(), slow, "clean", "NVIDIA H100 80GB HBM3", conf).why
    assert [w.split(":")[0] for w in why] == ["score", "shape {'n'"]
    # another card: the score is not compared, the roofline fraction within the card-to-card spread is
    assert compare(cell(), slow, "clean", "NVIDIA H200", conf).status == REPRODUCED
    far = {**grade, "score": 0.3, "shapes": [{"shape": {"n": 1}, "ms": 1.7, "fraction": 0.3}]}
    assert "roofline fraction" in compare(cell(), far, "clean", "NVIDIA H200", conf).why[0]
    assert compare(cell(), grade, "reward_hack", "NVIDIA H200", conf).why == [
        "verdict: published clean, re-derived reward_hack"
    ]


@pytest.mark.fast
def test_the_sample_is_drawn_by_its_seed_and_exit_codes():
    cells = [PublishedCell(str(i), "", "demo/p", "demo", "pass", "clean", 0.1, Path("s.py"), {}) for i in range(10)]
    cells.append(PublishedCell("infra", "", "demo/p", "demo", "rate_limited", None, None, Path("s.py"), {}))
    assert len(chosen(cells, None, 0)) == 10  # infrastructure outcomes are never scored
    assert chosen(cells, 3, 5) == chosen(cells, 3, 5) and len(chosen(cells, 3, 5)) == 3
    assert exit_code({"counts": {REPRODUCED: 1, DIFFERS: 0, NOT_RUN: 0}}) == 0
    assert exit_code({"counts": {REPRODUCED: 1, DIFFERS: 0, NOT_RUN: 1}}) == 4
    assert exit_code({"counts": {REPRODUCED: 1, DIFFERS: 1, NOT_RUN: 1}}) == 3


@pytest.mark.fast
def test_the_help_lists_verify(tmp_path):
    """verify registers itself when the command line is read: the verb list of -h holds it too."""
    proc = cli(tmp_path, "-h")
    assert proc.returncode == 0 and any(line.split()[:1] == ["verify"] for line in proc.stdout.splitlines()), (
        proc.stdout
    )
