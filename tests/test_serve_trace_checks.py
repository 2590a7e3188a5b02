"""``serve-trace``'s arguments are checked before torch or transformers is imported: what they
would refuse with a traceback from a model's construction (a seed past torch.manual_seed's range,
an attention name transformers does not know, a directory with no model in it) is a one-line
error, exit status 2, with or without them installed (this venv has neither)."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

from stepplanner._errors import StepPlannerTypeError, StepPlannerValueError
from stepplanner.fidelity.model_checks import (
    ATTENTION_IMPLEMENTATIONS,
    attention_implementations,
    check_attn_implementation,
    check_model_dir,
    check_seed,
)
from stepplanner.sim.workloads import synthetic

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402


def test_the_seed_is_torchs_range() -> None:
    assert check_seed("s", 2**64 - 1) == 2**64 - 1 and check_seed("s", -(2**63)) == -(2**63)
    for bad in (2**64, -(2**63) - 1, 2**70):
        with pytest.raises(
            StepPlannerValueError,
            match=rf"^s={bad} is out of range; allowed: "
            r"an integer in \[-9223372036854775808, "
            r"18446744073709551615\]",
        ):
            check_seed("s", bad)
    with pytest.raises(StepPlannerTypeError, match="^s must be an int, got bool True"):
        check_seed("s", True)


def test_attention_names_come_from_transformers_when_it_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert attention_implementations() == ATTENTION_IMPLEMENTATIONS  # no transformers here
    assert check_attn_implementation("a", "paged|sdpa") == "paged|sdpa"

    class AttentionInterface(dict):  # a kernel someone registered, and transformers' own names
        def __init__(self) -> None:
            super().__init__({"sdpa": None, "my_kernel": None})

    fake = types.ModuleType("transformers")
    fake.AttentionInterface = AttentionInterface  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    assert attention_implementations() == ("eager", "my_kernel", "sdpa")
    assert check_attn_implementation("a", "my_kernel") == "my_kernel"
    with pytest.raises(
        StepPlannerValueError,
        match=r"^a='paged\|eager' is not an attention "
        r"implementation transformers accepts; "
        r"allowed: eager, my_kernel, sdpa$",
    ):
        check_attn_implementation("a", "paged|eager")


def test_a_model_directory_holds_a_config_and_weights(tmp_path: pathlib.Path) -> None:
    with pytest.raises(
        StepPlannerValueError,
        match="is not a model directory: it holds no "
        "config.json; allowed: a directory "
        "save_pretrained wrote",
    ):
        check_model_dir("m", tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(StepPlannerValueError, match=r"it holds no weights \(model.safetensors "):
        check_model_dir("m", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert check_model_dir("m", tmp_path) == str(tmp_path)
    with pytest.raises(StepPlannerValueError, match="is not a directory"):
        check_model_dir("m", tmp_path / "config.json")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--model-seed", str(2**70)],
            f"--model-seed={2**70} is out of range; allowed: an integer "
            "in [-9223372036854775808, 18446744073709551615]",
        ),
        (
            ["--attn-implementation", "bogus"],
            "--attn-implementation='bogus' is not an attention "
            "implementation transformers accepts; allowed: eager, ",
        ),
        (
            ["--attn-implementation", "org/kernel"],
            "--attn-implementation='org/kernel' is not an attention implementation",
        ),
        (
            ["--model", "{empty}"],
            "--model='{empty}' is not a model directory: it holds no config.json",
        ),
    ],
)
def test_serve_trace_checks_before_anything_is_imported(
    tmp_path: pathlib.Path, flags, message: str
) -> None:
    trace = tmp_path / "trace.csv"
    synthetic(requests=3, rate=6.0, seed=1, max_prompt=40, max_output=4).to_csv(trace)
    empty = tmp_path / "empty"
    empty.mkdir()
    # Were the harness imported first, this venv would end in its import error (exit 1).
    args = [f.format(empty=empty) for f in flags]
    out = CliRunner().invoke(
        main,
        [
            "serve-trace",
            str(trace),
            "--results",
            str(tmp_path / "r.json"),
            "--timings",
            str(tmp_path / "t.csv"),
            *args,
        ],
        catch_exceptions=False,
    )
    assert out.exit_code == 2, out.output
    assert f"Error: {message.format(empty=empty)}" in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
    assert "stepplanner.fidelity.harness" not in sys.modules
