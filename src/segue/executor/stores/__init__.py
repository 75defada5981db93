"""Stores: where conversations persist (``MemoryStore``, ``SqliteStore``, ``PostgresStore``).

Every store keeps the contract of ``segue.executor.store_port.Store``; ``_shared`` holds what the
three have in common and ``codec`` the JSON encoding of the core's values.
"""
