"""Offline tools that hold the simulator against a running engine (issue 21).

``harness``: serve a trace through Hugging Face transformers' continuous batching at the trace's
own arrival times and write what the runtime itself timed: per-request results (in the layout of
``vllm bench serve --save-result --save-detailed``) and per-step timings (the contract columns
``stepplanner calibrate`` reads). It needs the ``transformers`` extra and is imported only on use:
nothing in the serving path imports this package.
"""
