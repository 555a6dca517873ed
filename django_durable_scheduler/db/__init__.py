"""What differs between SQLite, PostgreSQL and MySQL/MariaDB, behind one small interface with a
portable fallback: transactions, locks, the clock and the ORM's reads and writes (``dialect``),
the inserts the ORM cannot say (skipping taken keys, or guarded by another row: ``guarded``),
the wake-ups (NOTIFY or a datagram: ``wakeup``) and bounded counts for the pages a person opens
(``counting``).

The lowest layer: it imports only the models (``docs/design.md``, "The code's layers").
"""
