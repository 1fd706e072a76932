"""Installs the pinned npm packages of the CLI harnesses (``conf/harness/*.yaml``) into ``.harnesses/``.

``python -m kbsweep.harness.install [name ...]`` (all harnesses with a package when no name is given); needs
``npm``. The CLIs ship their native binaries as npm packages
(optional dependencies per platform).
"""

from __future__ import annotations

import subprocess
import sys
from typing import List

from omegaconf import OmegaConf

from kbsweep.harness.locate import install_dir
from kbsweep.paths import REPO_ROOT


def packages(names: List[str]) -> List[str]:
    confs = [OmegaConf.load(p) for p in sorted((REPO_ROOT / "conf" / "harness").glob("*.yaml"))]
    return [f"{c.package}@{c.version}" for c in confs if c.get("package") and (not names or c.name in names)]


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
