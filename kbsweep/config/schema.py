"""Structured schemas for every config group, and validation that names the file and key at fault."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Container, Dict, Iterable, List, Optional, Tuple, cast

from omegaconf import II, MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kbsweep.config.gpus import GpuSpec
from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT
from kbsweep.registry import Registry

if TYPE_CHECKING:
    import yaml

CONFIG_YAML = REPO_ROOT / "conf" / "config.yaml"


def as_dict(node: DictConfig | ListConfig, resolve: bool = True, throw_on_missing: bool = False) -> Dict[str, Any]:
    """A mapping config node as plain data (OmegaConf's to_container, whose annotation covers every kind of node)."""
    data = OmegaConf.to_container(node, resolve=resolve, throw_on_missing=throw_on_missing)
    assert isinstance(data, dict), f"a mapping config node, not {type(node).__name__}"
    return cast(Dict[str, Any], data)  # its keys are names: kbsweep's configs key nothing by number


@dataclass
class Prices:
    """USD per million tokens; null means unknown (a dollar budget then refuses to start)."""

    input: Optional[float] = None
    output: Optional[float] = None
    cache_read: Optional[float] = None
    cache_write: Optional[float] = None
    date: Optional[str] = None
    source: Optional[str] = None


@dataclass
class ExpectedTokens:
    """Tokens one cell is expected to spend; used only by `kbsweep plan` estimates."""

    input: int = 2_000_000
    output: int = 150_000


@dataclass
class RetryConf:
    """``model.retry``: the fields of :class:`kbsweep.agent.retries.RetryPolicy`, which says how they combine."""

    max_attempts: int = 6  # calls in all, the first included
    base_delay_s: float = 2.0  # the first wait's ceiling, doubled after each failure
    max_delay_s: float = 120.0  # no wait's ceiling above this
    budget_s: float = 900.0  # seconds of calls and waits, at most


@dataclass
class ModelConf:
    name: str = MISSING
    provider: str = "litellm"  # a key of kbsweep.agent.providers.MODEL_KINDS: litellm | scripted | replay
    route: Optional[str] = None  # litellm model string
    api_key_env: Optional[str] = None  # env var holding the key (never the key itself)
    api_base: Optional[str] = None
    context_window: int = 200_000
    max_output_tokens: int = 32_000
    reasoning_effort: Optional[str] = None
    prices: Prices = field(default_factory=Prices)
    expected_tokens: ExpectedTokens = field(default_factory=ExpectedTokens)
    concurrency: int = 4  # cells at once per provider (docs/launch.md)
    prompt_caching: bool = False  # ask litellm to mark the system and last messages for the provider's prompt cache
    timeout_s: float = 600.0
    retry: RetryConf = field(default_factory=RetryConf)
    options: Dict[str, Any] = field(default_factory=dict)
    script: Optional[List[Any]] = None  # scripted: the steps it plays
    transcript: Optional[str] = None  # replay: the transcript it plays back


@dataclass
class SandboxConf:
    """The root ``sandbox:`` section (kbsweep.sandbox.confine.SandboxPolicy, docs/sandbox.md)."""

    mode: str = "bwrap"  # bwrap | unsafe
    network_allow: List[str] = field(default_factory=list)
    cpu_s: int = 3600
    memory_mib: int = 16384
    max_procs: int = 4096
    disk_mib: int = 4096
    wall_s: float = 600.0


@dataclass
class TrackConf:
    name: str = MISSING
    problems_dir: str = MISSING  # folder under a problems root
    problems: List[str] = field(default_factory=list)  # empty: every problem in the folder
    format: str = "kbsweep"  # kbsweep | kernelbench | gpumode
    kernelbench_version: str = (
        "0.2"  # format kernelbench: whose eval semantics grade it (kbsweep.grader.referee.kernelbench_eval)
    )
    time_cap_s: float = 10_800.0
    world_size: int = 1
    allow_shell: bool = True
    max_turns: int = 200
    max_tokens: Optional[int] = None
    max_usd: Optional[float] = None
    grade_timeout_s: float = 1800.0
    own_kernels: bool = (
        True  # its problems score the candidate's own kernels: a grade whose calls launch none has no score
    )
    network_allow: List[str] = field(default_factory=list)  # hosts this track's run_shell may reach, besides sandbox's
    sandbox: SandboxConf = II("sandbox")  # the root section, carried into every cell (set it there, not here)


@dataclass
class HarnessConf:
    """The agent harness a cell runs (docs/harnesses.md): kbsweep's own loop, or a CLI agent from npm."""

    name: str = MISSING
    runner: str = MISSING  # a key of kbsweep.harness.RUNNERS
    package: Optional[str] = None  # npm package, installed by `python -m kbsweep.harness.install`
    version: Optional[str] = None  # pinned: installed, and checked against `<bin> --version` before a sweep
    bin: Optional[str] = None  # the command, looked up in the installed packages, then on PATH


@dataclass
class SlurmConf:
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpus_per_task: int = 4
    mem_gb: float = 32.0
    array_parallelism: int = 32  # tasks of one job array running at once (Slurm's --array=...%N)
    max_array_size: int = 1000  # tasks per job array (the cluster's MaxArraySize - 1; Slurm's default allows 1000)
    setup: List[str] = field(default_factory=list)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LauncherConf:
    kind: str = "local"  # a key of kbsweep.launch.launchers.LAUNCHERS: local | slurm | inline
    concurrency: int = 2
    folder: str = "${paths.outputs}/submitit"
    slurm: SlurmConf = field(default_factory=SlurmConf)
    requeue_infra: int = 1
    cap_slack_s: float = 600.0  # a cell is killed at track.time_cap_s + track.grade_timeout_s + this
    warm_workers: bool = (
        True  # local: cells run one after another in `concurrency` long-lived workers; false: a fresh process per cell
    )


@dataclass
class TrackingConf:
    uri: str = "sqlite:///${paths.outputs}/mlflow.db"
    artifact_root: str = "${paths.outputs}/mlartifacts"
    trace_spans: str = "artifact"  # where a cell's trace keeps its spans: artifact (traces.json) | store (rows MLflow's trace search filters)


@dataclass
class AuditConf:
    """The root ``audit:`` section (docs/audit.md)."""

    judge: Optional[str] = (
        None  # a model of conf/model as the LLM judge; null: the cheapest keyed model the sweep configures (scored tracks); off: none
    )
    runs: List[str] = field(
        default_factory=list
    )  # `kbsweep audit`: the run ids to re-audit; empty: every cell of sweep.name


@dataclass
class SweepConf:
    """The root ``sweep:`` section: the sweep's name (its MLflow experiment), ``--force``, and its budget
    (:mod:`kbsweep.planner.budget`, docs/launch.md)."""

    name: str = MISSING
    force: bool = False
    max_usd: Optional[float] = None  # dollars for the whole sweep; each cell reserves its track.max_usd
    max_tokens: Optional[int] = None  # tokens for the whole sweep; each cell reserves its track.max_tokens


GROUP_SCHEMAS = {
    "model": ModelConf,
    "gpu": GpuSpec,
    "track": TrackConf,
    "harness": HarnessConf,
    "launcher": LauncherConf,
    "tracking": TrackingConf,
    "sandbox": SandboxConf,
    "audit": AuditConf,
    "sweep": SweepConf,
}


def at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: is_number(v) and math.isfinite(v) and v >= low


def positive(v: Any) -> bool:
    return is_number(v) and math.isfinite(v) and v > 0


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda v: v in choices


def integer(low: int, note: str = "") -> Tuple[Callable[[Any], bool], str]:
    """An integer setting's (test, what it must be): a float is refused, 2.0 as much as 1.5."""
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}{note}"


