"""The matrix: composed configs → cells (model × problem × gpu × repeat), each with a stable key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from kbsweep.agent.loop import Budgets
from kbsweep.config.gpus import GpuSpec
from kbsweep.config.problem_folders import find_problem_dirs, track_problem_names
from kbsweep.config.problems import load_problem
from kbsweep.errors import KbsweepError
from kbsweep.harness import runner_for
from kbsweep.planner import judging

VOLATILE_MODEL_KEYS = ("concurrency", "timeout_s", "retry", "api_base", "expected_tokens", "prices", "prompt_caching")
BUILTIN_HARNESS: Dict[str, str] = {"name": "builtin", "runner": "builtin"}


@dataclass
class Cell:
    """One unit of work: a model on a problem on a GPU, one repeat. Plain data, picklable."""

    sweep: str
    key: str
    model: Dict[str, Any]
    gpu: GpuSpec
    track: Dict[str, Any]
    problem: str  # <track>/<name>
    problem_dir: str
    deck_version: str
    repeat: int
    paths: Dict[str, Any]
    launcher: Dict[str, Any]
    grade: Dict[str, Any]
    judge: Optional[Dict[str, Any]] = None  # the LLM judge's resolved model config (kbsweep.planner.judging), or None
    harness: Dict[str, Any] = field(default_factory=lambda: dict(BUILTIN_HARNESS))  # who drives the model

    @property
    def label(self) -> str:
        """``model · problem · gpu · rN``; a harness other than the built-in loop shows as ``model@harness``."""
        who = (
            self.model["name"]
            if self.harness["name"] == BUILTIN_HARNESS["name"]
            else f"{self.model['name']}@{self.harness['name']}"
        )
        return f"{who} · {self.problem} · {self.gpu.name} · r{self.repeat}"


def cell_key(
    model: Dict, gpu: GpuSpec, track: Dict, problem: str, deck_version: str, repeat: int, harness: Optional[Dict] = None
) -> str:
    """Hash of what makes a result: the resolved config without volatile fields, the deck version, the repeat,
    the harness. The judge is not part of it: adding or changing ``audit.judge`` redoes no finished cell
    (``kbsweep audit`` re-audits those)."""
    stable = {
        "model": {k: v for k, v in model.items() if k not in VOLATILE_MODEL_KEYS},
        "gpu": gpu.name,
        "track": {k: v for k, v in track.items() if k != "problems"},
        "problem": problem,
        "deck_version": deck_version,
        "repeat": repeat,
    }
    if (
        harness and harness["name"] != BUILTIN_HARNESS["name"]
    ):  # the built-in loop's cells keep their keys from before harnesses
        stable["harness"] = {k: harness.get(k) for k in ("name", "version")}
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def selected_problems(cfg: DictConfig) -> List[str]:
    names = list(cfg.track.problems) or track_problem_names(
        list(cfg.paths.problems), cfg.track.problems_dir, cfg.track.format
    )
    wanted = cfg.problem
    if wanted is None:
        return names
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    wanted = [w.split("/", 1)[1] if "/" in w else w for w in wanted]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise KbsweepError(f"problem {', '.join(unknown)} is not in track '{cfg.track.name}' ({', '.join(names)})")
    return [n for n in names if n in wanted]


def cells_of(cfg: DictConfig, repeats: Optional[Sequence[int]] = None) -> List[Cell]:
    """The cells one composed config stands for, repeat by repeat, each repeat's problems in the track's order
    (``repeats``: those of the jobs that differ from ``cfg`` only in their repeat, :class:`kbsweep.config.jobs.Jobs`;
    None: cfg's own)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)  # a DictConfig's container is a dict
    Budgets.of_cell(
        container["model"], container["track"]
    )  # refuses budgets it could not enforce, before anything runs
    runner_for(container["harness"]).preflight(
        container["model"]
    )  # refuses a harness that is missing or cannot drive this model
    judge = judge_conf(cfg)
    cells = []
    names = selected_problems(cfg)
    folders = find_problem_dirs(
        list(cfg.paths.problems), cfg.track.problems_dir, names, cfg.track.format, cfg.track.kernelbench_version
    )
    gpu = GpuSpec(**container["gpu"])
    problems = [(folder, load_problem(folder, cfg.track.name)) for folder in folders]
    decks = [problem.deck_hash() for _, problem in problems]
    for repeat in [container["repeat"]] if repeats is None else repeats:
        for (folder, problem), deck in zip(problems, decks):
            key = cell_key(container["model"], gpu, container["track"], problem.id, deck, repeat, container["harness"])
            cells.append(
                Cell(
                    sweep=container["sweep"]["name"],
                    key=key,
                    model=container["model"],
                    gpu=gpu,
                    track=container["track"],
                    problem=problem.id,
                    problem_dir=str(folder),
                    deck_version=deck,
                    repeat=int(repeat),
                    paths=container["paths"],
                    launcher=container["launcher"],
                    grade=container["grade"],
                    judge=judge,
                    harness=container["harness"],
                )
            )
    return cells


def judge_conf(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The model YAML ``audit.judge`` names, validated like any model, or None (not named: :func:`build_matrix`
    picks the sweep's cheapest keyed model; or off): every cell runs it as its audit's third layer."""
    return judging.named(cfg)


def build_matrix(cfgs: Sequence[DictConfig]) -> List[Cell]:
    """All cells of a sweep, de-duplicated by key, in a stable order; validated (:mod:`kbsweep.planner.validate`).
    ``cfgs``: the jobs' configs (a :class:`kbsweep.config.jobs.Jobs` gives each prepared config once with its repeats)."""
    from kbsweep.config.jobs import as_jobs
    from kbsweep.planner.validate import check_cells

    jobs = as_jobs(cfgs)
    built = [cells_of(cfg, repeats) for cfg, repeats in jobs.units]
    seen: Dict[str, Cell] = {}
    for where in jobs.where:  # the jobs' order
        assert where is not None  # as_jobs places every job in a unit
        unit, place = where
        per = len(built[unit]) // len(jobs.units[unit][1])
        for cell in built[unit][place * per : (place + 1) * per]:
            seen.setdefault(cell.key, cell)
    cells = list(seen.values())
    automatic = {cell.key for (cfg, _), unit in zip(jobs.units, built) if judging.setting(cfg) is None for cell in unit}
    judging.assign(cells, automatic)
    check_cells(cells)
    return cells


def estimate(cells: List[Cell]) -> Dict[str, Any]:
    """Plan estimates: model dollars from prices × expected tokens (the agents' and the judge's); GPU-hours and rent
    from time caps."""
    usd = 0.0
    unpriced = set()
    gpu_hours = 0.0
    rent = 0.0
    for cell in cells:
        prices, tokens = cell.model["prices"], cell.model["expected_tokens"]
        if prices["input"] is None or prices["output"] is None:
            unpriced.add(cell.model["name"])
        else:
            usd += (tokens["input"] * prices["input"] + tokens["output"] * prices["output"]) / 1e6
        hours = cell.track["time_cap_s"] / 3600 * max(1, cell.track["world_size"])
        gpu_hours += hours
        rent += hours * (cell.gpu.hourly_usd or 0.0)
    expected = {
        c.model["name"]: dict(c.model["expected_tokens"]) for c in cells if c.model.get("provider") == "litellm"
    }
    judge = judging.estimate(cells)  # the judge's calls are model spend too
    usd += (judge or {}).get("usd") or 0.0
    unpriced |= set((judge or {}).get("unpriced", ()))
    return {
        "cells": len(cells),
        "model_usd": usd,
        "unpriced_models": sorted(unpriced),
        "gpu_hours_cap": gpu_hours,
        "rent_usd_cap": rent,
        "expected_tokens": expected,
        "judge": judge,
    }


def cell_dir(cell: Cell) -> Path:
    return Path(cell.paths["outputs"]) / "sweeps" / cell.sweep / cell.key
