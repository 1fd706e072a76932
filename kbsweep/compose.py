"""A composed config made ready for a verb: ``gpu=auto`` resolved to a GPU YAML, a one-file grade's track taken from
its problem, every group validated against its schema (one line naming the file and key on error). The CLI and
the Python API (:func:`kbsweep.api.compose`) prepare their configs here alike."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from kbsweep.config.schema import as_dict, group_source, validate
from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT

SANDBOXED_VERBS = ("run", "grade", "verify")  # verbs that run untrusted code: refused where the sandbox cannot work

if not OmegaConf.has_resolver("kbsweep_root"):  # conf/config.yaml's paths: the repository and the working folder
    OmegaConf.register_new_resolver("kbsweep_root", lambda: str(REPO_ROOT))
    OmegaConf.register_new_resolver("kbsweep_cwd", os.getcwd)


def resolve_gpu(cfg: DictConfig, hydra_cfg) -> None:
    """gpu=auto: the gpu YAML whose nvml_names list the first GPU a grade here may take, else cpu."""
    from kbsweep.config import gpus

    pool = gpus.pool_devices()  # what a grade here may take, CUDA_VISIBLE_DEVICES respected
    name = "cpu"
    if pool:
        for source in hydra_cfg.runtime.config_sources:
            folder = Path(source.path) / "gpu"
            if source.schema != "file" or not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.yaml")):
                spec = OmegaConf.load(path)
                assert isinstance(spec, DictConfig), f"{path}: a gpu config is a mapping"
                if pool[0]["name"] in (spec.get("nvml_names") or []):
                    name = path.stem
        if name == "cpu":
            raise KbsweepError(f"gpu=auto: no gpu/*.yaml lists '{pool[0]['name']}' in nvml_names; add one")
    path = Path(group_source(hydra_cfg, "gpu", name))
    with open_dict(cfg):
        cfg.gpu = OmegaConf.load(path)


def grade_track(cfg: DictConfig, hydra_cfg) -> str:
    """``kbsweep grade problem=<track>/<name>`` grades under that track's YAML (its time limit, world size, sandbox:
    what a sweep's grade of the same file gets) unless ``track=`` was given; returns the track's choice."""
    chosen = str(hydra_cfg.runtime.choices.get("track"))
    problem = str(cfg.get("problem") or "")
    if (
        cfg.get("verb") != "grade"
        or "/" not in problem
        or any(o.split("=")[0].lstrip("+~") == "track" for o in hydra_cfg.overrides.task)
    ):
        return chosen
    wanted = problem.split("/", 1)[0]
    path = Path(group_source(hydra_cfg, "track", wanted))
    if wanted == cfg.track.name or not path.is_file():
        return chosen
    given = [o.lstrip("+")[len("track.") :] for o in hydra_cfg.overrides.task if o.lstrip("+").startswith("track.")]
    with open_dict(cfg):
        cfg.track = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(given))
    return wanted


def prepare(cfg: DictConfig, hydra_cfg) -> DictConfig:
    """Validate every group against its schema (one line naming file and key on error), resolve gpu=auto and a
    one-file grade's track; refuse a sandbox this machine cannot provide (probed for the verbs that run untrusted
    code)."""
    choices = {
        g: str(hydra_cfg.runtime.choices.get(g)) for g in ("model", "gpu", "track", "harness", "launcher", "tracking")
    }
    choices["track"] = grade_track(cfg, hydra_cfg)
    sources = {g: group_source(hydra_cfg, g, choice) for g, choice in choices.items()}
    if cfg.gpu.get("name") == "auto":
        resolve_gpu(cfg, hydra_cfg)
        sources["gpu"] = f"gpu/{cfg.gpu.name}.yaml"
    from kbsweep.agent.providers import MODEL_KINDS
    from kbsweep.harness import RUNNERS
    from kbsweep.launch.launchers import LAUNCHERS
    from kbsweep.sandbox.confine import SandboxPolicy, require

    validate(cfg, sources, (MODEL_KINDS, RUNNERS, LAUNCHERS))
    require(SandboxPolicy.of(as_dict(cfg.track)), probe=cfg.get("verb") in SANDBOXED_VERBS)
    return cfg
