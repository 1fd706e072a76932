"""The command line before Hydra sees it: every YAML of the config search path parsed, every override's key and
group choice looked up (a typo is one line naming the key and the closest real one, not Hydra's report), options
put before overrides; and Hydra's own composition errors as one line."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Dict, List, NamedTuple, Set, Tuple

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


ADDED_KEYS = ("out",)  # read by a verb though not in conf/config.yaml: `kbsweep export +out=DIR`


class Keys(NamedTuple):
    """The keys kbsweep reads, dotted: ``root`` those of conf/config.yaml, ``schema`` the group schemas' fields
    (:data:`kbsweep.config.schema.GROUP_SCHEMAS`), ``free`` the free-form mappings among them (any key below one is the
    user's: passed on to litellm or Slurm as written)."""

    root: Set[str]
    schema: Set[str]
    free: Set[str]

    def reads(self, key: str) -> bool:
        return (
            key in self.root
            or key in self.schema
            or key in ADDED_KEYS
            or any(key.startswith(f"{f}.") for f in self.free)
        )


def tree_keys(tree: Dict, prefix: str = "") -> Set[str]:
    keys = set()
    for name, value in tree.items():
        keys.add(f"{prefix}{name}")
        if isinstance(value, dict):
            keys |= tree_keys(value, f"{prefix}{name}.")
    return keys


def schema_keys(schema: type, prefix: str) -> Tuple[Set[str], Set[str]]:
    """(every field of ``schema`` and of its nested schemas, dotted under ``prefix``; the Dict fields among them)."""
    keys: Set[str] = set()
    free: Set[str] = set()
    for name, hint in typing.get_type_hints(schema).items():
        key = f"{prefix}.{name}"
        keys.add(key)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint  # Optional[X] is X
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            nested, nested_free = schema_keys(hint, key)
            keys, free = keys | nested, free | nested_free
        elif typing.get_origin(hint) is dict:
            free.add(key)
    return keys, free


@functools.lru_cache(maxsize=1)
def known_keys() -> Keys:
    from kbsweep.config.schema import GROUP_SCHEMAS, as_dict

    root = as_dict(OmegaConf.load(REPO_ROOT / "conf" / "config.yaml"), resolve=False)  # unresolved: keys only
    keys = Keys(tree_keys({k: v for k, v in root.items() if k not in ("defaults", "hydra")}), set(), set())
    for group, schema in GROUP_SCHEMAS.items():
        fields, free = schema_keys(schema, group)
        keys.schema.update(fields)
        keys.free.update(free)
    return keys


def likeness(typed: str, real: str) -> float:
    """How alike two keys are: their spelling (a typo) and their words in any order (``grade.timeout_s`` is
    ``track.grade_timeout_s``), each counting half."""
    words = [set(re.split(r"[._]", k)) for k in (typed, real)]
    return (
        difflib.SequenceMatcher(None, typed, real).ratio() + len(words[0] & words[1]) / len(words[0] | words[1])
    ) / 2


def unknown_key(text: str, key: str, keys: Keys) -> KbsweepError:
    """One line naming the key no config or schema has, with the closest real key as the fix."""
    known = keys.root | keys.schema
    leaves = known - {k.rpartition(".")[0] for k in known}
    closest = max(sorted(leaves), key=lambda real: likeness(key, real))
    close = closest if likeness(key, closest) >= 0.6 else None
    where = (
        f"did you mean '{close}{text[text.index('=') :] if '=' in text else ''}'?"
        if close
        else f"the keys are conf/config.yaml's and the group schemas' of kbsweep/config/schema.py; free-form: {', '.join(sorted(keys.free))}"
    )
    return KbsweepError(f"override '{text}': key '{key}': kbsweep reads no such key; {where}")


def spaced_list(argv: List[str], at: int, overrides: Set[int]) -> str:
    """What to write for ``argv[at]`` where a space split a comma list into argv words (``model=a,`` ``b``;
    ``model=a`` ``,b``; ``model=a`` ``b``); ``overrides``: the indices of the override words. Empty when it is none."""
    text = argv[at]
    start = at - 1 if at - 1 in overrides and "=" in argv[at - 1] and (text.startswith(",") or "=" not in text) else at
    end = at + 1 if text.endswith(",") and at + 1 in overrides and "=" not in argv[at + 1] else at
    if start == end and not text.endswith(","):
        return ""
    return ",".join(part for part in (word.strip(",") for word in argv[start : end + 1]) if part)


def check_overrides(argv: List[str], sweeps: bool = True) -> List[str]:
    """Parse the overrides, look up every group choice and key first: a typo is one line naming the key and the
    closest real one, not Hydra's multi-line report, and a key kbsweep never reads is refused in every form
    (``key=v``, ``+key=v``, ``++key=v``, ``~key``, ``~key=v``) outside the free-form mappings. A key a group's schema
    knows but its YAML omits (``track.world_size=2``) is set with ``++`` rather than refused. A comma list needs
    ``sweeps`` (the CLI's ``-m``); a group's ``glob()`` becomes the comma list of its matches (Hydra's parser,
    here and in :func:`kbsweep.api.compose`, has no config loader to expand it) and ``interval()``, which no sweep
    can enumerate, is refused. Returns the arguments for Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob, OverrideType, ValueType
    from hydra.errors import OverrideParseException

    from kbsweep.config.schema import GROUP_SCHEMAS

    folders = config_folders(argv)
    keys = known_keys()
    groups = {g for g in GROUP_SCHEMAS if any((folder / g).is_dir() for folder in folders)}
    values = {
        i + 1
        for i, arg in enumerate(argv)
        if arg in ("-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path")
    }
    words = {i for i, arg in enumerate(argv) if i not in values and not arg.startswith("-")}
    out = []
    for i, text in enumerate(argv):
        if i not in words:
            out.append(text)
            continue
        try:
            [override] = OverridesParser.create().parse_overrides([text])
        except OverrideParseException as exc:
            fix = spaced_list(argv, i, words)
            raise KbsweepError(
                f"override '{text}': a comma list is one word, without spaces: write '{fix}'"
                if fix
                else f"override '{text}': {str(exc).splitlines()[0]}"
            ) from None
        key = override.key_or_group
        glob = override.value_type == ValueType.GLOB_CHOICE_SWEEP
        if override.is_sweep_override() and not sweeps:
            raise KbsweepError(
                f"override '{text}': sweeps {key} over several values: add -m (one list value is written {key}=[a,b])"
            )
        if override.package or re.split(r"[./]", key)[0] == "hydra":
            out.append(text)
        elif override.is_interval_sweep():
            raise KbsweepError(
                f"override '{text}': interval() is a continuous range, which a sweep cannot enumerate; list the values "
                f"(a comma list, choice(){', glob()' if key in groups else ', range()'})"
            )
        elif key in groups:
            known = sorted({p.stem for folder in folders for p in (folder / key).glob("*.yaml")})
            if glob:
                pattern = override.value()
                assert isinstance(pattern, Glob)  # a glob sweep's value (value()'s annotation leaves Glob out)
                matched = pattern.filter(known)
                if not matched:
                    raise KbsweepError(f"override '{text}': key '{key}': the glob matches none of {', '.join(known)}")
                text = f"{override.get_key_element()}={','.join(matched)}"
            for choice in (
                []
                if override.is_delete() or glob
                else override.sweep_string_iterator()
                if override.is_sweep_override()
                else [override.value()]
            ):
                if not any((folder / key / f"{choice}.yaml").is_file() for folder in folders):
                    raise KbsweepError(
                        f"override '{text}': key '{key}': Could not find '{key}/{choice}' (one of: {', '.join(known)})"
                    )
            out.append(text)
        elif not keys.reads(key):
            raise unknown_key(text, key, keys)
        elif glob:
            raise KbsweepError(
                f"override '{text}': glob() picks among a config group's files ({', '.join(sorted(groups))}), and "
                f"'{key}' is no group; list the values (a comma list, choice(), range())"
            )
        elif override.is_delete() and key in keys.root and key not in keys.schema:
            raise KbsweepError(
                f"override '{text}': key '{key}': kbsweep reads it and has no default for it; set it ({key}=...) instead"
            )
        else:  # a key the schema or a free-form mapping has that the YAML may omit is set or added alike
            out.append(f"++{text}" if override.type == OverrideType.CHANGE and key not in keys.root else text)
    return out


def hydra_error(exc: Exception) -> KbsweepError:
    """Hydra's composition error (and the OmegaConf error under it) as one line."""
    cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else None
    text = " ".join(line.strip() for part in (exc, cause) if part for line in str(part).splitlines() if line.strip())
    return KbsweepError(text or type(exc).__name__)


def check_yaml(argv: List[str]) -> None:
    """Parse every YAML of the config search path first: a broken file is one line, not a traceback. (libyaml's
    parser where installed: this runs on every command.)"""
    import yaml

    from kbsweep.config.schema import broken_yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for folder in config_folders(argv):
        for path in sorted(folder.rglob("*.yaml")):
            try:
                yaml.load(path.read_text(), Loader=loader)
            except yaml.YAMLError as exc:
                raise broken_yaml(path, exc) from None


VALUED_OPTIONS = {
    "-cd",
    "--config-dir",
    "-cn",
    "--config-name",
    "-cp",
    "--config-path",
    "-c",
    "--cfg",
    "-p",
    "--package",
    "--experimental-rerun",
}


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
