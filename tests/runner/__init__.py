"""The test matrix behind ``python3 tests/run.py``, in small modules that tests/test_runner.py
tests: the legs (``legs``), how their parts share the machine (``lanes``), one pytest run
(``process``), the venvs and checks before the legs (``prepare``) and the summary (``results``).

Standard library only: it runs under the bare Python that builds the venvs. It is not a nox file
because what takes the time here is running legs side by side under rules nox does not have (nox
runs sessions one after another; two parts of a leg share its test database, and a test that
restarts PostgreSQL needs the server to itself), and not pytest-xdist shards because those rules
hold per database server, across legs, and the pgbouncer leg's test database is made beside the
pooler under one fixed name.
"""
