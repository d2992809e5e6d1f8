"""Exceptions a training process sees; each says what went wrong and what to do."""

from __future__ import annotations


class CrnetError(Exception):
    """Base class of crnet's errors."""


class DaemonNotRunning(CrnetError, ConnectionError):
    """No crnetd answers on the client socket (or it went away)."""


class StepFailed(CrnetError):
    """A step could not be completed by the tree; ``reason`` says where and why.

    Every client of the tree receives the same error for the same step. The tree
    stays up: continue with the next step number.
    """

    def __init__(self, step: int, reason: str):
        super().__init__(f"step {step} failed: {reason}")
        self.step = step
        self.reason = reason


class MismatchError(CrnetError, ValueError):
    """This process's vector does not match the rest of the tree (length or dtype)."""


class StepLost(CrnetError):
    """The result of a step this process fell behind on is no longer held by its daemon."""
