"""Preflight: every model a sweep will call is checked before anything launches or is paid for.

``keys``: each litellm model's ``api_key_env`` must be set. ``live`` (the default): that, then one tiny request per
model (a few tokens, no reasoning effort) through the same :class:`~kbsweep.agent.llm.LiteLLMModel` a cell uses,
so a wrong route, key or base URL shows up here instead of ~25 s into every cell. The request is retried as a
cell's calls are (the model's ``retry`` policy, its budget capped at :data:`PROBE_BUDGET_S`; each wait is a line on
stderr), so one 429, 5xx, empty reply or reset connection does not refuse a whole sweep. ``off``: nothing. (The
``preflight`` key is checked with every config, :data:`kbsweep.config.schema.PREFLIGHT_MODES`.)
In every mode a litellm model without a ``route`` is refused (a config error). Scripted and replay models call no
provider and are not checked. The LLM judge (``audit.judge``) is checked too.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional

from kbsweep.errors import ExitCode, InfraError, KbsweepError
from kbsweep.outcomes import Outcome

PROBE_TIMEOUT_S = 60.0
PROBE_TOKENS = 16  # enough for any provider to accept the request; the reply itself is not used
PROBE_BUDGET_S = 120.0  # a probe's calls and waits at most: the sweep waits on its preflight
CONFIG_OUTCOMES = {Outcome.AUTHENTICATION, Outcome.MODEL_NOT_FOUND}  # the user's YAML or environment is wrong


@dataclass
class Check:
    """One model's preflight: ``status`` is ok, missing_key or failed (``outcome`` says how)."""

    model: str
    route: str
    key_env: Optional[str]
    status: str
    detail: str
    outcome: Optional[str] = None
    cost_usd: float = 0.0

    @property
    def exit_code(self) -> ExitCode:
        if self.status == "ok":
            return ExitCode.OK
        if self.status == "missing_key" or Outcome(self.outcome) in CONFIG_OUTCOMES:
            return ExitCode.CONFIG
        return ExitCode.INFRA

    def line(self) -> str:
        return f"model '{self.model}' ({self.route}): {self.detail}"


def models_of(cells: Iterable[Any]) -> Dict[str, Dict[str, Any]]:
    """The litellm models (agents and judge) of ``cells``, by name; KbsweepError naming the file and key for one
    without a ``route`` (litellm needs it to reach any provider)."""
    found: Dict[str, Dict[str, Any]] = {}
    for cell in cells:
        for conf in (cell.model, cell.judge):
            if conf and conf.get("provider") == "litellm":
                if not conf.get("route"):
                    raise KbsweepError(
                        f"model/{conf['name']}.yaml: key 'route': missing; provider 'litellm' needs a litellm model string (e.g. openai/gpt-5.5)"
                    )
                found.setdefault(conf["name"], conf)
    return found


def missing_keys(cells: Iterable[Any]) -> List[Check]:
    """A ``missing_key`` check for each model whose ``api_key_env`` is unset."""
    return [check for check in (key_check(conf) for conf in models_of(cells).values()) if check.status != "ok"]


def key_check(conf: Dict[str, Any]) -> Check:
    env = conf.get("api_key_env")
    route = str(conf.get("route"))
    if env and not os.environ.get(env):
        detail = f"environment variable {env} is not set (model/{conf['name']}.yaml: api_key_env)"
        return Check(conf["name"], route, env, "missing_key", detail)
    return Check(conf["name"], route, env, "ok", f"{env} is set" if env else "no key needed")


def live_check(conf: Dict[str, Any]) -> Check:
    """:func:`key_check`, then one tiny request, retried under the model's policy within :data:`PROBE_BUDGET_S`."""
    from kbsweep.agent.llm import LiteLLMModel
    from kbsweep.agent.models import ProviderFault
    from kbsweep.agent.retries import RetryPolicy, provider_answer

    check = key_check(conf)
    if check.status != "ok":
        return check
    policy = RetryPolicy.from_config(conf.get("retry"))
    retry = {**asdict(policy), "budget_s": min(policy.budget_s, PROBE_BUDGET_S)}
    # no reasoning effort: Anthropic refuses a thinking budget above max_tokens
    probe = {
        **conf,
        "reasoning_effort": None,
        "max_output_tokens": PROBE_TOKENS,
        "timeout_s": min(float(conf.get("timeout_s") or PROBE_TIMEOUT_S), PROBE_TIMEOUT_S),
        "retry": retry,
    }

    def say(record: Dict[str, Any]) -> None:
        status = f"{record['status']} " if record["status"] else ""
        print(
            f"[kbsweep] preflight: model '{check.model}': attempt {record['attempt']} of {record.get('max_attempts', policy.max_attempts)}: {status}"
            f"{provider_answer(record['message'])}; retrying in {record['delay_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    model = LiteLLMModel(probe, on_retry=say)
    try:
        reply = model.complete([{"role": "user", "content": "Reply with the word ok."}], [])
    except ProviderFault as fault:
        return Check(
            check.model, check.route, check.key_env, "failed", refusal(fault), fault.outcome.value, fault.cost_usd
        )
    check.detail = f"answered in {reply.latency_s:.1f} s" + (
        f" after {len(model.last_retries)} retries" if model.last_retries else ""
    )
    check.cost_usd = reply.cost_usd
    return check


def refusal(fault: Any) -> str:
    """A probe's failure in one line: the outcome, what the provider answered (status and message), the attempts."""
    answered = (
        ""
        if not getattr(fault, "reached", True)
        else f"the provider answered {fault.status}: "
        if fault.status
        else "the provider answered: "
    )
    attempts = f" (after {fault.attempts} attempts)" if fault.attempts > 1 else ""
    return f"{fault.outcome.value}: {answered}{fault.answer}{attempts}"


def preflight(cells: Iterable[Any], mode: str) -> List[Check]:
    """Check every litellm model of ``cells`` (``mode``: live, keys or off); the live requests run in parallel. A
    model without a route is refused in every mode (KbsweepError)."""
    models = list(models_of(cells).values())
    if mode == "off" or not models:
        return []
    check = live_check if mode == "live" else key_check
    with ThreadPoolExecutor(max_workers=min(8, len(models))) as pool:
        return list(pool.map(check, models))


def worst(checks: Iterable[Check]) -> ExitCode:
    """CONFIG when any key or route is wrong, else INFRA when a provider failed, else OK."""
    codes = {check.exit_code for check in checks}
    return ExitCode.CONFIG if ExitCode.CONFIG in codes else ExitCode.INFRA if ExitCode.INFRA in codes else ExitCode.OK


def refuse_on_failure(cells, mode: str) -> None:
    """Preflight the models of ``cells``: each failure is one line, then exit (CONFIG for a key or route, INFRA
    for a provider fault) before anything launches."""
    refuse_failed(preflight(cells, mode))


def refuse_failed(checks: Iterable[Check]) -> None:
    """Raise the failed ``checks`` as one error, a line each: KbsweepError when any key or route is wrong (exit
    code CONFIG), else InfraError."""
    failed = [check for check in checks if check.status != "ok"]
    if failed:
        error = KbsweepError if worst(failed) == ExitCode.CONFIG else InfraError
        raise error("\n".join(check.line() for check in failed))
