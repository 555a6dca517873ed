"""What settled history becomes: deleted after its retention (``retention``), archived first if
asked (``archive``), the events table's day partitions on PostgreSQL (``partitions``), counted
per hour for the dashboard and the status command (``rollups``), and the leases that keep each
periodic task to one worker at a time (``maintenance``).

It deletes settled rows and never changes a live occurrence (``docs/design.md``, "The code's
layers").
"""
