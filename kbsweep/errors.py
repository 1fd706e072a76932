"""The two kinds of error the user sees as one line, and the exit codes every verb ends with.

A leaf: every module may import it, and it imports no kbsweep module (the package root re-exports its names)."""

from enum import IntEnum


class KbsweepError(Exception):
    """An error the user can fix; printed as one line, never as a traceback."""


class InfraError(Exception):
    """Infrastructure failed (a scheduler refused a job, say): printed as one line, exit code INFRA; a rerun retries."""


class ExitCode(IntEnum):
    """What ``kbsweep`` exits with (README, "Exit codes")."""

    OK = 0
    BUG = 1  # an unexpected error, with its traceback: a bug to report
    CONFIG = 2  # a config, problem or input error: one line naming the file and key; nothing was launched
    MODEL = 3  # the model's failure: `grade` of an incorrect, crashing, too slow or too hungry solution
    INFRA = 4  # infrastructure: provider, node or scheduler faults, cells left unfinished; a rerun resumes
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it): what finished is kept; a rerun resumes
