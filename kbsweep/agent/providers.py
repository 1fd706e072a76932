"""Model kinds by name: a model YAML's ``provider`` picks how its model is built (an unknown one is refused by
config validation as one line naming the file and key). Adding a kind is a :class:`~kbsweep.agent.models.ChatModel`
class and a line in :data:`MODEL_KINDS`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Mapping

from kbsweep.agent.llm import LiteLLMModel
from kbsweep.agent.models import ChatModel, ReplayModel, ScriptedModel
from kbsweep.registry import Registry

# each kind builds from (the resolved model YAML, the problem's bundled solutions: what a scripted model plays)
MODEL_KINDS: Registry[Callable[[Mapping[str, Any], Dict[str, Path]], ChatModel]] = Registry("model.provider", {
    "litellm": lambda cfg, solutions: LiteLLMModel(cfg),
    "replay": lambda cfg, solutions: ReplayModel(cfg),
    "scripted": ScriptedModel,
})


def build_model(cfg: Mapping[str, Any], solutions: Dict[str, Path]) -> ChatModel:
    """The model a model YAML describes."""
    return MODEL_KINDS.lookup(cfg["provider"], f"model/{cfg['name']}.yaml")(cfg, solutions)
