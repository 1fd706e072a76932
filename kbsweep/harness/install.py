"""Installs the pinned npm packages of the CLI harnesses (``conf/harness/*.yaml``) into ``.harnesses/``.

``python -m kbsweep.harness.install [name ...]`` (all harnesses with a package when no name is given); needs
``npm``. The CLIs ship their native binaries as npm packages
(optional dependencies per platform).
"""

from __future__ import annotations

import subprocess
import sys
from typing import List

from omegaconf import DictConfig, OmegaConf

from kbsweep.harness.locate import install_dir
from kbsweep.paths import REPO_ROOT


def packages(names: List[str]) -> List[str]:
    specs = []
    for path in sorted((REPO_ROOT / "conf" / "harness").glob("*.yaml")):
        conf = OmegaConf.load(path)
        assert isinstance(conf, DictConfig), f"{path}: a harness config is a mapping"
        if conf.get("package") and (not names or conf.name in names):
            specs.append(f"{conf.package}@{conf.version}")
    return specs


def main(argv: List[str]) -> int:
    wanted, folder = packages(argv), install_dir()
    folder.mkdir(exist_ok=True)
    command = [
        "npm",
        "install",
        "--prefix",
        str(folder),
        "--no-save",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        *wanted,
    ]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
