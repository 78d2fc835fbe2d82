"""One error hierarchy; ``harness.frontends.cli.main`` turns any ReproError into a one-line message and exit 2."""

from __future__ import annotations


class ReproError(Exception):
    """Base of every error the CLI reports as a usage/input problem (exit code 2)."""


class BadInput(ReproError):
    """A value given by the user is invalid; the message names it and the valid choices."""


class EnvBuildError(ReproError):
    """A vLLM environment could not be built."""


class ResolutionFailed(EnvBuildError):
    """uv could not resolve a release's requirements; ``stderr`` holds uv's own explanation (which pins failed)."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(message)
        self.stderr = stderr


class ResultsFileError(ReproError):
    """A results file is unreadable, corrupt, or of an unknown schema version."""


def bad_choice(what: str, value: object, valid: list[str] | tuple[str, ...]) -> BadInput:
    """BadInput naming the bad value and every valid choice."""
    return BadInput(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")


class MalformedEvent(ReproError):
    """A line from an engine or scheduler process (an event, a request record in it) is not what the wire format
    describes: read as a ``corrupt`` event, never judged."""
