"""Non-negative linear least squares for the latency fits, which have three coefficients.

With so few columns the exact answer is cheap: the minimiser over x >= 0 is the unconstrained
least-squares solution on some support (the columns left free), so trying every support (8 for
three columns, the empty one included) and keeping the best feasible one is exact and
deterministic, with no iteration limit or tolerance to tune; numpy is the only dependency.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["nonnegative_least_squares"]


def nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||matrix @ x - target|| over x >= 0 (ties go to the smaller support)."""
    columns = matrix.shape[1]
    best_x = np.zeros(columns)
    best = float(np.sum(target**2))
    for size in range(1, columns + 1):
        for support in itertools.combinations(range(columns), size):
            sol, *_ = np.linalg.lstsq(matrix[:, support], target, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(columns)
            x[list(support)] = sol
            # Columns near the callers' 1e150 bound can square past the float range: such a
            # support's error is not a number, and a NaN is never better than the best so far.
            with np.errstate(invalid="ignore", over="ignore"):
                err = float(np.sum((matrix @ x - target) ** 2))
            if err < best:
                best, best_x = err, x
    return best_x
