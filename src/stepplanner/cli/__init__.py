"""``stepplanner``: see what a scheduling policy does to latency and throughput before deploying it.

Commands: ``simulate`` (one configuration on one workload), ``compare`` (several side by side),
``explain`` (one ledger -> its plan, every resident's reason, and which SPEC §2 rule set each
budget), ``record``/``replay`` (per-step ledger+plan traces, re-planned and diffed) and
``bench`` (``stepplanner.bench``'s micro-benchmarks); ``sweep`` (a grid of configurations against
SLOs), ``capacity`` (the highest rate meeting them) and ``calibrate`` (a latency model fitted to
measured step times); ``serve-trace`` (a trace served for real through transformers' continuous
batching: the measurements ``calibrate`` and ``fidelity`` start from; it needs the
``transformers`` extra, imported only when it runs) and ``fidelity`` (a real engine's per-request
results beside the simulation of the trace it served). Needs the ``cli`` extra (click, rich).

Layout: one module per command, each defining one click command that ``main`` adds below;
shared by them: ``options`` (the flags), ``config`` (the ``KEY=VALUE`` configuration syntax),
``running`` (a simulation with its progress bar), ``render`` (every report in every
``--format``), ``notices`` (warnings on stderr), ``errors`` (which exceptions become one-line
errors, and exit statuses), ``counts`` (``--requests`` and ``-B`` against the memory available),
``files`` (input files read, output paths checked) and ``plot``
(the figures of simulate and fidelity, and the helpers ``compare_plot``, compare's figure, uses);
``tuning_options``, ``tuning_render``, ``tuning_progress`` and ``tuning_extras`` are the same for
the tuning commands and for the SLO and vLLM-metric additions to ``simulate`` and ``compare``.
"""

from __future__ import annotations

try:
    import click
    import rich  # noqa: F401  (checked here so a missing extra is one message, not a traceback)
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise SystemExit(
        f"the stepplanner command needs click and rich ({exc}); "
        "install them with: pip install 'stepplanner[cli]'"
    ) from None

from .bench import bench_command
from .calibrate import calibrate_command
from .capacity import capacity_command
from .compare import compare_command
from .config import parse_config
from .explain import explain_command
from .fidelity import fidelity_command
from .record import record_command
from .replay import replay_command
from .serve_trace import serve_trace_command
from .simulate import simulate_command
from .sweep import sweep_command

__all__ = ["main", "parse_config"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stepplanner")
def main() -> None:
    """Plan in-flight-batching steps and simulate what a scheduling policy does."""


for _command in (
    simulate_command,
    compare_command,
    explain_command,
    record_command,
    replay_command,
    bench_command,
    sweep_command,
    capacity_command,
    calibrate_command,
    serve_trace_command,
    fidelity_command,
):
    main.add_command(_command)
