"""``kbsweep verify SOURCE``: a published board re-derived with this checkout's grader, audit and sandbox.

SOURCE is an export folder (``kbsweep export``), a Hugging Face dataset folder or repo id of one (its index read
with ``datasets``), or a tracking URI (the sweep: ``sweep.name``), exported first into the outputs folder. The
folder's files must match its ``MANIFEST.json``; each scored cell's published solution (or a seeded sample of
them: ``verify.sample``, ``verify.seed``) is graded again under the composed GPU and track
(:func:`kbsweep.launch.regrade.grade_file`) and audited again (static and dynamic layers), and compared with what
was published: outcome, verdict and score within the timer's error (:func:`compare`). Trusted, not re-derived:
transcripts, tokens, dollars, the LLM judge's and contamination layers, human overrides (docs/launch.md).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from kbsweep.errors import ExitCode, KbsweepError
from kbsweep.outcomes import Outcome
from kbsweep.reporting.export import MANIFEST, export_dataset, sha256  # export's heavy imports are inside its functions

SOURCE: List[str] = []  # `kbsweep verify SOURCE ...`: taken out of argv before Hydra sees it
GPU_SCORE_REL = 0.02  # docs/grading.md: regrades of a shape spread up to 2 % on the same card
REPRODUCED, DIFFERS, NOT_RUN = "reproduced", "differs", "could not run"
KIND = "verify"


@dataclass(frozen=True)
class PublishedCell:
    """One exported cell run: its labels, what was published, its solution file and its recorded conditions."""

    run_id: str
    label: str
    problem: str
    track: str
    outcome: Optional[str]
    verdict: Optional[str]
    score: Optional[float]
    solution: Optional[Path]
    record: Dict[str, Any]


@dataclass(frozen=True)
class VerifySource:
    """A checked source: where it came from, its folder, its manifest's own hash, its cells."""

    kind: str  # folder | huggingface | tracking
    location: str
    folder: Path
    manifest_sha256: str
    cells: List[PublishedCell]


@dataclass
class CellCheck:
    """One cell's verification: reproduced, differs or could not run, with the reasons and both sides' figures."""

    run_id: str
    label: str
    status: str
    why: List[str] = field(default_factory=list)
    published: Dict[str, Any] = field(default_factory=dict)
    rederived: Dict[str, Any] = field(default_factory=dict)


def take_source(verb: str, argv: List[str], verbs: Dict[str, Any]) -> List[str]:
    """Register the ``verify`` verb in the command line's ``verbs``; for ``verify``, take SOURCE (the first argument
    that is neither an option nor an override) out of ``argv`` into SOURCE. Returns the (Hydra) arguments left."""
    verbs["verify"] = verify_verb
    if verb != "verify":
        return argv
    for i, arg in enumerate(argv):
        if not arg.startswith("-") and "=" not in arg:
            SOURCE[:] = [arg]
            return argv[:i] + argv[i + 1 :]
    return argv


def check_manifest(folder: Path) -> str:
    """The SHA-256 of ``folder/MANIFEST.json``, once every file it names matches and no other file is there;
    else a KbsweepError naming the file."""
    path = folder / MANIFEST
    if not path.is_file():
        raise KbsweepError(
            f"{path}: missing: the export records no hashes, so its files cannot be checked (export it again)"
        )
    try:
        recorded = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise KbsweepError(f"{path}: not a kbsweep manifest ({exc})") from None
    for name, digest in sorted(recorded.items()):
        if not (folder / name).is_file():
            raise KbsweepError(f"{folder / name}: missing (recorded in {MANIFEST})")
        if sha256(folder / name) != digest:
            raise KbsweepError(
                f"{folder / name}: does not match its recorded SHA-256 in {MANIFEST} (edited since export)"
            )
    for extra in sorted(folder.rglob("*")):
        name = extra.relative_to(folder).as_posix()
        if extra.is_file() and name != MANIFEST and not name.startswith(".") and name not in recorded:
            raise KbsweepError(f"{extra}: not recorded in {MANIFEST} (added since export)")
    return sha256(path)


