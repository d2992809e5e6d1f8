"""The step core of one node: the gate (``engine.py``) and its rooms. Read
``engine.py``'s docstring first; it names each room and what it owns."""

from .engine import StepEngine
from .lending import Lend, Lender
from .outcomes import Failed, Lost, Mismatched, Outcome, Refused, Resolved
from .settings import EngineSettings
from .window import vouched, vouched_floor

__all__ = ["EngineSettings", "Failed", "Lend", "Lender", "Lost", "Mismatched", "Outcome",
           "Refused", "Resolved", "StepEngine", "vouched", "vouched_floor"]
