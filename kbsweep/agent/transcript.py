"""The run's transcript: one JSONL event per message, tool call, tool result and usage, secrets redacted."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List

from kbsweep.sandbox.secret_env import secret_names

KEY_PATTERN = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}|xai-[A-Za-z0-9]{16,})\b"
)


def secret_values(extra_env: Iterable[str] = ()) -> List[str]:
    """The values of :func:`secret_names` (6 characters or more), longest first."""
    values = {os.environ[n] for n in secret_names(extra_env) if len(os.environ.get(n, "")) >= 6}
    return sorted(values, key=len, reverse=True)


class Redactor:
    """Replaces secret values (see :func:`secret_values`) and key-shaped strings with ``[REDACTED]``."""

    def __init__(self, extra_env: Iterable[str] = ()):
        self.names = sorted(extra_env)
        self.values = secret_values(extra_env)

    def text(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, "[REDACTED]")
        return KEY_PATTERN.sub("[REDACTED]", text)

    def data(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value


class Transcript:
    """Append-only JSONL of the run in kbsweep's event schema (see docs/transcripts.md)."""

    def __init__(self, path: Path, redactor: Redactor):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.redactor = redactor
        self.events: List[Dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> Dict[str, Any]:
        event = self.redactor.data({"ts": time.time(), "type": kind, **fields})
        self.events.append(event)
        with self.path.open("a") as fh:
            fh.write(json.dumps(event, default=str) + "\n")
        return event


def read_events(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
