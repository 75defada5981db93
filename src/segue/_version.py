"""segue's version, in a module of its own: the server and the CLI say it without importing the
``segue`` package's face (which sits above them)."""

__version__ = "0.1.0"
