"""Real `kbsweep` sweeps of demo/scale_shift on the CPU, with model YAMLs that point litellm at the fake provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "KBSWEEP_FAKE_PROVIDER_KEY"  # no *_API_KEY suffix: only the model YAML names it as a secret
SECRET = "fk-live-7f3a9c1e2b4d8a6f"  # not shaped like any known key: only the env-var rule can redact it
# preflight=keys: the fake provider answers requests with a test's scripted steps in order; a live probe would take one
DEMO = ["track=demo", "problem=scale_shift", "launcher=inline", "gpu=cpu", "preflight=keys"]
FAST_RETRY = {"max_attempts": 3, "base_delay_s": 0.05, "max_delay_s": 0.2, "budget_s": 30}


def model_yaml(conf: Path, name: str, route: str, api_base: str, **fields: Any) -> Path:
    """Write ``conf/model/<name>.yaml``: a litellm model at ``api_base`` whose key is in KEY_ENV (JSON is YAML)."""
    data = {
        "name": name,
        "provider": "litellm",
        "route": route,
        "api_key_env": KEY_ENV,
        "api_base": api_base,
        "context_window": 100_000,
        "max_output_tokens": 1024,
        "timeout_s": 2,
        "retry": FAST_RETRY,
        **fields,
    }
    path = conf / "model" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def sweep(conf: Path, outputs: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``kbsweep -cd conf <overrides> track=demo problem=scale_shift launcher=inline gpu=cpu`` into ``outputs``; with
    ``audit.judge=off`` unless an override names the judge (a keyed model would judge every cell by default, and
    the fake provider answers a test's scripted steps in order: tests/test_audit_sweep.py runs the default)."""
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks"), KEY_ENV: SECRET}
    judge = [] if any(o.lstrip("+").startswith("audit.judge=") for o in overrides) else ["audit.judge=off"]
    command = [sys.executable, "-m", "kbsweep.cli", "-cd", str(conf), *overrides, *judge, *DEMO]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def results(outputs: Path, sweep_name: str = "demo") -> Dict[str, Dict[str, Any]]:
    """result.json of every cell of the sweep, by model name."""
    found = {}
    for path in sorted((outputs / "sweeps" / sweep_name).glob("*/result.json")):
        result = json.loads(path.read_text())
        found[result["cell"].split(" · ")[0]] = result
    return found


def cell_runs(outputs: Path, experiment: str = "demo") -> List[Any]:
    """The MLflow cell runs of the sweep, oldest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{outputs}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`kbsweep.kind` = 'cell'")
    return sorted(runs, key=lambda r: r.info.start_time)
