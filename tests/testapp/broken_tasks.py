"""A tasks module that fails when imported (tests/tasks/test_tasks_backend.py names it in the admin)."""

raise RuntimeError("this module is broken")
