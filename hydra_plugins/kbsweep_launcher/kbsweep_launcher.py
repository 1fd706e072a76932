"""A Hydra launcher that hands every job of a multirun to one kbsweep verb call (the whole matrix at once)."""

import sys
from dataclasses import dataclass
from typing import List, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict


@dataclass
class KbsweepLauncherConf:
    _target_: str = "hydra_plugins.kbsweep_launcher.kbsweep_launcher.KbsweepLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="kbsweep", node=KbsweepLauncherConf)


class KbsweepLauncher(Launcher):
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from kbsweep import KbsweepError
        from kbsweep.cli import dispatch, prepare

        setup_globals()
        cfgs: List[DictConfig] = []
        for overrides in job_overrides:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            HydraConfig.instance().set_config(cfg)
            try:
                prepare(cfg, cfg.hydra)
            except KbsweepError as exc:
                print(f"kbsweep: error: {exc}", file=sys.stderr)
                sys.exit(2)
            with open_dict(cfg):
                del cfg["hydra"]
            cfgs.append(cfg)
        code = dispatch(cfgs)
        returns = []
        for overrides, cfg in zip(job_overrides, cfgs):
            returns.append(JobReturn(overrides=list(overrides), cfg=cfg, status=JobStatus.COMPLETED, _return_value=code))
        return returns
