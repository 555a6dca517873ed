"""The occurrence lifecycle table (``lifecycle.TRANSITIONS``) against the kernel, on the real
database: every (status, action) pair. An allowed pair must end in the table's status, write
exactly its columns, append its event and follow its fence and attempt rules; a refused one
must get the table's refusal and write nothing. And docs/lifecycle.md's diagram must be the one
the table generates."""

from __future__ import annotations

import ast
import importlib.util
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import InvalidState, LeaseLost, NotFound
from django_durable_scheduler.kernel import throttles, transitions
from django_durable_scheduler.models import (
    TERMINAL_STATUSES,
    Event,
    Job,
    Occurrence,
    OccurrenceStatus,
    ThrottleBucket,
)
from django_durable_scheduler.rules import lifecycle
from django_durable_scheduler.rules.authority import bound_revision
from django_durable_scheduler.rules.lifecycle import (
    TRANSITION,
    TRANSITIONS,
    Action,
    Attempt,
    Fence,
    Transition,
)

from ..conftest import CLOCK_START, ROOT
from ..writecheck import assigned_columns

OWNER = "worker-1"
LEASE = 600  # seconds; CLAIM looks 60 s later, while these leases still hold
FAR = timedelta(days=1)  # a pending row not due before every lease here has expired
KEY = "t"
UNIQUE_KEY = "u"  # the key of the rows a debounce is asked about


# --------------------------------------------------------------------------- the table itself


def test_every_action_has_one_transition():
    assert [t.action for t in TRANSITIONS] == list(Action)
    assert set(TRANSITION) == set(Action)


def test_every_status_is_reached_and_terminal_ones_are_left_only_by_a_new_occurrence():
    reached = {t.target for t in TRANSITIONS if t.target is not None}
    assert reached == set(OccurrenceStatus)
    for t in TRANSITIONS:
        if set(t.source) & set(TERMINAL_STATUSES):
            assert t.new_row and t.sets == (), t.action


def test_fence_and_attempt_rules_are_consistent():
    for t in TRANSITIONS:
        if t.fence is Fence.CHECKS:  # only a lease holder can be checked
            assert t.source == (OccurrenceStatus.RUNNING,) and t.otherwise == lifecycle.LEASE_LOST
        assert ("fence" in t.sets) == (t.fence is Fence.ADVANCES), t.action
        assert ("attempt" in t.sets) == (t.attempt is not Attempt.NONE), t.action
        assert ("status" in t.sets) == (t.target is not None and not t.new_row), t.action
        if t.target in TERMINAL_STATUSES and not t.new_row:
            assert "settled_at" in t.sets, t.action
        if t.target not in (None, OccurrenceStatus.RUNNING) and OccurrenceStatus.RUNNING in t.source:
            assert {"lease_owner", "lease_expires_at"} <= set(t.sets), t.action


def test_writes_sets_exactly_the_table_columns():
    now = CLOCK_START
    given: dict[str, Any] = {
        "result": None,
        "last_error": None,
        "available_at": now,
        "payload": None,
        "metadata": None,
        "receipt": None,
        "progress": None,
        "authority": {},
    }
    for t in TRANSITIONS:
        extra = {k: v for k, v in given.items() if k in t.sets}
        if t.action in (Action.CLAIM, Action.RECLAIM):
            extra.update(lease_owner=OWNER, lease_expires_at=now)
        if t.action in (Action.RENEW, Action.ABANDON):
            extra.update(lease_expires_at=now)
        derived = {column for column, _ in lifecycle.derived_by(t.action)}
        assert set(lifecycle.writes(t.action, now, **extra)) == set(t.sets) - derived, t.action
        assert set(transitions.writes(t.action, now, **extra)) == set(t.sets), t.action


def test_writes_refuses_a_column_the_table_does_not_set_or_cannot_decide():
    with pytest.raises(TypeError, match="does not set result"):
        lifecycle.writes(Action.CANCEL, CLOCK_START, last_error=None, result=1)
    with pytest.raises(TypeError, match="needs a value for last_error"):
        lifecycle.writes(Action.CANCEL, CLOCK_START)
    with pytest.raises(TypeError, match="not asked for"):  # a query picks the claim's rows
        lifecycle.refusal(Action.CLAIM, "occ-x", None)


