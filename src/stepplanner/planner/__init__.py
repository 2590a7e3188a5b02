"""What the planner kernel and its callers share (SPEC §2–§3), apart from the kernel itself.

``_policy`` resolves ``SchedulingOptions`` into budgets (SPEC §2), ``_types`` holds the enums,
dtypes and plan formatting both kernels share, ``_fields`` the argument conversion both share,
``_config_keys`` the configuration keys the CLI and the integrations read, and ``checks`` the §3
guarantees as an independent check of any plan. The kernel (``stepplanner._core``, its twin
``stepplanner._core_py``) imports from here, never the reverse; ``stepplanner.core`` puts the
selected kernel and these names together.
"""
