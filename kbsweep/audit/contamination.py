"""Contamination tripwire and sandbox evidence (docs/sandbox.md).

:func:`findings` reads a cell's transcript (its ``transcript.jsonl`` inside ``outputs/sweeps/<sweep>/<key>/``, or
its events) and its solution files, and raises:

* ``contaminated`` (verdict contaminated): the agent's turns, its tool calls and results, or the files name
  another run of the same outputs folder: a cell key (``sweeps/*/<key>``), an MLflow run id (its sqlite store or
  artifact folders), a path under the outputs folder outside this cell's, or another cell's score as
  ``result.json``, MLflow and the reports keep it (full precision: short numbers would match by chance).
* ``sandbox_attempt`` (evidence, no verdict of its own): a shell command or file path that reaches past the
  sandbox (parent folders, another process's /proc, the environment, outputs/ or the tracking store, the network),
  or a result showing the sandbox stopped it (paths outside the workspace, refused hosts, the process, memory or
  disk limit). The sandbox blocked it; the finding records that it was tried.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

from kbsweep.agent.tools import GRADING_TOOLS  # results carry this cell's own numbers
from kbsweep.audit.kinds import Finding, finding
from kbsweep.audit.transcript import load

log = logging.getLogger(__name__)
LAYER = "contamination"
HEX = "0-9a-fA-F"
RUN_ID = re.compile(rf"(?<![{HEX}])[0-9a-f]{{32}}(?![{HEX}])")  # how MLflow spells a run id, as a word
HEX_WORD = re.compile(rf"[{HEX}]+")  # a cell key or run id as a word: a whole run of hex digits
NUMBER = re.compile(r"(?<![\d.])[-\d]")  # where a number may start
DIGIT = re.compile(r"\d")
ID_QUERY = 200  # run ids per MLflow search
REACH = re.compile(
    r"\.\./"  # a parent folder
    r"|/proc/(?!self/|thread-self/)[^/\s]+/(environ|cmdline|root|cwd|fd|maps|mem)\b|\benviron\b"  # other processes, the env
    r"|(^|[\s'\"/])(outputs|sweeps|mlruns|mlartifacts)(/|\b)|mlflow\.db"  # other runs, the tracking store
    r"|https?://|\b(curl|wget|nc|ncat|socat|ssh|scp|telnet)\s|/dev/(tcp|udp)/|\bsocket\.(socket|create_connection)"  # network
)
STOPPED = re.compile(
    r"outside the workspace|\[sandbox\] (refused|stopped: its processes|stopped: the writable)"
    r"|fork: retry: Resource temporarily unavailable|BlockingIOError|File size limit exceeded|No space left on device"
)
SHOWN = {  # what each tool call reaches for: the built-in loop's tools, then the CLI harnesses' (docs/harnesses.md)
    "run_shell": "command",
    "read_file": "path",
    "write_file": "path",
    "Bash": "command",
    "Read": "file_path",
    "Write": "file_path",
    "Edit": "file_path",  # Claude Code
    "exec_command": "cmd",  # Codex
}


def cell_of(transcript: Union[str, Path, List[Dict[str, Any]], None]) -> Optional[Tuple[Path, Path]]:
    """(outputs folder, cell folder) of a transcript path laid out as ``<outputs>/sweeps/<sweep>/<key>/...``."""
    if not isinstance(transcript, (str, Path)):
        return None
    cell = Path(transcript).resolve().parent
    return (cell.parents[2], cell) if cell.parent.parent.name == "sweeps" else None


def runs_named(outputs: Path, tokens: Set[str]) -> Set[str]:
    """Which of ``tokens`` (32-hex words of the cell's texts) are MLflow runs a cell could have come across: runs of
    the sweep's tracking store, looked up by id through the MLflow client so a server's runs count as a sqlite
    store's do (``MLFLOW_TRACKING_URI``, which the orchestrator sets and its cells inherit; else the outputs
    folder's ``mlflow.db``), and run folders of local artifact stores. One query by id, not a listing of the store:
    a listing costs every cell a read of every run before it."""
    if not tokens:
        return set()
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from kbsweep.tracking.mlflow_store import page_runs

    found = {p.name for root in ("mlartifacts", "mlruns") for p in (outputs / root).glob("*/*") if p.name in tokens}
    db = outputs / "mlflow.db"
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (f"sqlite:///{db}" if db.exists() else None)
    if uri:
        client = MlflowClient(tracking_uri=uri)
        ordered = sorted(tokens)  # hex words only (RUN_ID): safe inside the filter's quotes
        try:
            experiments = [e.experiment_id for e in client.search_experiments()]
            for i in range(0, len(ordered) if experiments else 0, ID_QUERY):
                ids = ", ".join(f"'{t}'" for t in ordered[i : i + ID_QUERY])
                found.update(run.info.run_id for run in page_runs(client, experiments, f"attributes.run_id IN ({ids})"))
        except (
            MlflowException
        ) as exc:  # an unreachable store must not fail the cell's audit; the other sources still count
            log.warning("contamination: runs of %s not read (%s)", uri, str(exc).splitlines()[0])
    return found


def score_text(result: Path) -> Optional[str]:
    """Another cell's score as its result.json has it, when it has 6 significant digits or more."""
    try:
        score = json.loads(result.read_text()).get("score")
    except (OSError, ValueError, AttributeError):
        return None
    text = repr(score) if isinstance(score, float) else ""
    return text if len(re.sub(r"e.*|[^0-9]", "", text).lstrip("0")) >= 6 else None


class Tripwire:
    """What names another run than ``cell``: its paths under the outputs folder, every other cell's key and score,
    and of MLflow's runs, those among ``run_tokens``. A text is searched once for its words and numbers, each
    looked up in these sets: one alternation of every name was compiled and tried at every character, ~1 s of CPU
    a cell beside 100 other cells and ~28 s beside 3 000 (docs/benchmarks.md)."""

    def __init__(self, outputs: Path, cell: Path, run_tokens: Set[str]):
        self.names: Dict[str, str] = {}
        self.scores: Dict[str, str] = {}
        for other in (outputs / "sweeps").glob("*/*"):
            if other.is_dir() and other != cell:
                self.names[other.name] = f"cell {other.parent.name}/{other.name}"
                score = score_text(other / "result.json")
                if score:
                    self.scores[score] = f"score of cell {other.parent.name}/{other.name}"
        self.names.update((run, f"MLflow run {run}") for run in runs_named(outputs, run_tokens))
        own = re.escape(str(cell.relative_to(outputs)))
        odd = [
            rf"(?<![{HEX}]){re.escape(name)}(?![{HEX}])" for name in self.names if not HEX_WORD.fullmatch(name)
        ]  # not a cell's key
        self.pattern = re.compile("|".join([rf"{re.escape(str(outputs))}(?!/{own}(?:/|\b))", *odd]))
        self.lengths = sorted({len(score) for score in self.scores})

    def hits(self, text: str, scored: bool) -> Iterator[Tuple[str, str]]:
        """(what matched, what it names) for each place ``text`` names another run; scores only where ``scored``."""
        for hit in self.pattern.finditer(text):
            yield hit.group(0), self.names.get(hit.group(0), "a path under the outputs folder outside this cell")
        for word in HEX_WORD.finditer(text):
            if word.group(0) in self.names:
                yield word.group(0), self.names[word.group(0)]
        for start in NUMBER.finditer(text) if scored and self.scores else ():  # a score as a number of its own
            i = start.start()
            for length in self.lengths:
                score = text[i : i + length]
                if score in self.scores and not DIGIT.match(text, i + length):
                    yield score, self.scores[score]


def texts(events: List[Dict[str, Any]]) -> Iterator[Tuple[str, str, bool]]:
    """(where, text, may quote scores) of every agent turn and tool use."""
    for i, event in enumerate(events):
        if event.get("type") == "assistant":
            calls = json.dumps(event.get("tool_calls") or [], default=str)
            yield (
                f"event {i} (assistant)",
                f"{event.get('content') or ''}\n{event.get('reasoning') or ''}\n{calls}",
                True,
            )
        elif event.get("type") == "tool":
            name = event.get("name", "")
            yield (
                f"event {i} ({name})",
                f"{event.get('arguments') or ''}\n{event.get('content') or ''}",
                name not in GRADING_TOOLS,
            )


def contamination(events: List[Dict[str, Any]], files: Mapping[str, str], outputs: Path, cell: Path) -> List[Finding]:
    sources = [*texts(events), *((name, text, True) for name, text in files.items())]
    tripwire = Tripwire(outputs, cell, {t for _, text, _ in sources for t in RUN_ID.findall(text)})
    out = []
    for where, text, scored in sources:
        for matched, named in dict(tripwire.hits(text, scored)).items():
            out.append(finding("contaminated", LAYER, f"{where} names {named}: {matched[:120]}"))
    return out


def attempts(events: List[Dict[str, Any]]) -> List[Finding]:
    """The tool calls that reached past the sandbox or that it stopped."""
    out = []
    for event in events:
        if event.get("type") != "tool":
            continue
        name, result = event.get("name", ""), str(event.get("content") or "")
        try:
            arguments = json.loads(event.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = {}
        target = str(arguments.get(SHOWN.get(name, ""), "")) if isinstance(arguments, dict) else ""
        stopped = STOPPED.search(result)
        if REACH.search(target) or stopped:
            detail = f"{name} {target[:160]!r}" + (f": {stopped.group(0)}" if stopped else "")
            out.append(finding("sandbox_attempt", LAYER, detail))
    return out


def findings(transcript: Union[str, Path, List[Dict[str, Any]], None], files: Mapping[str, str]) -> List[Finding]:
    """``contaminated`` and ``sandbox_attempt`` findings of one cell (see the module's docstring); ``files``: the
    solution's files, name -> source. Other runs are known only from a transcript path inside an outputs folder."""
    events = load(transcript)
    located = cell_of(transcript)
    return (contamination(events, files, *located) if located else []) + attempts(events)
