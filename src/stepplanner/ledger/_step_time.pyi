from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

@disjoint_base
class StepPricer:
    planner: Any
    last_plan: Any
    last_budget: int
    def __init__(
        self,
        planner: Any,
        policy: Any,
        limits: Any,
        max_step_seconds: float,
        coefficients: Any,
    ) -> None: ...
    def set_model(self, a: float, b: float, c: float, d: float, e: float, f: float) -> None: ...
    def plan(
        self,
        residents: Any,
        count: Any = None,
        reasons: Any = None,
        drafts: Any = None,
        max_num_tokens: Any = None,
    ) -> Any: ...
    def budget(self, residents: npt.NDArray[np.void], count: int) -> int: ...

def plan_features(plan: Any) -> tuple[int, int, int, int]: ...