# --------------------------------------------------------------------------- the rows, in every status


def _enqueue(
    clock, *, available_in: timedelta = timedelta(0), unique_key: str | None = None
) -> tuple[Occurrence, bool]:
    return kernel.enqueue(
        "job-a",
        scheduled_for=CLOCK_START,
        trigger_key=KEY,
        available_at=clock() + available_in,
        unique_key=unique_key,
    )


def _claim() -> Occurrence:
    (row,) = kernel.claim_batch(owner=OWNER, lease=LEASE, sweep_expired=False)
    return row


def _settle(row: Occurrence, outcome: str, **kwargs: Any) -> Occurrence:
    return kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome=outcome, **kwargs)


def make(status: OccurrenceStatus, clock, action: Action) -> Occurrence:
    """An occurrence in ``status``, shaped so that ``action``'s condition holds where the
    status allows it: not yet due for run_now and for the actions that wait for leases to
    expire (so those requests do not claim it instead), on its final attempt for expire."""
    waits = (Action.RUN_NOW, Action.RECLAIM, Action.EXPIRE, Action.EXPIRE_CANCELLED)
    later = FAR if action in waits else timedelta(0)
    key = UNIQUE_KEY if action is Action.DEBOUNCE else None
    if status == OccurrenceStatus.QUEUED:
        return _enqueue(clock, available_in=later, unique_key=key)[0]
    if status == OccurrenceStatus.CANCELLED:
        return kernel.cancel(_enqueue(clock, unique_key=key)[0].pk, reason="set up")
    _enqueue(clock, unique_key=key)
    row = _claim()
    if status == OccurrenceStatus.RUNNING:
        while action is Action.EXPIRE and row.attempt < row.max_attempts:
            _settle(row, "failed", error="again", retry_at=clock())
            row = _claim()
        if action in (Action.SETTLE_CANCELLED, Action.EXPIRE_CANCELLED):
            row = kernel.cancel(row.pk, reason="asked", requested_by="the walk")
        return row
    if status == OccurrenceStatus.RETRY_WAIT:
        return _settle(row, "failed", error="boom", retry_at=clock() + max(later, timedelta(seconds=30)))
    if status == OccurrenceStatus.SUCCEEDED:
        return _settle(row, "succeeded", result={"ok": True})
    return _settle(row, "failed", error="boom", retryable=False)


