"""What the docs state is what the project is: pointers resolve, figures are stated once,
excerpts say they are excerpts, the docs speak of the project only, and their code runs.

Every page under docs/ (the site's, API reference included) and the README is read. Their code:
every Python block compiles, every shell block parses, every ``stepplanner`` command names a real
subcommand and real options, and every Python block whose names are all defined (by the page's
earlier blocks, or by a stand-in for what the docs leave to the reader, ``STAND_INS``) runs."""

from __future__ import annotations

import ast
import builtins
import pathlib
import re
import shlex
import shutil
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]

pytestmark = pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="runs from a checkout")


def _prose(path: pathlib.Path) -> str:
    """The file without its fenced code blocks."""
    return re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)


def _name(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _blocks(path: pathlib.Path, *languages: str) -> list[str]:
    """The fenced code blocks of ``path`` in one of ``languages``, in page order."""
    return [
        body
        for lang, body in re.findall(
            r"^```(\w*)\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M
        )
        if lang in languages
    ]


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_docs_speak_of_the_project_only(path: pathlib.Path) -> None:
    text = " ".join(_prose(path).split()).lower()
    for phrase in (
        "this session",
        "the session",
        "the issue's",
        "this issue",
        "the issue ",
        "helpers' work",
        "all helpers",
        "the helper's",
    ):
        assert phrase not in text, f"{path.name}: {phrase!r}"


def test_spec_points_only_to_files_the_repository_holds() -> None:
    text = (ROOT / "docs" / "SPEC.md").read_text(encoding="utf-8")
    assert "beside this file" not in text
    for path in re.findall(r"`([\w.-]+(?:/[\w.-]+)+\.\w+)`", text):
        assert any((base / path).exists() for base in (ROOT, ROOT / "docs", ROOT / "src")), path


def test_reliability_names_the_seeds_as_they_were_passed() -> None:
    text = " ".join((ROOT / "docs" / "reliability.md").read_text(encoding="utf-8").split())
    assert "20261121 to 202611212" not in text
    assert "-seed=2026112K` for K = 1 to 12" in text


def test_the_simulator_page_states_one_set_of_planner_costs() -> None:
    text = " ".join(_prose(ROOT / "docs" / "simulator.md").split())
    assert not re.search(r"ledger apply \d", text)  # the second, older set
    assert not re.search(r"`apply_to` itself \d", text)
    # The simulator measures the whole host step (ledger.step); its costs have one home.
    assert "`Ledger.apply` mean" not in text
    assert text.count("performance.md#the-whole-host-step") == 1


def test_readme_states_the_measured_time_of_the_main_job() -> None:
    setup = (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up", 1)[1]
    setup = " ".join(setup.split("```", 1)[0].split())
    assert "a few seconds" not in setup
    assert re.search(r"about \d+ s", setup)


def test_readme_excerpts_say_they_are_excerpts() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n\$ (stepplanner[^\n]*)\n.*?```\n+([^\n]*)", text, flags=re.S)
    assert blocks
    for command, after in blocks:
        assert after.startswith("(excerpt:"), command


def test_readme_stays_a_front_page() -> None:
    """What it is, why, set-up, the serving loop, one line per runtime and links: the reference
    lives in docs/ (the site), not here."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 180, len(lines)


def test_the_vllm_serve_line_is_the_same_in_the_readme_and_the_docs() -> None:
    """The README's line is the one tests/integrations/test_vllm.py runs; the docs' copy must not
    drift from it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = readme.split("<!-- vllm-serve -->", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert line.startswith("vllm serve ")
    served = [
        b for b in _blocks(ROOT / "docs" / "integrations.md", "sh") if b.startswith("vllm serve ")
    ]
    assert served == [line]


# --- the code in the docs --------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_python_blocks_compile(path: pathlib.Path) -> None:
    for block in _blocks(path, "python"):
        compile(block, _name(path), "exec")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_shell_blocks_parse(path: pathlib.Path) -> None:
    for block in _blocks(path, "sh"):
        proc = subprocess.run(
            ["bash", "-n"], input=block, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"{_name(path)}: {proc.stderr}\n{block}"


def _commands(block: str) -> list[list[str]]:
    """The ``stepplanner`` command lines of a shell block, continuations joined, comments cut
    and ``NAME="..."`` variables set earlier in the block expanded."""
    vars_: dict[str, str] = {}
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        assign = re.fullmatch(r"(\w+)=(.*)", words[0]) if len(words) == 1 else None
        if assign:
            vars_[assign[1]] = assign[2]
            continue
        words = [
            w for word in words for w in (vars_[word[1:]].split() if word[1:] in vars_ else [word])
        ]
        if words and words[0] == "stepplanner":
            found.append(words[1:])
    return found


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_stepplanner_commands_name_real_options(path: pathlib.Path) -> None:
    commands = [c for block in _blocks(path, "sh") for c in _commands(block)]
    if not commands:
        return
    cli = pytest.importorskip("stepplanner.cli", reason="the cli extra (click, rich)")
    for argv in commands:
        command = cli.main.commands.get(argv[0])
        assert command is not None, f"{_name(path)}: no command stepplanner {argv[0]}"
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        for word in argv[1:]:
            if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
                assert word.split("=", 1)[0] in known, (
                    f"{_name(path)}: stepplanner {argv[0]} {word}"
                )


class _Engine:
    """The forward pass and sampler the serving loop leaves to the reader: no sampled token ends
    a request, so each runs to its ``max_new_tokens``."""

    def run(self, plan) -> np.ndarray:
        return np.zeros(len(plan.sequences), dtype=bool)


def _model(positions, slot_mapping, block_table, cu_seqlens_q) -> np.ndarray:
    """The model of the KV-pages loop: one bool per plan row, never finished by the sampler."""
    return np.zeros(len(cu_seqlens_q) - 1, dtype=bool)


# What the docs leave to the reader, by the name they give it.
STAND_INS = {"engine": _Engine(), "model": _model, "request_id": 1, "prompt_length": 100}
# Pages whose every Python block must run: the serving loop as a reader copies it.
MUST_RUN = {"README.md": 1, "docs/serving_loop.md": 2}


def _free_names(block: str) -> set[str]:
    tree = ast.parse(block)
    bound = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
    loaded = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    return loaded - bound - set(dir(builtins))


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_python_blocks_run(path: pathlib.Path) -> None:
    """A page's blocks run in order in one namespace, as a reader pastes them; a block that needs
    a name nothing defines (a runtime's object, a fragment) is only compiled, above."""
    namespace: dict[str, object] = {"__name__": "__docs__", **STAND_INS}
    ran = 0
    for block in _blocks(path, "python"):
        if _free_names(block) - namespace.keys():
            continue
        exec(compile(block, _name(path), "exec"), namespace)  # noqa: S102 - the docs' own code
        ran += 1
    assert ran >= MUST_RUN.get(_name(path), 0)
