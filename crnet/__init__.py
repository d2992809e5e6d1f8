"""crnet: CodedReduce gradient aggregation (Reisizadeh et al., IEEE/ACM ToN 2021).

The math (``codes``, ``plan``) is pure; the kernels (``kernels``) do the coded sums;
``daemon`` and ``client`` move the bytes.
"""

__version__ = "0.1.0"

from .client import Assignment, AsyncClient, Client  # noqa: E402
from .batches import BatchSampler  # noqa: E402
from .errors import CrnetError, DaemonNotRunning, MismatchError, StepFailed, StepLost  # noqa: E402

__all__ = [
    "Assignment", "AsyncClient", "BatchSampler", "Client", "CrnetError", "DaemonNotRunning", "MismatchError",
    "StepFailed", "StepLost", "__version__",
]
