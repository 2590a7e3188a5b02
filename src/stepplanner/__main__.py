"""``python -m stepplanner``: the ``stepplanner`` command line."""

from .cli import main

if __name__ == "__main__":
    main()
