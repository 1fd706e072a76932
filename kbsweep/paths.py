"""Where the checkout is: `conf/`, `problems/`, `roofline_specs/` and `baselines/` are found from here. A leaf."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def user_cache() -> Path:
    """kbsweep's folder of the user's cache (what any outputs folder may reuse: references known good, an empty
    MLflow store)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbsweep"
