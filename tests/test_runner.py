"""The test matrix runner (``python3 tests/run.py``): which legs and parts run, in what company,
how a pytest run is read, the summary, the last line CI reads and the exit code.

No database: the legs' pytest runs are replaced by canned outcomes where the flow is under test,
and a real pytest process runs where reading one is.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from . import devenv, run
from .runner import lanes, legs, prepare, process, results
from .runner.legs import Leg, Part
from .runner.results import Result

LEG = {leg.name: leg for leg in legs.LEGS}


# ----------------------------------------------------------------------------- the legs


def test_every_leg_by_default_and_pytest_arguments_after_the_double_dash():
    args, pytest_args = run.parse_args(["--no-lint", "--", "-k", "kernel", "-x"])
    assert [leg.name for leg in args.legs] == [
        "sqlite",
        "postgres",
        "mariadb",
        "dj6-sqlite",
        "dj6-postgres",
        "pgbouncer",
    ]
    assert pytest_args == ["-k", "kernel", "-x"]
    assert args.no_lint and not args.require_all and not args.install_system_deps


def test_legs_are_chosen_by_name_in_the_matrix_order():
    args, pytest_args = run.parse_args(
        ["--legs", " pgbouncer,sqlite ", "--require-all", "--install-system-deps"]
    )
    assert [leg.name for leg in args.legs] == ["sqlite", "pgbouncer"]
    assert pytest_args == []
    assert args.require_all and args.install_system_deps


@pytest.mark.parametrize("names", ["sqlite,oracle", "", ","])
def test_an_unknown_leg_or_none_is_refused(names, capsys):
    with pytest.raises(SystemExit) as exit_:
        run.parse_args(["--legs", names])
    assert exit_.value.code == 2
    assert (
        "choose from sqlite, postgres, mariadb, dj6-sqlite, dj6-postgres, pgbouncer"
        in capsys.readouterr().err
    )


def test_the_django_6_legs_test_the_wheel_and_the_pooler_leg_its_modules():
    assert {leg.name for leg in legs.LEGS if leg.wheel} == {"dj6-sqlite", "dj6-postgres"}
    assert {leg.name for leg in legs.LEGS if leg.venv == "dj6"} == {"dj6-sqlite", "dj6-postgres"}
    assert dict(LEG["dj6-postgres"].env) == {"DSCH_PG_PREPARED": "1"}
    pooled = LEG["pgbouncer"]
    assert pooled.pooler and f":{devenv.PGBOUNCER_PORT}/" in (pooled.url or "")
    assert pooled.tests == ("--reuse-db", "tests/test_pooler.py", "tests/test_crash.py")
    assert sorted(legs.LEG_ORDER) == sorted(LEG)


def test_every_module_a_leg_names_exists():
    named = [arg for leg in legs.LEGS for arg in leg.tests if arg.endswith(".py")]
    assert named
    for module in named:
        assert (devenv.ROOT / module).is_file(), module


def test_one_lane_runs_each_leg_whole():
    assert [legs.leg_parts(leg, 1) for leg in legs.LEGS] == [[Part()]] * len(legs.LEGS)


def test_two_lanes_share_a_leg_and_keep_the_server_restarts_apart_on_postgresql():
    postgres = legs.leg_parts(LEG["postgres"], 2)
    assert [(dict(p.env), p.exclusive, p.share) for p in postgres] == [
        ({"DSCH_SERVER_RESTART_TESTS": "only"}, True, True),
        ({"DSCH_TEST_SHARD": "1", "DSCH_SERVER_RESTART_TESTS": "skip"}, False, True),
        ({"DSCH_TEST_SHARD": "2", "DSCH_SERVER_RESTART_TESTS": "skip"}, False, True),
    ]
    assert [dict(p.env) for p in legs.leg_parts(LEG["mariadb"], 2)] == [
        {"DSCH_TEST_SHARD": "1"},
        {"DSCH_TEST_SHARD": "2"},
    ]
    # A leg of named modules is one run whatever the lanes.
    assert legs.leg_parts(LEG["dj6-sqlite"], 2) == [Part()]


# ----------------------------------------------------------------------------- the lanes


def test_a_part_never_runs_beside_another_of_its_leg():
    share1, share2 = legs.leg_parts(LEG["sqlite"], 2)
    assert not lanes.may_start(LEG["sqlite"], share2, [(LEG["sqlite"], share1)])
    assert lanes.may_start(LEG["sqlite"], share2, [(LEG["mariadb"], Part(env=(("X", "1"),)))])


def test_a_server_restart_has_its_server_to_itself():
    restart, share1, _ = legs.leg_parts(LEG["postgres"], 2)
    other = Part(" (part 1 of 2)", (("DSCH_TEST_SHARD", "1"),))
    # Not beside another leg on PostgreSQL, either way round; beside MariaDB or SQLite, yes.
    assert not lanes.may_start(LEG["postgres"], restart, [(LEG["dj6-postgres"], other)])
    assert not lanes.may_start(LEG["dj6-postgres"], other, [(LEG["postgres"], restart)])
    assert not lanes.may_start(LEG["pgbouncer"], Part(), [(LEG["postgres"], restart)])
    assert lanes.may_start(LEG["postgres"], restart, [(LEG["mariadb"], other)])
    assert lanes.may_start(LEG["sqlite"], other, [(LEG["postgres"], restart)])
    # Two ordinary parts of different PostgreSQL legs share the server.
    assert lanes.may_start(LEG["dj6-postgres"], other, [(LEG["postgres"], share1)])


def test_the_restarts_and_whole_legs_start_first_then_the_longest_legs_first_shares():
    items = [(leg, part, leg.name) for leg in legs.LEGS for part in legs.leg_parts(leg, 2)]
    queue = lanes.PartQueue(items)
    assert [leg.name + part.title for leg, part, _ in queue.waiting] == [
        "postgres (server restart)",
        "dj6-postgres (server restart)",
        "dj6-sqlite",
        "pgbouncer",
        *(
            f"{name} (part {n} of 2)"
            for n in (1, 2)
            for name in ("postgres", "mariadb", "dj6-postgres", "sqlite")
        ),
    ]


def test_the_lanes_run_every_part_with_the_rules_kept():
    items = [(leg, part, leg.name) for leg in legs.LEGS for part in legs.leg_parts(leg, 2)]
    running: list[tuple[Leg, Part]] = []
    seen: list[tuple[str, str]] = []
    most = 0
    lock = threading.Lock()

    def fake_run(leg: Leg, part: Part, name: str) -> None:
        nonlocal most
        with lock:
            assert lanes.may_start(leg, part, running), (leg.name, part.title, running)
            running.append((leg, part))
            most = max(most, len(running))
        time.sleep(0.02)
        with lock:
            running.remove((leg, part))
            seen.append((name, part.title))

    lanes.run_in_lanes(items, 2, fake_run)
    assert sorted(seen) == sorted((leg.name, part.title) for leg, part, _ in items)
    assert most == 2


def test_a_part_that_raises_is_returned_and_the_lanes_go_on(capsys):
    share1, share2 = legs.leg_parts(LEG["sqlite"], 2)
    ran = []

    def fake_run(leg: Leg, part: Part, _: None) -> None:
        ran.append(part.title)
        if part is share1:
            raise RuntimeError("boom")

    items: list[tuple[Leg, Part, None]] = [(LEG["sqlite"], share1, None), (LEG["sqlite"], share2, None)]
    errors = lanes.run_in_lanes(items, 1, fake_run)
    assert ran == [share1.title, share2.title]
    assert [(leg.name, part, str(exc)) for leg, part, _, exc in errors] == [("sqlite", share1, "boom")]
    assert "RuntimeError: boom" in capsys.readouterr().err


# ----------------------------------------------------------------------------- reading pytest


@pytest.mark.parametrize(
    ("lines", "closing"),
    [
        (
            ["tests/x.py ....", "==== 1 failed, 12 passed, 1 skipped in 3.21s ===="],
            "1 failed, 12 passed, 1 skipped in 3.21s",
        ),
        (["\x1b[32m12 passed\x1b[0m\x1b[32m in 0.50s\x1b[0m"], "12 passed in 0.50s"),
        (["== 3 passed, 2 deselected in 1.00s (0:00:01) =="], "3 passed, 2 deselected in 1.00s (0:00:01)"),
        (["= 1 passed in 1.0s =", "", "== 2 errors in 4.00s =="], "2 errors in 4.00s"),
        (["collected 0 items", "== no tests ran in 0.01s =="], "no tests ran in 0.01s"),
        (["Traceback (most recent call last):", "ImportError: boom"], ""),
    ],
)
def test_the_closing_line(lines, closing):
    assert results.closing_line(lines) == closing


def test_counts_of_a_closing_line():
    closing = "1 failed, 12 passed, 3 skipped, 2 errors, 1 error, 4 deselected, 1 xfailed in 3.21s"
    assert results.parse_counts(closing) == {
        "failed": 1,
        "passed": 12,
        "skipped": 3,
        "error": 3,
        "deselected": 4,
        "xfailed": 1,
    }
    assert results.parse_counts("") == {}


def write_tests(where: Path, body: str) -> Path:
    (where / "pytest.ini").write_text("[pytest]\n")
    (where / "test_fake.py").write_text(body)
    return where


def fake_pytest(where: Path, timeout: float) -> tuple[int, str, list[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    args = ["-p", "no:django", "test_fake.py"]
    return process.run_pytest(Path(sys.executable), env, args, timeout, echo=False, cwd=where)


def test_a_real_pytest_run_is_read(tmp_path):
    write_tests(tmp_path, "def test_a():\n    pass\n\ndef test_b():\n    assert False\n")
    code, closing, output = fake_pytest(tmp_path, timeout=120)
    assert code == 1
    assert results.parse_counts(closing) == {"failed": 1, "passed": 1}
    text = b"".join(output).decode()
    assert text.startswith(f"$ {sys.executable} -m pytest -p no:cacheprovider --durations=15 -p no:django")
    assert "assert False" in text
    assert not process.RUNNING


def test_a_pytest_run_past_its_time_is_stopped(tmp_path):
    write_tests(tmp_path, "import time\n\ndef test_slow():\n    time.sleep(120)\n")
    start = time.monotonic()
    code, _, output = fake_pytest(tmp_path, timeout=3)
    assert code == results.TIMED_OUT
    assert time.monotonic() - start < 60
    assert b"leg exceeded" in b"".join(output)
    assert not process.RUNNING


# ----------------------------------------------------------------------------- results


SHARE = legs.leg_parts(LEG["postgres"], 2)[1]


def test_a_run_recorded():
    result = Result("sqlite")
    assert results.record(result, Part(), 0, "3 passed, 1 skipped in 2.0s", 2.0, 25)
    assert results.record(result, Part(), 0, "2 passed in 1.0s", 1.5, 25)
    assert (result.status, result.counts, result.seconds) == ("passed", {"passed": 5, "skipped": 1}, 3.5)
    assert result.result_text == "passed (5 passed, 1 skipped)"


def test_a_share_may_select_nothing_a_whole_leg_may_not():
    share = Result("postgres")
    assert results.record(share, SHARE, results.NO_TESTS, "4 deselected in 0.1s", 0.1, 25)
    assert share.status == "passed"
    whole = Result("sqlite")
    assert not results.record(whole, Part(), results.NO_TESTS, "", 0.1, 25)
    assert (whole.status, whole.why) == ("failed", "no tests collected")


def test_a_failed_part_names_itself_and_fails_its_leg_for_good():
    result = Result("postgres")
    assert not results.record(result, SHARE, 1, "1 failed, 9 passed in 5.0s", 5, 25)
    assert results.record(result, legs.leg_parts(LEG["postgres"], 2)[2], 0, "7 passed in 1.0s", 1, 25)
    assert result.status == "failed"
    assert result.why == "part 1 of 2: pytest exit 1; 1 failed, 9 passed in 5.0s"
    assert not results.record(result, Part(), results.TIMED_OUT, "", 1500, 25)
    assert result.why.endswith("; timed out after 25 min")


def test_a_leg_that_passed_without_a_test_fails():
    deselected = Result("postgres", status="passed", counts={"deselected": 40})
    ran = Result("sqlite", status="passed", counts={"skipped": 3})
    results.settle([deselected, ran], require_all=False)
    assert (deselected.status, deselected.why) == ("failed", "no tests collected")
    assert ran.status == "passed"


def test_require_all_fails_a_skipped_leg():
    skipped = Result("mariadb", why="mariadb at 127.0.0.1 does not answer: refused")
    results.settle([skipped], require_all=False)
    assert skipped.status == "skipped"
    results.settle([skipped], require_all=True)
    assert (skipped.status, skipped.why) == (
        "failed",
        "required: mariadb at 127.0.0.1 does not answer: refused",
    )


def test_the_table():
    rows = [
        Result("sqlite", "3.11.7", "5.2.1", "sqlite", "passed", "", 12.34, {"passed": 5, "deselected": 2}),
        Result("dj6-postgres", why="no Python 3.13 or 3.12 found", database="postgres"),
    ]
    assert results.table(rows, "legs").splitlines() == [
        "legs",
        "leg           python  django  database  result                                  duration",
        "------------  ------  ------  --------  --------------------------------------  --------",
        "sqlite        3.11.7  5.2.1   sqlite    passed (5 passed)                         12.3 s",
        "dj6-postgres  -       -       postgres  skipped (no Python 3.13 or 3.12 found)     0.0 s",
    ]


def test_the_last_line_and_the_exit_code():
    passed = Result("sqlite", status="passed", counts={"passed": 10, "skipped": 1})
    failed = Result("postgres", status="failed", counts={"passed": 7, "failed": 1, "error": 2})
    skipped = Result("mariadb")
    lint = Result("ruff check", status="passed")
    text, code = results.summary([lint], [passed, skipped], 1.0)
    assert (text.splitlines()[-1], code) == ("10 passed, 0 failed", 0)
    assert text.startswith("checks\n")
    text, code = results.summary([lint], [passed, failed, skipped], 1.0)
    assert text.splitlines()[-2:] == ["FAILED: postgres", "17 passed, 3 failed"]
    assert code == 1
    # A failed check fails the run, its tests all passing.
    text, code = results.summary([Result("mypy", status="failed")], [passed], 1.0)
    assert (text.splitlines()[-2:], code) == (["FAILED: mypy", "10 passed, 0 failed"], 1)


def test_a_run_where_no_leg_ran_fails():
    text, code = results.summary([], [Result("mariadb"), Result("postgres")], 1.0)
    assert text.splitlines()[-3:] == [
        "[run.py] no leg ran: that is a failure",
        "FAILED: (no leg ran)",
        "0 passed, 0 failed",
    ]
    assert code == 1


# ----------------------------------------------------------------------------- the whole run


@pytest.fixture
def matrix(monkeypatch):
    """``run.main`` with the venvs, checks and servers faked, and each pytest run answered from
    ``outcomes`` (leg name -> (exit code, closing line)); the runs are listed in ``runs`` and the
    servers named in ``down`` do not answer."""
    venv = devenv.Venv(Path("/venv"), Path(sys.executable), "3.11.7", "5.2.1", mysql=True)
    outcomes: dict[str, tuple[int, str]] = {}
    runs: list[tuple[str, dict[str, str], list[str]]] = []
    down: set[str] = set()

    def fake_pytest(python, env, args, timeout, *, echo, cwd):
        wheel = cwd == devenv.WHEEL_STAGE
        (leg,) = (leg for leg in legs.LEGS if leg.url == env.get("DATABASE_URL") and leg.wheel == wheel)
        runs.append((leg.name, env, args))
        code, closing = outcomes.get(leg.name, (0, "1 passed in 0.1s"))
        return code, closing, [b"output\n"]

    def fake_probe(python, script):
        return (
            "refused"
            if ("MySQLdb" in script and "mariadb" in down) or ("psycopg" in script and "postgres" in down)
            else None
        )

    monkeypatch.setattr(prepare, "build_venvs", lambda legs_, deps: ({"default": venv, "dj6": venv}, {}))
    monkeypatch.setattr(prepare, "checks", lambda venvs, lint: [Result("ruff check", status="passed")])
    monkeypatch.setattr(prepare, "package_check", lambda builder, target: Result("package", status="passed"))
    monkeypatch.setattr(prepare, "probe", fake_probe)
    monkeypatch.setattr(prepare, "pooler", lambda ready, deps, stack: None)
    monkeypatch.setattr(process, "run_pytest", fake_pytest)
    return outcomes, runs, down


def last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.rstrip().splitlines()[-1]


def test_every_leg_in_its_parts(matrix, capsys):
    _, runs, _ = matrix
    assert run.main(["--jobs", "2", "--", "-k", "kernel"]) == 0
    # Two shares each, on PostgreSQL also the server restarts; the legs of named modules whole.
    parts = {"sqlite": 2, "postgres": 3, "mariadb": 2, "dj6-sqlite": 1, "dj6-postgres": 3, "pgbouncer": 1}
    assert sorted(name for name, _, _ in runs) == sorted(name for name, n in parts.items() for _ in range(n))
    assert last_line(capsys) == "12 passed, 0 failed"
    for name, env, args in runs:
        leg = LEG[name]
        assert args == ["-k", "kernel", *leg.tests]
        assert env["DJANGO_SETTINGS_MODULE"] == "tests.settings"
        assert env.items() >= dict(leg.env).items()


def test_one_lane_runs_every_leg_whole(matrix, capsys, monkeypatch):
    _, runs, _ = matrix
    # Whatever selected the tests of the run this one is part of.
    monkeypatch.setenv("DSCH_TEST_SHARD", "2")
    monkeypatch.setenv("DSCH_SERVER_RESTART_TESTS", "skip")
    monkeypatch.setenv("DSCH_PG_PREPARED", "1")
    assert run.main(["--jobs", "1"]) == 0
    assert [name for name, _, _ in runs] == list(legs.LEG_ORDER)
    for name, env, _ in runs:
        assert "DSCH_TEST_SHARD" not in env
        assert env.get("DSCH_SERVER_RESTART_TESTS") == dict(LEG[name].env).get("DSCH_SERVER_RESTART_TESTS")
        assert env.get("DSCH_PG_PREPARED") == dict(LEG[name].env).get("DSCH_PG_PREPARED")
    assert last_line(capsys) == "6 passed, 0 failed"


def test_a_failed_leg_fails_the_run(matrix, capsys):
    outcomes, _, _ = matrix
    outcomes["mariadb"] = (1, "2 failed, 40 passed in 9.0s")
    assert run.main(["--legs", "sqlite,mariadb", "--jobs", "1"]) == 1
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-2:] == ["FAILED: mariadb", "41 passed, 2 failed"]


@pytest.mark.parametrize(
    ("jobs", "outcome"),
    [
        ("1", (results.NO_TESTS, "no tests ran in 0.1s")),
        ("2", (results.NO_TESTS, "9 deselected in 0.1s")),
        ("1", (0, "3 deselected in 0.1s")),
    ],
)
def test_a_leg_that_runs_no_test_fails_the_run(matrix, capsys, jobs, outcome):
    outcomes, _, _ = matrix
    outcomes["postgres"] = outcome
    assert run.main(["--legs", "postgres", "--jobs", jobs, "--", "-k", "nothing"]) == 1
    assert last_line(capsys) == "0 passed, 0 failed"


def test_a_leg_whose_server_does_not_answer_is_skipped_or_with_require_all_fails(matrix, capsys):
    _, runs, down = matrix
    down.add("mariadb")
    assert run.main(["--legs", "sqlite,mariadb", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "skipped (mariadb at 127.0.0.1 does not answer: refused)" in out
    assert [name for name, _, _ in runs] == ["sqlite"]
    assert run.main(["--legs", "sqlite,mariadb", "--jobs", "1", "--require-all"]) == 1
    assert "FAILED: mariadb" in capsys.readouterr().out


def test_no_leg_able_to_run_fails_the_run(matrix, capsys):
    _, runs, down = matrix
    down.add("postgres")
    assert run.main(["--legs", "postgres,dj6-postgres"]) == 1
    assert not runs
    assert last_line(capsys) == "0 passed, 0 failed"


def test_no_wheel_no_django_6_legs(matrix, monkeypatch, capsys):
    _, runs, _ = matrix
    failed = Result("package", status="failed", why="twine check failed")
    monkeypatch.setattr(prepare, "package_check", lambda builder, target: failed)
    assert run.main(["--legs", "sqlite,dj6-sqlite", "--jobs", "1"]) == 1
    assert [name for name, _, _ in runs] == ["sqlite"]
    assert "failed (no wheel to test: twine check failed)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the venvs


def test_the_django_6_python_is_found_in_pyenv(tmp_path, monkeypatch):
    here = sys.version_info[:2]
    version_dir = tmp_path / "versions" / f"{here[0]}.{here[1]}.99" / "bin"
    version_dir.mkdir(parents=True)
    (version_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert devenv.find_python(((3, 99), here)) == version_dir / "python3"
    assert devenv.find_python(((3, 99),)) is None
    assert devenv.interpreter_version(sys.executable) == here
    assert devenv.interpreter_version(tmp_path / "nothing") is None


@pytest.mark.skipif(not Path(devenv.PGBOUNCER).exists(), reason="PgBouncer is not installed")
def test_pgbouncer_starts_and_stops(unused_port):
    with devenv.pgbouncer(unused_port) as why:
        assert why is None
        assert (
            prepare.probe(
                Path(sys.executable),
                f"import socket; socket.create_connection(('127.0.0.1', {unused_port}), 5)",
            )
            is None
        )
    assert (
        prepare.probe(
            Path(sys.executable), f"import socket; socket.create_connection(('127.0.0.1', {unused_port}), 5)"
        )
        is not None
    )


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_part_the_runner_cannot_run_fails_its_leg(matrix, monkeypatch, capsys):
    def no_python(*args, **kwargs):
        raise FileNotFoundError("/venv/bin/python")

    monkeypatch.setattr(process, "run_pytest", no_python)
    assert run.main(["--legs", "sqlite", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "failed (leg: the runner failed: FileNotFoundError('/venv/bin/python'))" in out


@pytest.mark.skipif(not (devenv.ROOT / devenv.PACKAGE).is_dir(), reason="run from the wheel's test stage")
def test_the_wheel_must_hold_every_file_of_the_package(tmp_path):
    import zipfile

    shipped = sorted(
        str(path.relative_to(devenv.ROOT))
        for path in (devenv.ROOT / devenv.PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    assert f"{devenv.PACKAGE}/__init__.py" in shipped
    whole, short = tmp_path / "whole.whl", tmp_path / "short.whl"
    for wheel, names in ((whole, shipped), (short, [n for n in shipped if not n.endswith("py.typed")])):
        with zipfile.ZipFile(wheel, "w") as archive:
            for name in names:
                archive.writestr(name, "")
    assert devenv.missing_from_wheel(whole) == []
    assert devenv.missing_from_wheel(short) == [f"{devenv.PACKAGE}/py.typed"]


def test_the_tests_are_staged_without_the_package(tmp_path):
    stage = devenv.stage_tests(tmp_path / "stage")
    assert (stage / "tests" / "test_runner.py").is_file()
    assert (stage / "example_project" / "run.py").is_file()
    assert {p.name for p in stage.iterdir()} == {"tests", "example_project", "pyproject.toml", "README.md"}
    assert not list(stage.rglob("__pycache__")) and not list(stage.rglob("*.sqlite3"))
    # Staged again, it starts afresh.
    (stage / "tests" / "stale.py").write_text("")
    assert not (devenv.stage_tests(stage) / "tests" / "stale.py").exists()
