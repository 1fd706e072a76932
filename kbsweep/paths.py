"""Where the checkout is: `conf/`, `problems/`, `roofline_specs/` and `baselines/` are found from here. A leaf."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