BASELINES = ("eager", "compile", "sota", "baseline")
PREFLIGHT_MODES = (
    "live",
    "keys",
    "off",
)  # the ``preflight`` key: the modes of kbsweep.planner.preflight, checked for every verb
BASELINE_TIMERS = (
    "kernelbench",
)  # timers that may time the baselines beside kbsweep's own (kbsweep.grader.referee.reference_timers.time_<name>)
# what the types cannot say: (key, test, what it must be); a null value passes (optional keys)
RULES: List[Tuple[str, Callable[[Any], bool], str]] = [
    ("repeat", *integer(0)),
    ("preflight", one_of(*PREFLIGHT_MODES), f"one of {', '.join(PREFLIGHT_MODES)}"),
    ("model.context_window", *integer(1)),
    ("model.max_output_tokens", *integer(1)),
    ("model.concurrency", *integer(1)),
    ("model.timeout_s", positive, "a number of seconds > 0"),
    ("model.retry.max_attempts", *integer(1)),
    *(
        (f"model.retry.{k}", at_least(0), "a number of seconds >= 0")
        for k in ("base_delay_s", "max_delay_s", "budget_s")
    ),
    *(
        (f"model.prices.{k}", at_least(0), "USD per million tokens >= 0")
        for k in ("input", "output", "cache_read", "cache_write")
    ),
    ("gpu.device", one_of("cuda", "cpu"), "one of cuda, cpu"),
    ("gpu.shape_set", one_of("shapes", "smoke_shapes"), "one of shapes, smoke_shapes"),
    ("gpu.hourly_usd", at_least(0), "USD >= 0"),
    ("gpu.gpus_per_node", *integer(1)),
    ("gpu.baselines", lambda v: set(v) <= set(BASELINES), f"a list of {', '.join(BASELINES)}"),
    ("track.format", one_of("kbsweep", "kernelbench", "gpumode"), "one of kbsweep, kernelbench, gpumode"),
    ("track.time_cap_s", positive, "a number of seconds > 0"),
    *((f"track.{k}", *integer(1)) for k in ("world_size", "max_turns", "max_tokens")),
    ("track.max_usd", positive, "USD > 0"),
    ("track.grade_timeout_s", positive, "a number of seconds > 0"),
    ("sweep.max_usd", positive, "USD > 0 (null: no budget)"),
    ("sweep.max_tokens", *integer(1, " (null: no budget)")),
    ("launcher.concurrency", *integer(1)),
    ("tracking.trace_spans", one_of("artifact", "store"), "one of artifact, store"),
    ("launcher.requeue_infra", *integer(0)),
    ("launcher.cap_slack_s", at_least(0), "a number of seconds >= 0"),
    ("launcher.slurm.cpus_per_task", *integer(1)),
    ("launcher.slurm.mem_gb", positive, "a number of GB > 0"),
    *((f"launcher.slurm.{k}", *integer(1)) for k in ("array_parallelism", "max_array_size")),
    *((f"sandbox.{k}", *integer(1)) for k in ("cpu_s", "memory_mib", "max_procs", "disk_mib")),
    ("sandbox.wall_s", positive, "a number of seconds > 0"),
    ("grade.baselines", lambda v: set(v) <= set(BASELINES), f"a list of {', '.join(BASELINES)}"),
    ("grade.memory_mib", at_least(1), "a number of MiB >= 1 (null: from the host)"),
    *((f"grade.timing.{k}", *integer(1)) for k in ("min_runs", "max_runs")),
    ("grade.timing.rel_err", positive, "a number > 0"),
    ("grade.timing.max_time_s", positive, "a number of seconds > 0"),
    ("grade.timing.replay", lambda v: isinstance(v, bool), "true or false"),
    ("grade.timing.quiet_cpus", at_least(0), "a number of CPUs >= 0 (null: baselines timed whatever the host's load)"),
    ("grade.timing.quiet_wait_s", at_least(0), "a number of seconds >= 0"),
    ("grade.timing.ci_rel", positive, "a number > 0 (null: baselines stop by the candidate's rule)"),
    ("grade.fresh_baselines", lambda v: isinstance(v, bool), "true or false"),
    (
        "grade.timers",
        lambda v: set(v) <= set(BASELINE_TIMERS),
        f"a list of {', '.join(BASELINE_TIMERS)} (null: kernelbench for KernelBench problems on GPUs)",
    ),
]


