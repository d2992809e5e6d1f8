"""What one step's result is: exact, or approximate with its coverage and residual."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXACT", "ResultInfo"]


@dataclass(frozen=True)
class ResultInfo:
    """``exact``: the full sum over the global batch. Otherwise (the master runs
    ``--beyond-s approximate`` and a parent decoded from fewer than n - s children):
    ``coverage`` is the fraction of the global batch the result covers (the mean effective
    weight of its samples; dividing the result by it gives an unbiased estimate of the full
    sum when the batch is shuffled every step: ``crnet.coding.approximate``), ``residual`` the
    largest deviation of a part's weight from 1 in any decode that went into it. Every
    process of the tree gets the same info for a step."""

    exact: bool = True
    coverage: float = 1.0
    residual: float = 0.0

    @classmethod
    def of(cls, approx: tuple[float, float] | None) -> ResultInfo:
        return EXACT if approx is None else cls(False, approx[0], approx[1])


EXACT = ResultInfo()
