"""A sweep's jobs → their prepared configs, Hydra composing once per set of jobs that differ only in ``repeat``.

``repeat=range(0,50)`` makes 50 jobs whose configs are the same but for the plain value ``repeat`` (no group
choice, and so no default, can depend on it): composing and validating each of them is most of a large sweep's
start-up. The first job of such a set is composed and prepared; the others are copies with their own repeat,
which is checked against its rule like any composed one.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser

Compose = Callable[[List[str]], DictConfig]  # a job's overrides -> its config, with the hydra node
Prepare = Callable[[DictConfig, DictConfig], DictConfig]  # (config without the hydra node, the hydra node) -> prepared


def split_repeat(parser: OverridesParser, overrides: Sequence[str]) -> Tuple[Tuple[str, ...], Optional[object]]:
    """(the overrides other than a plain ``repeat=N``, N as Hydra parses it or None)."""
    from hydra.core.override_parser.types import OverrideType

    rest, repeat = [], None
    for override in parser.parse_overrides(list(overrides)):
        plain = override.type == OverrideType.CHANGE and override.package is None and not override.is_sweep_override()
        if plain and override.key_or_group == "repeat":
            repeat = override.value()
        else:
            rest.append(override.input_line)
    return tuple(rest), repeat


def prepared_configs(jobs: Sequence[Sequence[str]], compose: Compose, prepare: Prepare) -> List[DictConfig]:
    """Every job's prepared config, in the jobs' order. Every set is composed before any is prepared, so a job
    Hydra cannot compose fails before kbsweep's own code runs (as Hydra's sweeper checks a batch first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kbsweep.config import check_rules

    parser = OverridesParser.create()
    sets: Dict[tuple, List[Tuple[int, Optional[object]]]] = {}
    for index, overrides in enumerate(jobs):
        rest, repeat = split_repeat(parser, overrides)
        sets.setdefault((rest, repeat is None), []).append((index, repeat))  # a job without repeat= keeps the default
    composed = [(compose(list(jobs[members[0][0]])), members) for members in sets.values()]
    cfgs: List[Optional[DictConfig]] = [None] * len(jobs)
    for cfg, members in composed:
        hydra_cfg = cfg.hydra
        with open_dict(cfg):
            del cfg["hydra"]
        cfg = prepare(cfg, hydra_cfg)
        cfgs[members[0][0]] = cfg
        for index, repeat in members[1:]:
            cfgs[index] = other = copy.deepcopy(cfg)
            if repeat is not None:
                OmegaConf.update(other, "repeat", repeat, merge=True)
                check_rules(other, {}, keys=("repeat",))
    return cfgs
