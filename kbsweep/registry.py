"""Named implementations of one interface, picked by a YAML key: launchers (``launcher.kind``), model kinds
(``model.provider``), harness runners (``harness.runner``). Adding one is a class and its name in the registry;
config validation (:func:`kbsweep.config.schema.validate`) refuses any other name as one line naming the file and key."""

from __future__ import annotations

from typing import Callable, Dict, Generic, Optional, TypeVar

from kbsweep.errors import KbsweepError

T = TypeVar("T")


class Registry(Dict[str, T], Generic[T]):
    """``name -> implementation`` for the config key ``key`` (``group.field``)."""

    def __init__(self, key: str, entries: Optional[Dict[str, T]] = None):
        super().__init__(entries or {})
        self.key = key

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator adding its class (or function) under ``name``."""

        def add(entry: T) -> T:
            self[name] = entry
            return entry

        return add

    def choices(self) -> str:
        return ", ".join(sorted(self))

    def lookup(self, name: str, where: str) -> T:
        """The entry ``name``, else a KbsweepError naming ``where`` (the YAML file) and the key."""
        if name not in self:
            raise KbsweepError(
                f"{where}: key '{self.key.partition('.')[2]}': unknown {self.key} '{name}' (one of: {self.choices()})"
            )
        return self[name]
