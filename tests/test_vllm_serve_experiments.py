"""tools/vllm_serve_experiments.py's own arithmetic, without vLLM: the per-class trace files it
hands vLLM's client, and the figures it reads back from the client's result files (the
documented table of the served runs rests on both)."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def tool():
    path = TOOLS / "vllm_serve_experiments.py"
    if not path.exists():
        pytest.skip("tools/ is not beside this tests/ (e.g. a wheel test run)")
    sys.path.insert(0, str(TOOLS))
    spec = importlib.util.spec_from_file_location("vllm_serve_experiments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_class_files_hold_each_class_at_its_arrival_times(tool, tmp_path):
    rows = tool.trace_rows(30, 4.0)
    files = tool.class_files(rows, "run", tmp_path, serial=1)
    again = tool.class_files(rows, "other", tmp_path, serial=2)
    seen, hashes = [], {1: set(), 2: set()}
    for serial, paths in ((1, files), (2, again)):
        for prio, path in paths.items():
            entries = [json.loads(line) for line in path.read_text().splitlines()]
            mine = [r for r in rows if int(r["priority"]) == prio]
            assert [e["timestamp"] for e in entries] == [float(r["arrival_time"]) for r in mine]
            assert [e["input_length"] for e in entries] == [int(r["prompt_tokens"]) for r in mine]
            assert [e["output_length"] for e in entries] == [int(r["output_tokens"]) for r in mine]
            for e in entries:
                assert len(e["hash_ids"]) == math.ceil(e["input_length"] / tool.HASH_TOKENS)
                hashes[serial].update(e["hash_ids"])
            if serial == 1:
                seen += entries
    assert len(seen) == len(rows) == 30
    # No prompt of one run shares a block with another's: nothing is in the prefix cache.
    assert not hashes[1] & hashes[2]
    # 4 requests/s: the trace's 30 arrivals span 29 gaps of a quarter second on average.
    assert float(rows[-1]["arrival_time"]) == pytest.approx(29 / 4.0, rel=1e-4)


def _result(ttfts, itls, errors, starts, med_tpot=1.0):
    return {
        "ttfts": ttfts,
        "itls": itls,
        "errors": errors,
        "start_times": starts,
        "output_lens": [len(g) + 1 if not e else 0 for g, e in zip(itls, errors)],
        "request_goodput": 0.5,
        "median_ttft_ms": 1.0,
        "p99_ttft_ms": 2.0,
        "median_tpot_ms": med_tpot,
        "p99_tpot_ms": 3.0,
    }


def test_measured_reads_attainment_throughput_and_failures(tool, tmp_path):
    step = 0.01  # urgent (18.5, 3.7) steps: TTFT 0.185 s, TPOT 0.037 s
    (tmp_path / "results").mkdir()
    files = {
        # on time; a token late (gap 0.1 s past 0.185 + 0.037); refused (handed back)
        "urgent": _result([0.1, 0.1, 0.0], [[0.03, 0.03], [0.03, 0.2], []], ["", "", "500"],
                          [0.0, 1.0, 2.0]),
        # interactive TTFT 0.185 s: the second is late
        "interactive": _result([0.1, 0.3], [[0.05], [0.05]], ["", ""], [0.5, 1.5]),
        # batch: TTFT 1.48 s, lax
        "batch": _result([1.0], [[0.1, 0.1, 0.1]], [""], [0.0]),
    }  # fmt: skip
    for name, data in files.items():
        (tmp_path / "results" / f"r-{name}.json").write_text(json.dumps(data))
    got = tool.measured(tmp_path, "r", step, "aligned")
    assert got["requests"] == 6
    assert got["unserved"] == 1
    assert got["classes"]["urgent"]["attainment"] == pytest.approx(1 / 3)
    assert got["classes"]["interactive"]["attainment"] == pytest.approx(1 / 2)
    assert got["classes"]["batch"]["attainment"] == 1.0
    assert got["attainment"] == pytest.approx(3 / 6)
    assert got["urgent"] == pytest.approx(1 / 3)
    # vLLM's verdict is by mean TPOT: the urgent request with one late token averages 0.115 s
    # a token, over its 0.037 s objective; the late interactive TTFT fails it too.
    assert got["vllm_good"] == pytest.approx(3 / 6)
    assert got["vllm_goodput_rps"] == pytest.approx(1.5)  # the client files' own, summed
    # 5 served, from the first send (0.0) to the last token (1.5 + 0.3 + 0.05 = 1.85 s).
    assert got["throughput_rps"] == pytest.approx(5 / 1.85)
    assert got["output_tps"] == pytest.approx((3 + 3 + 2 + 2 + 4) / 1.85)
    assert got["ttft_p50_ms"] == pytest.approx(100.0)
