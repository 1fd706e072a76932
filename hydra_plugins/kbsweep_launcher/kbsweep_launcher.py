"""A Hydra launcher that hands every job of a multirun to one kbsweep verb call (the whole matrix at once)."""

from dataclasses import dataclass
from typing import List, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, setup_globals
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
        from kbsweep.cli import dispatch, prepare_or_fail

        setup_globals()
        cfgs: List[DictConfig] = []
        for overrides in job_overrides:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            HydraConfig.instance().set_config(cfg)
            prepare_or_fail(cfg, cfg.hydra)
            with open_dict(cfg):
                del cfg["hydra"]
            cfgs.append(cfg)
        dispatch(cfgs)  # exits with the verb's code (Hydra would drop a returned one)
        return []
