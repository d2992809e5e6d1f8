"""crnet's one error tree: every error crnet raises is a ``CrnetError``.

::

    CrnetError
    +-- ProtocolError       a peer sent something that is not a valid crnet message, or
    |   |                   one this node cannot take from it
    |   +-- NotThatHost     a peer dialed for a rank is another host (--tls-names)
    +-- JoinRefused         a parent would not take this node (``retry``: try again later)
    +-- DaemonNotRunning    no crnetd on the client socket, or it went away (ConnectionError)
    +-- DaemonBusy          another training process holds this daemon
    +-- RequestRejected     the daemon refused a malformed request or shared memory
    +-- StepFailed          the tree could not complete a step; the same on every client
    +-- StepLost            the daemon no longer holds the result of a step this process missed
    +-- StepRefused         the step is far outside the tree's window: a bug in the caller
    +-- StaleReplica        this process may not hold the job's parameters (it joined a
    |                       running job, or missed a step): take the job's state first
    +-- AssignmentChanged   the tree re-assigned this host a different share of the data
    +-- JobEnded            the daemons moved on to another training job
    +-- MismatchError       this process's vector differs from the tree's (ValueError)
    +-- CrnetTimeout        no answer within the caller's timeout (TimeoutError)
    +-- LaunchError         a local tree (launch.py) or the demo could not start or run
    +-- InternalError       a bug in crnet itself, not a daemon problem (RuntimeError;
                            ``__cause__`` is the exception, with its traceback)

A daemon tells its training process which one with an ``ErrorKind`` in its ERROR
message; ``ErrorKind.exception`` turns that back into the exception.
"""

from __future__ import annotations

import enum


class CrnetError(Exception):
    """Base class of crnet's errors."""


class ProtocolError(CrnetError):
    """The peer sent something that is not a valid crnet frame or message, or one this
    node cannot take from it (a count beyond its subtree, a WELCOME to a place this node
    cannot fill, a peer that does not prove it holds the cluster secret).

    The connection it came on is closed; the daemon keeps serving everyone else (a link
    it dialed, it dials again after a pause).
    """


class NotThatHost(ProtocolError):
    """A peer dialed at the address the tree gave for a rank is not that rank's host (with
    ``--tls-names``, its certificate names another host id): as good as nobody there."""


class JoinRefused(CrnetError):
    """The parent refused this node: for good (wrong tree, no free slot, a leaf), or
    for now (``retry``: the parent has not joined yet, the slot is still held). With a
    cluster secret, only a parent that authenticated itself is taken at its word; a
    refusal for good stops the node (exit 2: its configuration is wrong)."""

    def __init__(self, reason: str, retry: bool = False, to: tuple[str, str] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry = retry
        self.to = to     # (address, name): the tree moved this host there (retry there)


class DaemonNotRunning(CrnetError, ConnectionError):
    """No crnetd answers on the client socket (or it went away)."""


class DaemonBusy(CrnetError):
    """Another training process is attached to this daemon."""


class RequestRejected(CrnetError):
    """The daemon refused a request: malformed, or shared memory it could not map."""


class StepFailed(CrnetError):
    """A step could not be completed; ``reason`` says where and why.

    ``tree_wide``: the master decided it, and every process of the tree gets this same
    error for this step: skip the update and continue with the next step. Otherwise
    this process's daemon was cut off from the master (its parent gone, restarting or
    frozen) and gave up waiting, within the bound: the step's verdict is still the
    master's, so ask for the same step again (the README's loop does). The daemon takes
    the step up anew once it is back, or answers with the tree's verdict: the result, a
    tree-wide failure, or ``StepLost`` where it no longer holds it. The replica is as it
    was: nothing was applied. ``tree_step`` is the newest step the tree decided.
    """

    def __init__(self, step: int, reason: str, tree_step: int = -1, tree_wide: bool = True):
        super().__init__(f"step {step} failed: {reason}")
        self.step = step
        self.reason = reason
        self.tree_step = tree_step
        self.tree_wide = tree_wide


class StepLost(CrnetError):
    """The outcome of a step this process fell behind on is no longer held by its daemon
    (or never reached it; or the daemon delivered it straight into this process's shared
    output already and kept no copy). The tree is at ``tree_step``: go on at
    ``tree_step + 1``."""

    def __init__(self, reason: str, step: int | None = None, tree_step: int = -1):
        super().__init__(reason)
        self.step = step
        self.tree_step = tree_step


class StepRefused(CrnetError):
    """The step number is far outside the steps the tree has open (``tree_step`` is the
    newest step the tree decided): only this request is refused."""

    def __init__(self, reason: str, step: int | None = None, tree_step: int = -1):
        super().__init__(reason)
        self.step = step
        self.tree_step = tree_step


class StaleReplica(CrnetError):
    """This process may not hold the job's parameters, so a gradient it computed would
    corrupt every replica: it connected to a job whose step 0 was already decided, or it
    got ``StepLost``. Raised by the client
    itself (``allreduce``, ``send_state``), before anything reaches the daemon, until the
    process takes the job's state (``request_state``: go on at the step after the one it
    returns) or says its parameters are current (``mark_current``)."""


class AssignmentChanged(CrnetError):
    """The tree was re-formed (its master restarted with other settings) and this host's
    share of the data changed: ``assignment`` is the new one (also ``Client.assignment``
    from now on). Steps already under way used the old one; redo the current step."""

    def __init__(self, reason: str, assignment):
        super().__init__(reason)
        self.assignment = assignment


class JobEnded(CrnetError):
    """The daemons now run another training job (a process of it connected): this
    process's job is over for them."""


class MismatchError(CrnetError, ValueError):
    """This process's vector does not match the rest of the tree (length or dtype)."""


class CrnetTimeout(CrnetError, TimeoutError):
    """No answer from crnetd within the timeout the caller gave."""


class LaunchError(CrnetError, RuntimeError):
    """A local tree of daemons (``crnet.tools.launch``) or a process of the demo failed."""


class InternalError(CrnetError, RuntimeError):
    """A bug in crnet itself: e.g. the client's own handling of the daemon's answers
    failed. The exception is its ``__cause__``; the daemon is not at fault."""


class ErrorKind(str, enum.Enum):
    """Why a daemon answered a training process's request with ERROR (on the wire: the value)."""

    FAILED = "failed"        # StepFailed
    LOST = "lost"            # StepLost
    REFUSED = "refused"      # StepRefused
    JOB = "job"              # JobEnded
    MISMATCH = "mismatch"    # MismatchError
    BUSY = "busy"            # DaemonBusy
    REQUEST = "request"      # RequestRejected: a malformed request
    SHM = "shm"              # RequestRejected: shared memory the daemon cannot map

    def exception(self, reason: str, step: int | None = None, tree_step: int = -1,
                  tree_wide: bool = True) -> CrnetError:
        """The exception a training process raises for this kind of ERROR."""
        if self is ErrorKind.FAILED:
            return StepFailed(-1 if step is None else step, reason, tree_step, tree_wide)
        if self is ErrorKind.LOST:
            return StepLost(reason, step, tree_step)
        if self is ErrorKind.REFUSED:
            return StepRefused(reason, step, tree_step)
        if self is ErrorKind.JOB:
            return JobEnded(reason)
        if self is ErrorKind.MISMATCH:
            return MismatchError(reason)
        if self is ErrorKind.BUSY:
            return DaemonBusy(reason)
        return RequestRejected(reason)
