"""Offline: real-engine runs and how well the simulator agrees with them.

``results`` reads a run's per-request results (stepplanner's layout, or the file
``vllm bench serve --save-result --save-detailed`` writes) and matches them to the trace that was
served; ``compare`` simulates that trace and puts real beside simulated, with relative errors.
Nothing here is imported by the serving path; heavy runtimes (torch, transformers) are imported
only by the modules that serve a trace.
"""
