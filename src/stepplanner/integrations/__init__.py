"""Adapters that put stepplanner inside a serving runtime.

Each submodule imports its runtime on import and raises ``ImportError`` naming the versions it
supports; nothing here is imported by ``import stepplanner``. Install a runtime's adapter with its
extra, e.g. ``pip install "stepplanner[transformers]"``.
"""
