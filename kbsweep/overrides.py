"""The command line before Hydra sees it: every YAML of the config search path parsed, every override's key and
group choice looked up (a typo is one line naming the key, not Hydra's report), options put before overrides."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from omegaconf import OmegaConf

from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT


def config_folders(argv: List[str]) -> List[Path]:
    """The config search path: kbsweep's conf/ and the user's ``-cd`` folders."""
    folders = [REPO_ROOT / "conf"]
    for i, arg in enumerate(argv):
        if arg in ("-cd", "--config-dir") and i + 1 < len(argv):
            folders.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            folders.append(Path(arg.split("=", 1)[1]))
    return folders


def has_key(tree: Dict, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def check_overrides(argv: List[str]) -> List[str]:
    """Parse the overrides, look up every group choice and key first: a typo is one line naming the key, not
    Hydra's multi-line report. A key a group's schema knows but its YAML omits (``track.world_size=2``) is
    added (``++``) rather than refused. Returns the arguments for Hydra."""
    from dataclasses import fields

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from kbsweep.config import GROUP_SCHEMAS

    folders = config_folders(argv)
    root = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "config.yaml"))  # unresolved: keys only
    values = {i + 1 for i, arg in enumerate(argv) if arg in ("-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path")}
    out = []
    for i, text in enumerate(argv):
        if i in values or text.startswith("-"):
            out.append(text)
            continue
        try:
            [override] = OverridesParser.create().parse_overrides([text])
        except OverrideParseException as exc:
            raise KbsweepError(f"override '{text}': {str(exc).splitlines()[0]}") from None
        key = override.key_or_group
        group, _, inner = key.partition(".")
        if override.is_delete() or override.is_add() or override.package or group == "hydra":
            out.append(text)
        elif key in GROUP_SCHEMAS:
            for choice in override.sweep_string_iterator() if override.is_sweep_override() else [override.value()]:
                if not any((folder / group / f"{choice}.yaml").is_file() for folder in folders):
                    known = sorted({p.stem for folder in folders for p in (folder / group).glob("*.yaml")})
                    raise KbsweepError(f"override '{text}': key '{group}': Could not find '{group}/{choice}' (one of: {', '.join(known)})")
            out.append(text)
        elif group in GROUP_SCHEMAS:
            if inner.split(".")[0] not in {f.name for f in fields(GROUP_SCHEMAS[group])}:
                raise KbsweepError(f"override '{text}': key '{key}': the {group} schema (kbsweep/config.py) has no such key")
            out.append(f"++{text}")
        elif not has_key(root, key):
            raise KbsweepError(f"override '{text}': key '{key}': not in conf/config.yaml (a new key is added with +{text})")
        else:
            out.append(text)
    return out


def check_yaml(argv: List[str]) -> None:
    """Parse every YAML of the config search path first: a broken file is one line, not a traceback. (libyaml's
    parser where installed: this runs on every command.)"""
    import yaml

    from kbsweep.config import broken_yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for folder in config_folders(argv):
        for path in sorted(folder.rglob("*.yaml")):
            try:
                yaml.load(path.read_text(), Loader=loader)
            except yaml.YAMLError as exc:
                raise broken_yaml(path, exc) from None


VALUED_OPTIONS = {"-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path", "-c", "--cfg", "-p", "--package", "--experimental-rerun"}


INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}  # --info's optional value


def split_options(argv: List[str]) -> tuple:
    """(Hydra's options with their values, the overrides): options go first, since Hydra's parser takes one run of
    overrides and refuses any after an option (``kbsweep track=hard problem=topk,kda -m``, ``model=x -cd DIR``)."""
    options: List[str] = []
    overrides: List[str] = []
    taking = False
    for i, arg in enumerate(argv):
        if taking or arg.startswith("-") or (i and argv[i - 1] == "--info" and arg in INFO_TOPICS):
            options.append(arg)
            taking = not taking and arg in VALUED_OPTIONS
        else:
            overrides.append(arg)
    return options, overrides
