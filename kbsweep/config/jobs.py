"""A sweep's jobs → their prepared configs, Hydra composing once per set of jobs that differ only in ``repeat``.

``repeat=range(0,50)`` makes 50 jobs whose configs are the same but for the plain value ``repeat`` (no group
choice, and so no default, can depend on it): composing and validating each of them is most of a large sweep's
start-up. The first job of such a set is composed and prepared; the others are checked against the repeat's rule
like any composed one and stand for that config with their own repeat. A copy of the config is made only where a
value interpolates the repeat (each copy resolves it), or when a caller reads one job's config: copying and then
resolving each of 10 000 repeats took ~7 ms a job, most of a 10 000-cell plan.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, overload

from omegaconf import DictConfig, OmegaConf, open_dict

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

PLAIN_REPEAT = re.compile(r"repeat=(0|[1-9][0-9]*)")  # parsed by Hydra as this int
Compose = Callable[[List[str]], DictConfig]  # a job's overrides -> its config, with the hydra node
Prepare = Callable[[DictConfig, DictConfig], DictConfig]  # (config without the hydra node, the hydra node) -> prepared


def split_repeat(
    parse: Callable[[str], Override], overrides: Sequence[str]
) -> Tuple[Tuple[str, ...], Optional[object]]:
    """(the overrides other than a plain ``repeat=N``, N as Hydra parses it or None); ``parse``: one override line."""
    from hydra.core.override_parser.types import OverrideType

    rest: List[str] = []
    repeat: Optional[object] = None
    for line in overrides:
        plain_int = PLAIN_REPEAT.fullmatch(line)
        if plain_int:  # what Hydra's sweeper writes for each repeat of repeat=range(...) or a list
            repeat = int(plain_int.group(1))
            continue
        override = parse(line)
        plain = override.type == OverrideType.CHANGE and override.package is None and not override.is_sweep_override()
        if plain and override.key_or_group == "repeat":
            repeat = override.value()
        else:
            rest.append(line)  # what the override's input_line holds
    return tuple(rest), repeat


def mentions_repeat(cfg: DictConfig) -> bool:
    """Whether any value of ``cfg`` interpolates ``repeat`` (then each repeat resolves to a config of its own)."""

    def walk(value: Any) -> bool:
        if isinstance(value, dict):
            return any(walk(v) for v in value.values())
        if isinstance(value, list):
            return any(walk(v) for v in value)
        return isinstance(value, str) and "${" in value and "repeat" in value

    return walk(OmegaConf.to_container(cfg, resolve=False))


def with_repeat(cfg: DictConfig, repeat: Any) -> DictConfig:
    """A copy of ``cfg`` with its own ``repeat`` (None: cfg's)."""
    other = copy.deepcopy(cfg)
    if repeat is not None:
        OmegaConf.update(other, "repeat", repeat, merge=True)
    return other


class Jobs(Sequence[DictConfig]):
    """The prepared configs of a sweep's jobs, in the jobs' order. ``units`` holds each prepared config once with
    the repeats it stands for (what :func:`kbsweep.planner.matrix.build_matrix` builds cells from); ``jobs[i]`` is job
    i's own config, copied from its unit's when first read."""

    def __init__(self, count: int):
        self.units: List[Tuple[DictConfig, List[int]]] = []
        self.where: List[Optional[Tuple[int, int]]] = [None] * count  # job -> (unit, repeat's place in it)
        self.copies: Dict[int, DictConfig] = {}

    def add(self, cfg: DictConfig, members: List[Tuple[int, Any]]) -> None:
        """A unit: ``cfg`` standing for jobs ``members`` ((index, its repeat or None: cfg's own))."""
        self.units.append((cfg, [cfg.repeat if repeat is None else repeat for _, repeat in members]))
        for place, (index, _) in enumerate(members):
            self.where[index] = (len(self.units) - 1, place)

    def __len__(self) -> int:
        return len(self.where)

    @overload
    def __getitem__(self, index: int) -> DictConfig: ...

    @overload
    def __getitem__(self, index: slice) -> List[DictConfig]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        unit, place = self.where[index]
        cfg, repeats = self.units[unit]
        if place == 0:
            return cfg
        if index not in self.copies:
            self.copies[index] = with_repeat(cfg, repeats[place])
        return self.copies[index]

    def __iter__(self) -> Iterator[DictConfig]:
        return (self[i] for i in range(len(self)))


def as_jobs(cfgs: Sequence[DictConfig]) -> Jobs:
    """``cfgs`` as :class:`Jobs` (a plain list: a unit per config)."""
    if isinstance(cfgs, Jobs):
        return cfgs
    jobs = Jobs(len(cfgs))
    for index, cfg in enumerate(cfgs):
        jobs.add(cfg, [(index, None)])
    return jobs


def prepared_configs(jobs: Sequence[Sequence[str]], compose: Compose, prepare: Prepare) -> Jobs:
    """Every job's prepared config, in the jobs' order. Every set is composed before any is prepared, so a job
    Hydra cannot compose fails before kbsweep's own code runs (as Hydra's sweeper checks a batch first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kbsweep.config.schema import check_rules

    parser = OverridesParser.create()
    # each line parsed once: a sweep's jobs repeat all their lines but one (Hydra's parser took ~2 ms a line)
    parse = functools.lru_cache(maxsize=None)(lambda line: parser.parse_overrides([line])[0])
    sets: Dict[tuple, List[Tuple[int, Optional[object]]]] = {}
    for index, overrides in enumerate(jobs):
        rest, repeat = split_repeat(parse, overrides)
        sets.setdefault((rest, repeat is None), []).append((index, repeat))  # a job without repeat= keeps the default
    composed = [(compose(list(jobs[members[0][0]])), members) for members in sets.values()]
    out = Jobs(len(jobs))
    for cfg, members in composed:
        hydra_cfg = cfg.hydra
        with open_dict(cfg):
            del cfg["hydra"]
        cfg = prepare(cfg, hydra_cfg)
        probe = OmegaConf.create({"repeat": None})  # one node for every copy's check (creating one took ~1 ms)
        for _, repeat in members[1:]:
            probe.repeat = repeat
            check_rules(probe, {}, keys=("repeat",))
        if mentions_repeat(cfg):
            out.add(cfg, members[:1])
            for index, repeat in members[1:]:
                out.add(with_repeat(cfg, repeat), [(index, repeat)])
        else:
            out.add(cfg, members)
    return out
