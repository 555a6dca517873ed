"""This package under the neutral PostgreSQL job-queue harness (hardbyte/postgresql-job-queue-benchmarking).

``adapter.py`` is the long-running process the harness's adapter contract asks for (its
``CONTRIBUTING_ADAPTERS.md``): a fixed-rate producer through ``scheduler.enqueue``, the consumer
``manage.py runscheduler`` in the same process, and JSONL telemetry on stdout. ``systems/`` has
one static manifest (``adapter.json``) per system name; ``sitting.py`` runs the harness's
scenarios for ours and procrastinate and prints one table. How to run it: ``bench/README.md``.
"""
