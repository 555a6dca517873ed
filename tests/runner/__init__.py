"""The test matrix behind ``python3 tests/run.py``, in small modules that tests/test_runner.py
tests: the legs (``legs``), how their parts share the machine (``lanes``), one pytest run
(``process``), the venvs and checks before the legs (``prepare``) and the summary (``results``).

Standard library only: it runs under the bare Python that builds the venvs.
"""