def request(action: Action, row: Occurrence | None, clock, *, fence: int | None = None) -> Any:
    """Ask the kernel for ``action`` on ``row`` through its public API."""
    pk = row.pk if row is not None else "occ-missing"
    held: dict[str, Any] = {"owner": OWNER, "fence": fence or max(row.fence if row is not None else 1, 1)}
    if action is Action.ENQUEUE:
        return _enqueue(clock)
    if action is Action.CLAIM:
        clock.advance(60)
        return kernel.claim_batch(owner=OWNER, lease=LEASE, limit=10, sweep_expired=False)
    if action is Action.RECLAIM:
        clock.advance(LEASE + 1)
        return kernel.claim_batch(owner=OWNER, lease=LEASE, limit=10, sweep_expired=False)
    if action is Action.EXPIRE:
        clock.advance(LEASE + 1)
        return kernel.dead_letter_expired()
    if action is Action.SETTLE_SUCCEEDED:
        return kernel.settle(pk, outcome="succeeded", result={"n": 1}, **held)
    if action is Action.SETTLE_RETRY:
        return kernel.settle(pk, outcome="failed", error="boom", **held)
    if action is Action.SETTLE_DEAD_LETTER:
        return kernel.settle(pk, outcome="failed", error="boom", retryable=False, **held)
    if action is Action.DENY:
        return kernel.deny(
            pk, code="SCHEDULER_AUTHORITY_PERMISSION_DENIED", reason="permission_denied", **held
        )
    if action is Action.DEFER:
        return kernel.defer(pk, until=clock() + timedelta(hours=1), **held)
    if action is Action.RELEASE:
        return kernel.release(pk, **held)
    if action is Action.CANCEL:
        return kernel.cancel(pk, reason="walked")
    if action is Action.REQUEST_CANCEL:  # cancel() naming the running attempt
        return kernel.cancel(pk, reason="walked", requested_by="the walk", fence=held["fence"])
    if action is Action.SETTLE_CANCELLED:  # a failure of an attempt asked to stop
        return kernel.settle(pk, outcome="failed", error="stopped", **held)
    if action is Action.EXPIRE_CANCELLED:
        clock.advance(LEASE + 1)
        return kernel.dead_letter_expired()
    if action is Action.RUN_NOW:
        return kernel.run_now(pk, reason="walked")
    if action is Action.RENEW:
        return kernel.renew(pk, lease=LEASE * 2, **held)
    if action is Action.RECORD_EXECUTION:
        return kernel.record_execution(pk, metadata={"step": 1}, **held)
    if action is Action.RECORD_PROGRESS:
        return kernel.record_progress(pk, done=3, total=10, note="walked", **held)
    if action is Action.ABANDON:  # its holder's supervisor saw it exit
        return kernel.abandon(OWNER)
    if action is Action.DEBOUNCE:  # another slot with the row's key
        return kernel.enqueue(
            "job-a",
            scheduled_for=CLOCK_START,
            trigger_key="d",
            payload={"n": 2},
            unique_key=UNIQUE_KEY,
            debounce=30,
        )
    if action is Action.THROTTLE:  # due, but its job's throttle has no token left
        clock.advance(60)
        Job.objects.filter(pk="job-a").update(
            throttle={"limit": 1, "period_ms": 3_600_000, "burst": 0, "key": None}
        )
        spent = clock() + timedelta(hours=1)
        scope = ["job", "job-a", ""]
        ThrottleBucket.objects.create(
            bucket_id=throttles.bucket_id(scope), scope=scope, tat=spent, horizon=spent, updated_at=clock()
        )
        return kernel.claim_batch(owner=OWNER, lease=LEASE, limit=10, sweep_expired=False)
    if action is Action.REBIND:  # the principal's first policy: its waiting rows move to it
        change = scheduler.change_policy(
            "user", "alice", capabilities=["reports.send"], window=3600, max_runs=10, max_units=10
        )
        return change.rebound_occurrences
    assert action is Action.RETRY_DEAD_LETTER
    return kernel.retry_dead_letter(pk)


# --------------------------------------------------------------------------- what a request wrote


def snapshot() -> tuple[list[Any], int]:
    return list(Occurrence.objects.order_by("pk").values()), Event.objects.count()


def updated_columns(queries: CaptureQueriesContext) -> set[str]:
    """The occurrence columns that the captured UPDATE statements set (an UPDATE anywhere in
    a statement, as a claim written as one statement may hold it)."""
    head = f"UPDATE {connection.ops.quote_name(Occurrence._meta.db_table)} SET "
    columns: set[str] = set()
    for query in queries.captured_queries:
        sql = query["sql"]
        for at in (m.end() for m in re.finditer(re.escape(head), sql)):
            columns |= set(assigned_columns(sql, at))
    return columns


def inserted_occurrence(queries: CaptureQueriesContext) -> bool:
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    # Anywhere in the statement: PostgreSQL's guarded enqueue inserts inside a WITH.
    return any(f"INSERT INTO {table} " in q["sql"] for q in queries.captured_queries)


PAIRS = [(None, Action.ENQUEUE)] + [(status, action) for action in Action for status in OccurrenceStatus]


def _allowed(status: OccurrenceStatus | None, transition: Transition) -> bool:
    return (status in transition.source) if status is not None else not transition.source