def check_rules(
    cfg: DictConfig, sources: Dict[str, str], registries: Iterable[Registry] = (), keys: Optional[Container[str]] = None
) -> None:
    """Every :data:`RULES` key (of ``keys`` when given) holds a value in range, and every registry's key a
    registered name, else a KbsweepError naming the file and key."""
    names = [(r.key, one_of(*r), f"one of {r.choices()}") for r in registries]
    for key, test, want in [rule for rule in RULES + names if keys is None or rule[0] in keys]:
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        if value is not None and not test(value):
            group, _, inner = key.partition(".")
            where = sources.get(group) or str(CONFIG_YAML)
            raise KbsweepError(f"{where}: key '{inner if group in sources else key}': must be {want}, got {value!r}")


def error_line(exc: OmegaConfBaseException) -> tuple:
    key = getattr(exc, "full_key", None) or ""
    return key, str(exc).splitlines()[0]


def validate(
    cfg: DictConfig, sources: Optional[Dict[str, str]] = None, registries: Iterable[Registry] = ()
) -> DictConfig:
    """Merge each group onto its schema, then resolve everything; raise KbsweepError naming the file and key.

    ``sources`` maps a group to the YAML file it came from (for the message). ``registries`` are the registries
    whose keys the config names (given by the caller: config sits below the modules that hold them).
    """
    sources = sources or {}
    for group, schema in GROUP_SCHEMAS.items():
        if group not in cfg:
            raise KbsweepError(f"config has no '{group}' group")
        try:
            cfg[group] = OmegaConf.merge(OmegaConf.structured(schema), cfg[group])
        except OmegaConfBaseException as exc:
            key, msg = error_line(exc)
            raise KbsweepError(f"{sources.get(group, group)}: key '{key}': {msg}") from None
    try:
        for key in cfg:
            if key != "hydra":
                node = cfg[key]
                if OmegaConf.is_config(node):
                    OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key, msg = error_line(exc)
        group, _, inner = key.partition(".")
        where = sources.get(group)
        raise KbsweepError(f"{where}: key '{inner}': {msg}" if where else f"config: key '{key}': {msg}") from None
    check_rules(cfg, sources, registries)
    return cfg


