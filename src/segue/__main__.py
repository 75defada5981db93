"""``python -m segue``: the ``segue`` command, for an environment without its console script."""

from segue.cli import main

if __name__ == "__main__":
    main()