@pytest.mark.parametrize(
    ("status", "action"), PAIRS, ids=[f"{status or 'new'}-{action}" for status, action in PAIRS]
)
def test_every_status_and_action_against_the_table(job, clock, status, action):
    transition = TRANSITION[action]
    row = make(status, clock, action) if status is not None else None
    if (status, action) == (OccurrenceStatus.RUNNING, Action.CANCEL):
        # cancel() of a running occurrence asks it to stop: the request_cancel row.
        check_allowed(TRANSITION[Action.REQUEST_CANCEL], row, clock, action=action)
    elif _allowed(status, transition):
        check_allowed(transition, row, clock)
    else:
        check_refused(transition, row, clock)


def check_refused(transition: Transition, row: Occurrence | None, clock) -> None:
    assert row is not None
    before = snapshot()
    expected = {lifecycle.LEASE_LOST: LeaseLost, lifecycle.INVALID_STATE: InvalidState}.get(
        transition.otherwise
    )
    if expected is not None:
        with pytest.raises(expected) as caught:
            request(transition.action, row, clock)
        assert caught.value.code == transition.otherwise
    else:
        result = request(transition.action, row, clock)
        if transition.otherwise == lifecycle.DEDUPLICATED:
            assert result == (row, True)
        elif transition.otherwise == lifecycle.ENQUEUES_ANOTHER:
            # The row is left alone; a new occurrence (and only its event) is added instead.
            added, deduplicated = result
            assert not deduplicated and added.pk != row.pk and added.status == OccurrenceStatus.QUEUED
            rows, events = snapshot()
            assert [r for r in rows if r["occurrence_id"] != added.pk] == before[0]
            assert events == before[1] + 1
            return
        else:
            assert transition.otherwise == lifecycle.NOT_SELECTED
            assert result in ([], 0)
    assert snapshot() == before, "a refused request wrote"


def check_allowed(
    transition: Transition, row: Occurrence | None, clock, *, action: Action | None = None
) -> None:
    if transition.fence is Fence.CHECKS:
        # The fence rule: the same request at another fence is refused and writes nothing.
        assert row is not None
        before = snapshot()
        with pytest.raises(LeaseLost):
            request(transition.action, row, clock, fence=row.fence + 1)
        assert snapshot() == before
    if transition.fence is Fence.NAMES:
        # A request naming another attempt's fence is refused and writes nothing.
        assert row is not None
        before = snapshot()
        with pytest.raises(InvalidState):
            request(transition.action, row, clock, fence=row.fence + 1)
        assert snapshot() == before
    if row is not None:
        row = Occurrence.objects.get(pk=row.pk)
    last_event = Event.objects.order_by("-event_id").values_list("event_id", flat=True).first() or 0
    before_rows = snapshot()[0]
    with CaptureQueriesContext(connection) as queries:
        request(action or transition.action, row, clock)
    now = clock()
    events = list(Event.objects.filter(event_id__gt=last_event).order_by("event_id"))
    assert [e.event_type for e in events] == ([transition.event] if transition.event else [])
    if transition.new_row:
        assert inserted_occurrence(queries) and updated_columns(queries) == set()
        known = {r["occurrence_id"] for r in before_rows}
        (subject,) = Occurrence.objects.exclude(pk__in=known)
        assert subject.status == transition.target and subject.attempt == 0
        assert list(Occurrence.objects.filter(pk__in=known).order_by("pk").values()) == before_rows
    else:
        assert row is not None
        assert updated_columns(queries) == set(transition.sets)
        subject = Occurrence.objects.get(pk=row.pk)
        assert subject.status == (transition.target or row.status)
        step = {Attempt.USES: 1, Attempt.GIVES_BACK: -1, Attempt.NONE: 0}[transition.attempt]
        assert subject.attempt == row.attempt + step
        assert subject.fence == row.fence + (transition.fence is Fence.ADVANCES)
        assert subject.updated_at == now
        if "settled_at" in transition.sets:
            assert subject.settled_at == now
        if subject.status != OccurrenceStatus.RUNNING:
            assert subject.lease_owner is None and subject.lease_expires_at is None
        if transition.action is Action.REQUEST_CANCEL:  # the attempt it names is the last
            assert subject.cancel_requested_fence == row.fence and subject.max_attempts == row.attempt
            before = snapshot()
            request(transition.action, subject, clock)  # asked again: nothing more is written
            assert snapshot() == before
        if transition.action is Action.RENEW:  # extended, never shortened
            assert subject.lease_expires_at == now + timedelta(seconds=LEASE * 2)
        if transition.action is Action.REBIND:
            assert bound_revision(subject.authority) == 1 and bound_revision(row.authority) is None
        if transition.action is Action.RECORD_EXECUTION:  # the column not given is kept
            assert (subject.metadata, subject.receipt) == ({"step": 1}, row.receipt)
        if transition.action is Action.RECORD_PROGRESS:  # with the fence that reported it
            assert subject.progress == {"done": 3, "total": 10, "note": "walked", "fence": row.fence}
    assert all(event.occurrence_id == subject.pk for event in events)


