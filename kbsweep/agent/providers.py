"""Model kinds by name: a model YAML's ``provider`` picks how its model is built (an unknown one is refused by
config validation as one line naming the file and key). Adding a kind is a :class:`~kbsweep.agent.models.ChatModel`
class and a line in :data:`MODEL_KINDS`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Mapping

from kbsweep.agent.llm import LiteLLMModel
from kbsweep.agent.models import ChatModel, ReplayModel, ScriptedModel
from kbsweep.config.schema import ModelConf, group_source, load_yaml
from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT
from kbsweep.registry import Registry

# each kind builds from (the resolved model YAML, the problem's bundled solutions: what a scripted model plays)
MODEL_KINDS: Registry[Callable[[Mapping[str, Any], Dict[str, Path]], ChatModel]] = Registry(
    "model.provider",
    {
        "litellm": lambda cfg, solutions: LiteLLMModel(cfg),
        "replay": lambda cfg, solutions: ReplayModel(cfg),
        "scripted": ScriptedModel,
    },
)


def build_model(cfg: Mapping[str, Any], solutions: Dict[str, Path]) -> ChatModel:
    """The model a model YAML describes."""
    return MODEL_KINDS.lookup(cfg["provider"], f"model/{cfg['name']}.yaml")(cfg, solutions)


def model_conf(name: str, hydra_cfg: Any = None) -> Dict[str, Any]:
    """The judge's model config (``audit.judge``): ``model/<name>.yaml`` along Hydra's config search path (the
    running app's, else the repository's ``conf/``), merged onto the model schema, resolved like a cell's model and
    built once (no route, an unknown provider: refused before any cell runs). Plain data (a cell carries it to its
    launcher); KbsweepError naming the file and key when it is missing or invalid."""
    if hydra_cfg is None:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    path = (
        Path(group_source(hydra_cfg, "model", name))
        if hydra_cfg is not None
        else REPO_ROOT / "conf" / "model" / f"{name}.yaml"
    )
    if not path.is_file():
        raise KbsweepError(f"audit.judge: no model '{name}' (model/{name}.yaml)")
    resolved = load_yaml(path, ModelConf, "audit.judge")
    build = MODEL_KINDS.lookup(resolved["provider"], f"{path} (audit.judge)")
    try:
        build(resolved, {})
    except (ValueError, KeyError, TypeError) as exc:
        raise KbsweepError(f"{path}: {exc} (audit.judge)") from None
    return resolved
