"""Stores: where conversations persist (``MemoryStore``, ``SqliteStore``, ``PostgresStore``).

Every store keeps the contract of ``segue.executor.store_port.Store``; ``_shared`` holds what the
three have in common, ``codec`` the JSON encoding of the core's values, and ``_sql`` what each
operation means on the two SQL stores' tables (``_rows`` and ``_outbox`` their rows and outbox),
each of which gives only its dialect: statements, locks, connections.
"""
