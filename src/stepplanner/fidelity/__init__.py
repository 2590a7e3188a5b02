"""Offline: real-engine runs and how well the simulator agrees with them.

``harness`` serves a trace through Hugging Face transformers' continuous batching at the trace's
own arrival times and writes what the runtime itself timed: per-request results (in the layout of
``vllm bench serve --save-result --save-detailed``) and per-step timings (the contract columns
``stepplanner calibrate`` reads); it needs the ``transformers`` extra and is imported only on use.
``results`` reads a run's per-request results (stepplanner's layout, or vLLM's) and matches them
to the trace that was served; ``compare`` simulates that trace and puts real beside simulated,
with relative errors. Nothing in the serving path imports this package.
"""
