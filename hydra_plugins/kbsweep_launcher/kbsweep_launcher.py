"""A Hydra launcher that hands every job of a multirun to one kbsweep verb call (the whole matrix at once), and
the basic sweeper without its early composition of every job (the launcher composes them in this process)."""

from dataclasses import dataclass
from typing import List, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class KbsweepLauncherConf:
    _target_: str = "hydra_plugins.kbsweep_launcher.kbsweep_launcher.KbsweepLauncher"


@dataclass
class KbsweepSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.kbsweep_launcher.kbsweep_launcher.KbsweepSweeper"


ConfigStore.instance().store(group="hydra/launcher", name="kbsweep", node=KbsweepLauncherConf)
ConfigStore.instance().store(group="hydra/sweeper", name="kbsweep", node=KbsweepSweeperConf)


class KbsweepSweeper(BasicSweeper):
    """Hydra's basic sweeper (the same jobs from the same overrides), minus its check that every job composes:
    that check exists for launchers that compose elsewhere, later. The kbsweep launcher composes every job in
    this process before any verb runs, so a job that cannot compose still fails before anything is launched;
    checking first composed each job twice (half of a 100-cell sweep's start-up)."""

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        pass


class KbsweepLauncher(Launcher):
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def compose(self, overrides: List[str]) -> DictConfig:
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        HydraConfig.instance().set_config(cfg)
        return cfg

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from kbsweep.cli import dispatch, fail, prepare_or_fail
        from kbsweep.config.jobs import prepared_configs
        from kbsweep.errors import ExitCode, KbsweepError

        setup_globals()
        try:
            cfgs = prepared_configs(job_overrides, self.compose, prepare_or_fail)
        except KbsweepError as exc:  # a copy's repeat out of range
            fail(ExitCode.CONFIG, exc)
        dispatch(cfgs)  # exits with the verb's code (Hydra would drop a returned one)
        return []
