"""Retention: deleting settled history, by the workers on a period (``DURABLE_SCHEDULER_RETENTION``)
and by hand (``manage.py scheduler_prune``, through ``ops.prune``), with one engine.

Its parts: :mod:`.rules`, what may go and what must stay, however old; :mod:`.plan`, one pass
that deletes it (which rows, in which chunks and batches, archived first) and what the pass
did; :mod:`.thread`, the workers' periodic run under the ``retention`` lease.
"""
