"""Which LLM judge each cell of a sweep runs (docs/audit.md, "Layer 3"), and what it is expected to cost.

``audit.judge`` names a model of ``conf/model``: every cell runs it. Left null (the default), a sweep that
configures a keyed model (a litellm model whose YAML names its key's variable, ``api_key_env``) is judged on its
scored tracks by the cheapest such model, for the tokens of one judge call (:data:`JUDGE_TOKENS`); a sweep of
keyless models only (the embedded default: the ``scripted`` model) has no judge. ``off`` turns the judge off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from kbsweep.planner.matrix import Cell

OFF = ("off", "none", "false")  # audit.judge values that turn the judge off
UNSCORED_TRACKS = ("proof", "instant")  # timer validation, a sweep's own cost: no model ranking for a judge to guard
# one judge call: the rubric, findings, evidence, the files (a solution of some thousand lines) and transcript
# excerpts; the answer is one short JSON object (a malformed one is asked again: rarely)
JUDGE_TOKENS = {"input": 30_000, "output": 1_500}


def setting(cfg: DictConfig) -> Optional[str]:
    """``audit.judge`` as written: a model's name, an OFF word, or None (the cheapest keyed model)."""
    value = OmegaConf.select(cfg, "audit.judge")
    return None if value is None else str(value)


def named(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The model YAML ``audit.judge`` names, validated like any model, or None (not named, or off)."""
    name = setting(cfg)
    if name is None or name.lower() in OFF:
        return None
    from kbsweep.agent.providers import model_conf

    return model_conf(name)


def call_usd(model: Dict[str, Any]) -> Optional[float]:
    """Dollars of one judge call by ``model`` (None: the model has no prices)."""
    prices = model.get("prices") or {}
    if prices.get("input") is None or prices.get("output") is None:
        return None
    return (JUDGE_TOKENS["input"] * prices["input"] + JUDGE_TOKENS["output"] * prices["output"]) / 1e6


def keyed(model: Dict[str, Any]) -> bool:
    return model.get("provider") == "litellm" and bool(model.get("api_key_env"))


def cheapest(models: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The keyed model of ``models`` whose judge call costs least (priced ones before unpriced, then by name)."""
    found = [m for m in models if keyed(m)]
    if not found:
        return None
    return min(found, key=lambda m: (call_usd(m) is None, call_usd(m) or 0.0, str(m.get("name"))))


def assign(cells: List[Cell], automatic: set) -> None:
    """Give the cells whose job left ``audit.judge`` null (keys in ``automatic``) and whose track is scored the
    cheapest keyed model among all the sweep's cells' models (a cell's own config, its overrides included)."""
    judge = cheapest([cell.model for cell in cells])
    if judge is None:
        return
    for cell in cells:
        if cell.key in automatic and cell.judge is None and cell.track.get("name") not in UNSCORED_TRACKS:
            cell.judge = dict(judge)


def estimate(cells: Sequence[Cell]) -> Optional[Dict[str, Any]]:
    """The judge's share of a plan: its models (cells each), the dollars of one call per judged cell (None where a
    judge has no prices) and the tokens assumed; None when no cell is judged."""
    judges = [cell.judge for cell in cells if cell.judge]
    if not judges:
        return None
    models: Dict[str, int] = {}
    for judge in judges:
        models[str(judge.get("name"))] = models.get(str(judge.get("name")), 0) + 1
    costs = [call_usd(judge) for judge in judges]
    priced = [c for c in costs if c is not None]
    return {
        "models": models,
        "cells": len(judges),
        "usd": sum(priced) if len(priced) == len(costs) else None,
        "expected_tokens": dict(JUDGE_TOKENS),
        "unpriced": sorted({str(judge.get("name")) for judge, cost in zip(judges, costs) if cost is None}),
    }
