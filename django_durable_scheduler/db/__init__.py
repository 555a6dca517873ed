"""What differs between SQLite, PostgreSQL and MySQL/MariaDB, behind one small interface with a
portable fallback: transactions and locks, the clock, the inserts (``dialect``, with the SQL text
built in ``statements``; one guarded by another row: ``guarded``), the wake-ups (NOTIFY or a
datagram: ``wakeup``), the plans a connection keeps (``kept``) and bounded counts for the pages
a person opens (``counting``).

The lowest layer: it imports only the models (``docs/design.md``, "The code's layers").
"""
