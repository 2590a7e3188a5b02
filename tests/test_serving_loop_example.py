"""examples/serving_loop.py runs, serves every request once, and retires on both rules."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def test_serving_loop_example_retires_every_request_once() -> None:
    path = Path(__file__).parent.parent / "examples" / "serving_loop.py"
    spec = importlib.util.spec_from_file_location("serving_loop_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps, order = module.serve([300, 40, 500, 120, 64, 16])
    assert sorted(order) == list(range(6))  # each request finished and was retired once
    assert order[0] == module.EOS_ROW  # the sampler's EOS ended it before max_new_tokens
    assert steps >= 4  # a prompt's first token, then three decodes