def group_source(hydra_cfg: Any, group: str, choice: str) -> str:
    """The YAML file a group choice came from, searched along Hydra's config sources."""
    for source in hydra_cfg.runtime.config_sources:
        if source.schema != "file":
            continue
        path = Path(source.path) / group / f"{choice}.yaml"
        if path.exists():
            return str(path)
    return f"{group}/{choice}.yaml"


KEY_LINE = re.compile(
    r"^( *)\s*([^\s#:\-\[\]{},][^:#]*?)\s*:(\s|$)"
)  # `  key: ...`, not a list item's `- ...`; a tab indents nothing


def key_above(text: str, line: int) -> str:
    """The dotted key a line of YAML sits under: the nearest ``key:`` at or above it, then each less indented one."""
    path: List[str] = []
    indent = None
    for row in reversed(text.splitlines()[: line + 1]):
        match = KEY_LINE.match(row)
        if match and (indent is None or len(match.group(1)) < indent):
            path.insert(0, match.group(2).strip("'\""))
            indent = len(match.group(1))
    return ".".join(path)


def broken_yaml(path: Path, exc: yaml.YAMLError) -> KbsweepError:
    """A YAML parser's error as one line: the file, line and column of the fault, the key it sits under, what the
    parser found and the construct it was in (where that began elsewhere: a bracket left open lines above)."""
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    if mark is None:
        return KbsweepError(f"{path}: broken YAML ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    try:
        key = key_above(Path(path).read_text(), (context or mark).line)
    except OSError:
        key = ""
    began = f" ({exc.context} at {context.line + 1}:{context.column + 1})" if context and exc.context else ""
    named = f" key '{key}':" if key else ""
    return KbsweepError(f"{path}:{mark.line + 1}:{mark.column + 1}:{named} broken YAML: {exc.problem or exc}{began}")


def load_yaml(path: Path, schema: type, context: str = "") -> Dict[str, Any]:
    """``path`` merged onto ``schema`` and resolved, as plain data; KbsweepError naming the file and key (and
    ``context``, in parentheses) when it is broken, missing a required key or of the wrong type."""
    import yaml

    suffix = f" ({context})" if context else ""
    try:
        conf = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path))
        return as_dict(conf, throw_on_missing=True)
    except yaml.YAMLError as exc:
        raise KbsweepError(f"{broken_yaml(path, exc)}{suffix}") from None
    except OmegaConfBaseException as exc:
        key, msg = error_line(exc)
        raise KbsweepError(f"{path}: key '{key}': {msg}{suffix}") from None


def load_gpu(name: str, conf_dir: Path = REPO_ROOT / "conf") -> GpuSpec:
    """``gpu/<name>.yaml`` of ``conf_dir`` (the repository's ``conf/``), checked as a composed config's GPU is (its
    types, then :data:`RULES`): for scripts and tests that grade outside a composed config."""
    path = conf_dir / "gpu" / f"{name}.yaml"
    if not path.is_file():
        raise KbsweepError(f"no gpu '{name}' ({path})")
    loaded = load_yaml(path, GpuSpec)
    check_rules(
        OmegaConf.create({"gpu": loaded}),
        {"gpu": str(path)},
        keys={key for key, _, _ in RULES if key.startswith("gpu.")},
    )
    return GpuSpec(**loaded)
