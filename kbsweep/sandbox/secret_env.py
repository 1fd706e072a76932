"""Which environment variables hold secrets: a sandboxed command never inherits them, and a transcript redacts
their values."""

from __future__ import annotations

import os
from typing import Iterable, Set

SECRET_ENV_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET")


def secret_names(extra_env: Iterable[str] = ()) -> Set[str]:
    """Env vars that hold secrets: the model YAMLs' key vars (``extra_env``) and any *_API_KEY/_TOKEN/_SECRET."""
    return set(extra_env) | {k for k in os.environ if k.endswith(SECRET_ENV_SUFFIXES)}