def test_a_missing_occurrence_is_not_found_or_its_lease_lost(job, clock):
    for action in (Action.CANCEL, Action.RUN_NOW, Action.RETRY_DEAD_LETTER):
        with pytest.raises(NotFound):
            request(action, None, clock)
    with pytest.raises(LeaseLost) as caught:
        request(Action.SETTLE_SUCCEEDED, None, clock)
    assert caught.value.details["reason"] == "not_found"


def test_settle_many_writes_one_update_per_group_with_the_table_columns(job, clock):
    for key in ("a", "b", "c"):
        kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key=key)
    rows = kernel.claim_batch(owner=OWNER, lease=LEASE, limit=3, sweep_expired=False)
    with CaptureQueriesContext(connection) as queries:
        kernel.settle_many(
            [{"occurrence_id": r.pk, "fence": r.fence, "outcome": "succeeded"} for r in rows], owner=OWNER
        )
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    assert sum(f"UPDATE {table} " in q["sql"] for q in queries.captured_queries) == 1
    assert updated_columns(queries) == set(TRANSITION[Action.SETTLE_SUCCEEDED].sets)


# --------------------------------------------------------------------------- the picture


@pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="no docs/ beside these tests")
def test_design_doc_shows_the_lifecycle_the_table_generates():
    spec = importlib.util.spec_from_file_location("lifecycle_diagram", ROOT / "docs" / "lifecycle_diagram.py")
    assert spec is not None and spec.loader is not None
    diagram = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagram)
    written = diagram.current_block((ROOT / "docs" / "lifecycle.md").read_text(encoding="utf-8"))
    assert written == diagram.render(), (
        f"docs/lifecycle.md's lifecycle block differs from lifecycle.TRANSITIONS: run `{diagram.COMMAND}`"
    )


# --------------------------------------------------------------------------- every writer uses the table

PACKAGE = ROOT / "django_durable_scheduler"
# The table's helper that gives a transition's columns: an occurrence UPDATE takes its values
# from it, as ``**writes(...)`` or ``**values`` with ``values = writes(...)`` in the function.
TABLE_HELPER = "writes"


def _is_writes_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == TABLE_HELPER