def read_index(folder: Path) -> List[Dict[str, Any]]:
    """The index rows, read with ``datasets`` (the card's ``index`` config) where it is installed, else as JSON lines."""
    try:
        import datasets
    except ImportError:
        return [json.loads(line) for line in (folder / "index.jsonl").read_text().splitlines() if line.strip()]
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as cache:
        rows = datasets.load_dataset(str(folder), "index", cache_dir=cache)["train"]
        return [dict(r) for r in rows]


def open_source(source: str, conf: Dict[str, Any]) -> VerifySource:
    """The source as a checked folder and its cells; a tracking URI is exported first (``outputs/verify/<sweep>/source``)."""
    if "://" in source:
        kind, location = "tracking", f"{source} (sweep {conf['sweep']['name']})"
        folder = Path(conf["paths"]["outputs"]) / "verify" / str(conf["sweep"]["name"]) / "source"
        if not export_dataset(source, folder, [conf["sweep"]["name"]])["runs"]:
            raise KbsweepError(f"sweep.name={conf['sweep']['name']}: no finished cell in {source}")
    elif Path(source).is_dir():
        kind, location, folder = "folder", str(Path(source).resolve()), Path(source)
        if not (folder / "index.jsonl").is_file():
            raise KbsweepError(f"{folder / 'index.jsonl'}: missing: {source} is not an export folder")
    elif source.count("/") == 1 and not Path(source).exists():
        kind, location, folder = "huggingface", source, hub_folder(source)
    else:
        raise KbsweepError(f"{source}: neither an export folder, a Hugging Face dataset id nor a tracking URI")
    digest = check_manifest(folder)
    cells = []
    for row in read_index(folder):
        record = json.loads((folder / row["record"]).read_text()) if row.get("record") else {}
        label = f"{row.get('model')} · {row.get('problem')} · {row.get('gpu')} · r{row.get('repeat')}"
        cells.append(
            PublishedCell(
                str(row["run_id"]),
                label,
                str(row.get("problem")),
                str(row.get("track")),
                row.get("outcome"),
                row.get("verdict"),
                row.get("score"),
                folder / row["solution"] if row.get("solution") else None,
                record,
            )
        )
    return VerifySource(kind, location, folder, digest, cells)


def hub_folder(repo_id: str) -> Path:
    """A Hugging Face dataset repo's files, downloaded by ``huggingface_hub`` (needs the network)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise KbsweepError(f"{repo_id}: a Hub dataset id needs the huggingface_hub package") from None
    return Path(snapshot_download(repo_id, repo_type="dataset"))


def chosen(cells: List[PublishedCell], sample: Optional[int], seed: int) -> List[PublishedCell]:
    """The scored cells (a published solution, an outcome not of the infrastructure), or ``sample`` of them drawn
    with ``seed``, in the index's order."""
    scored = [c for c in cells if c.solution is not None and c.outcome and not Outcome(c.outcome).is_infra]
    if sample is None or sample >= len(scored):
        return scored
    picked = set(random.Random(seed).sample(range(len(scored)), int(sample)))
    return [c for i, c in enumerate(scored) if i in picked]


def here_versions() -> Dict[str, Any]:
    """This checkout's timer and software versions, as a cell record names them."""
    import torch

    from kbsweep.grader.baselines import TIMER_VERSION

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"timer_version": TIMER_VERSION, "torch": torch.__version__, "triton": triton_version}


