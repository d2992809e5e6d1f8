"""crnet: CodedReduce gradient aggregation (Reisizadeh et al., IEEE/ACM ToN 2021).

The math (``codes``, ``plan``) is pure; the kernels (``kernels``) do the coded sums;
``schemes`` say what a node does with a step's vectors; ``node`` is crnetd, which
moves the bytes; ``client`` is the training process's API.
"""

__version__ = "0.1.0"

from .client import Assignment, AsyncClient, Client, ResultInfo
from .client.batches import BatchSampler
from .errors import (
    AssignmentChanged,
    CrnetError,
    CrnetTimeout,
    DaemonBusy,
    DaemonNotRunning,
    JobEnded,
    MismatchError,
    ProtocolError,
    RequestRejected,
    StaleReplica,
    StepFailed,
    StepLost,
    StepRefused,
)

__all__ = [
    "Assignment", "AssignmentChanged", "AsyncClient", "BatchSampler", "Client", "CrnetError", "CrnetTimeout",
    "DaemonBusy", "DaemonNotRunning", "JobEnded", "MismatchError", "ProtocolError", "RequestRejected",
    "ResultInfo", "StaleReplica", "StepFailed", "StepLost", "StepRefused", "__version__",
]