class _WriterCheck(ast.NodeVisitor):
    """Finds, in one module, the writes of occurrence rows whose columns do not come from the
    lifecycle table: an ``update()`` of an occurrence queryset or a ``save(update_fields=...)``
    of an occurrence not given ``writes()``'s values, any ``bulk_update`` of occurrences, and
    UPDATE SQL written for the occurrence table."""

    def __init__(self, path: str, occurrence_querysets: set[str], occurrence_getters: set[str]) -> None:
        self.path = path
        self.querysets = occurrence_querysets  # functions returning QuerySet[Occurrence]
        self.getters = occurrence_getters  # functions returning an Occurrence
        self.problems: list[str] = []
        self.seen = 0  # occurrence writes judged
        self.scopes: list[dict[str, list[ast.AST]]] = [{}]  # name -> the values assigned to it
        self.occurrences: list[set[str]] = [set()]  # names bound to an occurrence or its queryset

    def _problem(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"{self.path}:{getattr(node, 'lineno', 0)}: {what}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        assigned: dict[str, list[ast.AST]] = {}
        occurrences: set[str] = set()
        for arg in [*node.args.args, *node.args.kwonlyargs]:
            if arg.annotation is not None and "Occurrence" in ast.unparse(arg.annotation):
                occurrences.add(arg.arg)
        for inner in ast.walk(node):
            if isinstance(inner, ast.Assign | ast.AnnAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                for target in targets:
                    if isinstance(target, ast.Name) and inner.value is not None:
                        assigned.setdefault(target.id, []).append(inner.value)
                        if self._is_occurrence(inner.value, occurrences):
                            occurrences.add(target.id)
        self.scopes.append(assigned)
        self.occurrences.append(occurrences)
        self.generic_visit(node)
        self.scopes.pop()
        self.occurrences.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def _root(self, node: ast.AST) -> ast.AST:
        while True:
            if isinstance(node, ast.Call):
                node = node.func
            elif isinstance(node, ast.Attribute | ast.Subscript):
                node = node.value
            else:
                return node

    def _is_occurrence(self, node: ast.AST, names: set[str] | None = None) -> bool:
        """Whether ``node`` is an occurrence or an occurrence queryset (by what it is built from)."""
        names = self.occurrences[-1] if names is None else names
        root = self._root(node)
        if isinstance(root, ast.Name) and (root.id == "Occurrence" or root.id in names):
            return True
        called = node.func if isinstance(node, ast.Call) else None
        while isinstance(called, ast.Attribute) and isinstance(called.value, ast.Call):
            called = called.value.func  # a chain on a call: look at the call that starts it
        name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
        return name in self.querysets or name in self.getters

    def _from_table(self, node: ast.AST) -> bool:
        if _is_writes_call(node):
            return True
        if isinstance(node, ast.Name):
            values = self.scopes[-1].get(node.id, [])
            return bool(values) and all(_is_writes_call(value) for value in values)
        return False

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr == "update" and self._is_occurrence(func.value):
                self._check_update(node)
            elif func.attr == "save" and self._is_occurrence(func.value):
                self._check_save(node)
            elif func.attr == "bulk_update" and self._is_occurrence(func.value):
                self._check_bulk_update(node)
        self.generic_visit(node)

    def _check_update(self, node: ast.Call) -> None:
        self.seen += 1
        plain = [k.arg for k in node.keywords if k.arg is not None]
        spread = [k.value for k in node.keywords if k.arg is None]
        if node.args or plain or len(spread) != 1 or not self._from_table(spread[0]):
            self._problem(
                node,
                f"an occurrence update() that does not take its columns from lifecycle.writes() "
                f"({ast.unparse(node)[:120]})",
            )

    def _check_bulk_update(self, node: ast.Call) -> None:
        self.seen += 1
        given = [k.value for k in node.keywords if k.arg == "fields"] + node.args[1:2]
        if not (given and self._listed_from_table(given[0])):
            self._problem(
                node,
                f"a bulk_update of occurrences whose fields are not lifecycle.writes()'s "
                f"({ast.unparse(node)[:120]})",
            )

    def _listed_from_table(self, fields: ast.AST) -> bool:
        """``list(values)``, ``values`` being ``writes()``'s."""
        return (
            isinstance(fields, ast.Call)
            and isinstance(fields.func, ast.Name)
            and fields.func.id == "list"
            and len(fields.args) == 1
            and self._from_table(fields.args[0])
        )

    def _check_save(self, node: ast.Call) -> None:
        self.seen += 1
        fields = next((k.value for k in node.keywords if k.arg == "update_fields"), None)
        if fields is None:
            return  # a full save: an insert of a new row (the enqueue's), not a transition
        if not self._listed_from_table(fields):
            self._problem(
                node,
                f"an occurrence save(update_fields=...) whose fields are not lifecycle.writes()'s "
                f"({ast.unparse(node)[:120]})",
            )

    def _check_bulk_update(self, node: ast.Call) -> None:
        """``bulk_update(rows, list(values))``, ``values`` from lifecycle.writes(): each row was
        given the table's values, one transition for all (the throttle's places)."""
        self.seen += 1
        fields = node.args[1] if len(node.args) > 1 else None
        ok = (
            isinstance(fields, ast.Call)
            and isinstance(fields.func, ast.Name)
            and fields.func.id == "list"
            and len(fields.args) == 1
            and self._from_table(fields.args[0])
        )
        if not ok:
            self._problem(node, "bulk_update of occurrences: their columns must come from lifecycle.writes()")

    def visit_Constant(self, node: ast.Constant) -> None:
        text = node.value if isinstance(node.value, str) else ""
        if re.search(r"\bUPDATE\b", text) and ("{occurrences}" in text or Occurrence._meta.db_table in text):
            self._problem(
                node, "UPDATE SQL written for the occurrence table: use lifecycle.writes() and the ORM"
            )


def _annotated_functions(tree: ast.AST, annotation: re.Pattern[str]) -> set[str]:
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.returns is not None
        and annotation.fullmatch(ast.unparse(node.returns))
    }


def check_occurrence_writers(sources: dict[str, str]) -> tuple[list[str], int]:
    """The problems found in ``sources`` (path -> text), and how many occurrence writes were
    looked at (so that a check that finds nothing to look at fails too)."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    querysets: set[str] = set()
    getters: set[str] = set()
    for tree in trees.values():
        querysets |= _annotated_functions(tree, re.compile(r"QuerySet\[Occurrence\]"))
        getters |= _annotated_functions(tree, re.compile(r"Occurrence( \| None)?"))
    problems: list[str] = []
    seen = 0
    for path, tree in trees.items():
        check = _WriterCheck(path, querysets, getters)
        check.visit(tree)
        problems += check.problems
        seen += check.seen
    return problems, seen


def _package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
    }


def test_every_occurrence_write_takes_its_columns_from_the_table():
    problems, seen = check_occurrence_writers(_package_sources())
    assert not problems, "occurrence writes outside the lifecycle table:\n" + "\n".join(problems)
    # claim, settle (grouped), release/defer, deny, the sweep, renew, record_execution, cancel,
    # request_cancel, run_now, debounce and rebind: found, so judged (new rows are inserted by
    # dialect.insert and db.guarded, not by a save the check would see).
    assert seen >= 12, f"the check looked at only {seen} occurrence writes"


def test_the_writer_check_names_what_it_refuses():
    bad = """
from .models import Occurrence
from .rules.lifecycle import Action, writes


def claim(pk, now, owner):
    Occurrence.objects.filter(pk=pk).update(status="running", lease_owner=owner)


def settle(occurrence: Occurrence, now):
    values = {"status": "succeeded"}
    occurrence.save(update_fields=["status", "updated_at"])
    Occurrence.objects.filter(pk=occurrence.pk).update(**values)


def fine(occurrence: Occurrence, now):
    values = writes(Action.RUN_NOW, now, available_at=now)
    occurrence.save(update_fields=list(values))
    Occurrence.objects.filter(pk=occurrence.pk).update(**writes(Action.RUN_NOW, now, available_at=now))


SQL = "UPDATE {occurrences} SET status = 'running'"


def rebind(rows: list[Occurrence], now):
    Occurrence.objects.bulk_update(rows, ["authority"])
    values = writes(Action.REBIND, now, authority={})
    Occurrence.objects.bulk_update(rows, list(values))
"""
    problems, seen = check_occurrence_writers({"pkg/bad.py": bad})
    assert seen == 7
    assert [p.split(": ", 1)[0] for p in problems] == [
        "pkg/bad.py:7",
        "pkg/bad.py:12",
        "pkg/bad.py:13",
        "pkg/bad.py:22",
        "pkg/bad.py:26",
    ], problems
    assert "update() that does not take its columns from lifecycle.writes()" in problems[0]