def version_differences(cells: List[PublishedCell], conf: Dict[str, Any]) -> List[str]:
    """One line per recorded condition that differs from this checkout's (timer, torch, Triton, deck, GPU config)."""
    from kbsweep.launch.regrade import load_track_problem

    here = here_versions()
    lines, decks = set(), {}
    for cell in cells:
        cond = cell.record.get("conditions") or {}
        for key, value in here.items():
            if cond.get(key) is not None and str(cond[key]) != str(value):
                lines.add(f"{key}: published {cond[key]}, this checkout {value}")
        if cell.record.get("gpu") and cell.record["gpu"] != conf["gpu"]["name"]:
            lines.add(f"gpu config: published {cell.record['gpu']}, this verify gpu={conf['gpu']['name']}")
        if cell.track == conf["track"]["name"] and cell.problem not in decks:
            try:
                decks[cell.problem] = load_track_problem(conf, cell.problem).deck_hash()
            except KbsweepError:
                decks[cell.problem] = None
        if decks.get(cell.problem) and cond.get("deck_version") and cond["deck_version"] != decks[cell.problem]:
            lines.add(f"{cell.problem} deck: published {cond['deck_version']}, this checkout {decks[cell.problem]}")
    return sorted(lines)


def ratio_off(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """How far apart two positive figures are: max(a/b, b/a) - 1 (None where either is missing or not positive)."""
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return max(a / b, b / a) - 1


def compare(
    cell: PublishedCell, grade: Dict[str, Any], verdict: Optional[str], card: str, conf: Dict[str, Any]
) -> CellCheck:
    """The cell against its re-derivation. The same card model: outcome, verdict, the score and each shape's time
    within the timer's error (``verify.score_rel``; null: 2 % on GPUs, ``verify.cpu_rel`` on CPUs, whose timings
    are plumbing); another card: outcome, verdict and the roofline fraction within ``verify.card_rel``."""
    settings = conf.get("verify") or {}
    published_card = (cell.record.get("conditions") or {}).get("card")
    same_card = published_card in (None, card)
    rel = settings.get("score_rel") or (float(settings.get("cpu_rel", 9.0)) if card == "cpu" else GPU_SCORE_REL)
    score = grade.get("score") if grade.get("outcome") == Outcome.PASS.value else None
    check = CellCheck(
        cell.run_id,
        cell.label,
        REPRODUCED,
        published={
            "outcome": cell.outcome,
            "verdict": cell.verdict,
            "score": cell.score,
            "card": published_card,
            "fraction_geomean": cell.record.get("fraction_geomean"),
        },
        rederived={
            "outcome": grade.get("outcome"),
            "verdict": verdict,
            "score": score,
            "card": card,
            "fraction_geomean": fraction_geomean(grade),
        },
    )
    if grade.get("outcome") != cell.outcome:
        check.why.append(f"outcome: published {cell.outcome}, re-derived {grade.get('outcome')}")
    if cell.verdict is not None and verdict != cell.verdict:
        check.why.append(f"verdict: published {cell.verdict}, re-derived {verdict}")
    recorded = [s.get("shape") for s in cell.record.get("shapes") or []]
    graded = [s.get("shape") for s in grade.get("shapes") or []]
    if recorded and graded and recorded != graded:
        check.why.append(f"shapes: published {recorded}, graded {graded}")
    if cell.outcome == Outcome.PASS.value and score is not None:
        if same_card:
            off = ratio_off(cell.score, score)
            if off is None or off > rel:
                check.why.append(f"score: published {cell.score}, re-derived {score:.6g} (allowed ±{rel:.0%})")
            for old, new in zip(cell.record.get("shapes") or [], grade.get("shapes") or []):
                off = ratio_off(old.get("ms"), new.get("ms"))
                if off is not None and off > rel:
                    check.why.append(
                        f"shape {old.get('shape')}: published {old['ms']:.6g} ms, re-derived {new['ms']:.6g} ms (allowed ±{rel:.0%})"
                    )
        else:
            card_rel = float(settings.get("card_rel", 0.25))
            off = ratio_off(check.published["fraction_geomean"], check.rederived["fraction_geomean"])
            if off is not None and off > card_rel:
                check.why.append(
                    f"roofline fraction on {published_card} vs {card}: {check.published['fraction_geomean']:.4g} vs "
                    f"{check.rederived['fraction_geomean']:.4g} (allowed card-to-card ±{card_rel:.0%})"
                )
    if check.why:
        check.status = DIFFERS
    return check


def fraction_geomean(grade: Dict[str, Any]) -> Optional[float]:
    from kbsweep.score.roofline import geomean

    fractions = [s.get("fraction") for s in grade.get("shapes") or []]
    return geomean(fractions) if fractions and None not in fractions else None


def verify_cell(cell: PublishedCell, conf: Dict[str, Any], work: Path, gpu, roofline) -> CellCheck:
    """Grade and audit one cell's published solution again and compare; a cell this checkout cannot grade under
    its recorded conditions is ``could not run``, with why."""
    from kbsweep import audit as audit_stage
    from kbsweep.grader.baselines import card
    from kbsweep.launch.regrade import grade_file, load_track_problem

    if cell.track != conf["track"]["name"]:
        return CellCheck(cell.run_id, cell.label, NOT_RUN, [f"track {cell.track}: verify with track={cell.track}"])
    try:
        problem = load_track_problem(conf, cell.problem)
    except KbsweepError as exc:
        return CellCheck(cell.run_id, cell.label, NOT_RUN, [f"problem {cell.problem} not in this checkout: {exc}"])
    deck = (cell.record.get("conditions") or {}).get("deck_version")
    if deck and deck != problem.deck_hash():
        return CellCheck(
            cell.run_id, cell.label, NOT_RUN, [f"deck version {deck}, this checkout's {problem.deck_hash()}"]
        )
    folder = work / cell.run_id
    folder.mkdir(parents=True, exist_ok=True)
    solution = folder / "solution.py"
    assert cell.solution is not None  # chosen() keeps the cells with a published solution
    solution.write_text(cell.solution.read_text())
    grade = grade_file(conf, cell.problem, solution, folder, gpu, roofline)
    if Outcome(grade["outcome"]).is_infra:
        return CellCheck(
            cell.run_id,
            cell.label,
            NOT_RUN,
            [f"the grade ended in {grade['outcome']}: {grade.get('message') or ''}".strip()],
        )
    audited = audit_stage.audit(solution.read_text(), problem.spec.forbidden, grade, problem=problem)
    (folder / "audit.json").write_text(json.dumps(audited, indent=1, default=str))
    return compare(cell, grade, audited["verdict"], card(grade.get("env") or {}), conf)


def table(checks: List[CellCheck]) -> str:
    """The checks as a Markdown table."""
    lines = [
        "| cell | status | published: outcome verdict score | re-derived: outcome verdict score | why |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        p, r = c.published, c.rederived
        lines.append(
            f"| {c.label} | {c.status} | {p.get('outcome', '')} {p.get('verdict', '')} {fmt(p.get('score'))} | "
            f"{r.get('outcome', '')} {r.get('verdict', '')} {fmt(r.get('score'))} | {'; '.join(c.why)} |"
        )
    return "\n".join(lines)


def fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def verify(source: str, conf: Dict[str, Any]) -> Dict[str, Any]:
    """Verify ``source`` under ``conf`` (a resolved config); writes verify.json and verify.md, logs an MLflow run."""
    from kbsweep.config.gpus import GpuSpec, require_card
    from kbsweep.grader.locks import exclusive
    from kbsweep.score.roofline import load_roofline

    gpu = GpuSpec(**conf["gpu"])
    require_card(gpu)
    settings = conf.get("verify") or {}
    opened = open_source(source, conf)
    cells = chosen(opened.cells, settings.get("sample"), int(settings.get("seed") or 0))
    differences = version_differences(cells, conf)
    print(
        f"[kbsweep] verify {opened.location}: {len(cells)} of {len(opened.cells)} cells, manifest sha256 {opened.manifest_sha256}",
        file=sys.stderr,
        flush=True,
    )
    for line in differences:
        print(f"[kbsweep] version difference: {line}", file=sys.stderr, flush=True)
    out = (
        Path(conf["paths"]["outputs"])
        / "verify"
        / (Path(opened.folder).resolve().name if opened.kind != "tracking" else str(conf["sweep"]["name"]))
    )
    roofline = load_roofline(conf["paths"]["roofline_specs"], gpu.roofline)
    checks = []
    with exclusive(f"regrade-{gpu.name}"):
        for cell in cells:
            checks.append(verify_cell(cell, conf, out / "grades", gpu, roofline))
            print(
                f"[kbsweep] {checks[-1].label}: {checks[-1].status} {'; '.join(checks[-1].why)}".rstrip(),
                file=sys.stderr,
                flush=True,
            )
    counts = {s: sum(c.status == s for c in checks) for s in (REPRODUCED, DIFFERS, NOT_RUN)}
    report = {
        "source": {"kind": opened.kind, "location": opened.location, "manifest_sha256": opened.manifest_sha256},
        "gpu": gpu.name,
        "versions": here_versions(),
        "version_differences": differences,
        "counts": counts,
        "sample": settings.get("sample"),
        "seed": settings.get("seed"),
        "cells": [asdict(c) for c in checks],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "verify.md").write_text(markdown(report, checks))
    report["run_id"] = log_run(conf, report, out)
    report["out"] = str(out)
    return report


def markdown(report: Dict[str, Any], checks: List[CellCheck]) -> str:
    source = report["source"]
    lines = [
        f"# kbsweep verify: {source['location']}",
        "",
        f"Source: {source['kind']}, MANIFEST.json sha256 `{source['manifest_sha256']}`; graded on `{report['gpu']}`.",
        "",
        ", ".join(f"{n} {s}" for s, n in report["counts"].items()),
        "",
    ]
    if report["version_differences"]:
        lines += ["Version differences:", *[f"- {d}" for d in report["version_differences"]], ""]
    return "\n".join([*lines, table(checks), ""])


def log_run(conf: Dict[str, Any], report: Dict[str, Any], out: Path) -> str:
    """The verification as a run of the ``verify`` experiment, tagged with its source and counts."""
    from kbsweep.tracking.mlflow_store import KIND_TAG
    from kbsweep.tracking.tracker import Tracker

    tracker = Tracker(conf["tracking"]["uri"], conf["tracking"]["artifact_root"], KIND, conf["tracking"]["trace_spans"])
    source = report["source"]
    tags = {
        KIND_TAG: KIND,
        "verify.source": source["location"],
        "verify.source_kind": source["kind"],
        "verify.manifest_sha256": source["manifest_sha256"],
        "gpu": report["gpu"],
        **{f"verify.{k.replace(' ', '_')}": str(v) for k, v in report["counts"].items()},
    }
    run = tracker.client.create_run(tracker.experiment_id, tags=tags, run_name=f"verify_{out.name}_{report['gpu']}")
    for name in ("verify.json", "verify.md"):
        tracker.client.log_artifact(run.info.run_id, str(out / name))
    tracker.client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def exit_code(report: Dict[str, Any]) -> int:
    """MODEL (3) when any cell differs, INFRA (4) when none differs but some could not run, else OK."""
    counts = report["counts"]
    return ExitCode.MODEL if counts[DIFFERS] else ExitCode.INFRA if counts[NOT_RUN] else ExitCode.OK


def verify_verb(cfgs: List[Any]) -> int:
    """Re-derive a published board: kbsweep verify EXPORT_FOLDER|HF_DATASET|TRACKING_URI gpu=... (docs/launch.md)."""
    from kbsweep.config.schema import as_dict

    if not SOURCE:
        raise KbsweepError(
            "verify needs a SOURCE: kbsweep verify EXPORT_FOLDER|HF_DATASET_ID|TRACKING_URI gpu=... [sweep.name=...]"
        )
    report = verify(SOURCE[0], as_dict(cfgs[0]))
    print(markdown(report, [CellCheck(**c) for c in report["cells"]]))
    print(f"[kbsweep] verify: {report['out']}/verify.json, verify.md; MLflow run {report['run_id']}", file=sys.stderr)
    return exit_code(report)
