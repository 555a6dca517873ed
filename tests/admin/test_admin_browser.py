"""The policy admin in a real browser (``tests/browser.py``) against pytest-django's live server."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import django
import pytest
from django.db import connection

from django_durable_scheduler import kernel
from django_durable_scheduler.kernel.authority import policies
from django_durable_scheduler.models import AuthorityPolicy, Occurrence

from ..browser import TIMEOUT_MS, skip_unless_browser
from ..conftest import authority_for

# Screenshots for people to look at: CI keeps .ci/artifacts (tests/run.py sets DSCH_ARTIFACTS).
ARTIFACTS = Path(
    os.environ.get("DSCH_ARTIFACTS") or Path(__file__).resolve().parent.parent.parent / ".ci" / "artifacts"
)


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot as ``dj<major>-<name>.png`` (a leg per Django version)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"dj{django.VERSION[0]}-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


pytestmark = [
    skip_unless_browser(),
    # The admin's pages are the same on every database, and its views and actions are tested
    # on every leg without a browser (test_admin.py): the browser runs on the SQLite legs.
    pytest.mark.skipif(connection.vendor != "sqlite", reason="browser tests run on the SQLite legs"),
    pytest.mark.slow,
]

ADMIN_STATIC = Path(__import__("django.contrib.admin").contrib.admin.__file__).parent / "static"


def _serve_static(route) -> None:
    # The test settings have no staticfiles app; serve the admin's CSS/JS from Django itself
    # so that pages (and the screenshot) look as they do in production.
    path = route.request.url.split("/static/", 1)[1].split("?", 1)[0]
    file = (ADMIN_STATIC / path).resolve()
    if ADMIN_STATIC in file.parents and file.is_file():
        route.fulfill(path=str(file))
    else:
        route.fulfill(status=404, body="")


@pytest.fixture
def new_context(browser, live_server):
    contexts = []

    def make():
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(TIMEOUT_MS)
        context.route("**/static/**", _serve_static)
        contexts.append(context)
        return context

    yield make
    for context in contexts:
        context.close()


def login(context, live_server, username: str, password: str = "pw"):
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return page


@pytest.fixture
def policy(transactional_db):
    return policies.set_policy(
        "user",
        "alice",
        capabilities=["reports.read", "reports.send"],
        window=timedelta(hours=1),
        max_runs=10,
        max_units=20,
        changed_by="setup",
    )


@pytest.fixture
def admin_user(transactional_db, django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")


def change_url(live_server, policy: AuthorityPolicy) -> str:
    return f"{live_server.url}/admin/durable_scheduler/authoritypolicy/{policy.pk}/change/"


def field_errors(page, name: str) -> str:
    """The error list Django's admin shows for one field."""
    return page.locator(f"#id_{name}_error").inner_text()


def test_staff_edits_a_policy(new_context, live_server, policy, admin_user):
    kernel.create_job("job-read", "reports.read", authority=authority_for("alice", "reports.read"))
    page = login(new_context(), live_server, "root")
    page.goto(change_url(live_server, policy))
    assert page.locator("#id_capabilities").input_value() == "reports.read\nreports.send"
    assert page.locator("#policy-usage").inner_text().count("0 of") == 2

    page.fill("#id_capabilities", "reports.send\nreports.archive\n")
    page.fill("#id_window_value", "2")
    page.select_option("#id_window_unit", "days")
    page.fill("#id_max_runs", "500")
    # Preview first: nothing is saved, the page says what would go stale.
    page.click("input[name=_preview]")
    page.wait_for_load_state()
    assert "1 job and" in page.locator("#policy-preview").inner_text()
    assert "would be left stale" in page.locator("#policy-preview").inner_text()
    assert page.locator("#id_max_runs").input_value() == "500"
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1

    page.click("input[name=_continue]")
    page.wait_for_load_state()
    assert "was changed successfully" in page.locator(".messagelist").inner_text()
    saved = AuthorityPolicy.objects.get(pk=policy.pk)
    assert saved.revision == 2
    assert saved.capabilities == ["reports.archive", "reports.send"]
    assert (saved.window_ms, saved.max_runs, saved.max_units) == (2 * 86_400_000, 500, 20)
    assert policies.policy_history("user", "alice")[0].changed_by == "root"

    history = page.locator("#policy-history").inner_text()
    assert "reports.archive" in history and "reports.read" in history
    assert "max runs: 10 → 500" in history
    assert "window: 1 hour → 2 days" in history
    screenshot(page, "admin-policy")


def test_concurrent_edit_shows_a_conflict(new_context, live_server, policy, admin_user):
    first = login(new_context(), live_server, "root")
    second = login(new_context(), live_server, "root")
    first.goto(change_url(live_server, policy))
    second.goto(change_url(live_server, policy))

    second.fill("#id_max_runs", "77")
    second.click("input[name=_save]")
    second.wait_for_url("**/authoritypolicy/")

    first.fill("#id_capabilities", "reports.read")
    first.click("input[name=_save]")
    first.wait_for_load_state()
    errors = first.locator(".errornote + ul.errorlist, ul.errorlist.nonfield").first.inner_text()
    assert "This policy was changed by someone else (now revision 2) since you opened it" in errors
    assert "reload to see their change" in errors
    # The second user's change is intact; the first one's was not written.
    saved = AuthorityPolicy.objects.get(pk=policy.pk)
    assert (saved.revision, saved.max_runs) == (2, 77)
    assert saved.capabilities == ["reports.read", "reports.send"]
    # After a reload, the first user sees the new revision and can save.
    first.goto(change_url(live_server, policy))
    assert first.locator("#id_max_runs").input_value() == "77"
    first.fill("#id_capabilities", "reports.read")
    first.click("input[name=_save]")
    first.wait_for_url("**/authoritypolicy/")
    saved.refresh_from_db()
    assert (saved.revision, saved.capabilities, saved.max_runs) == (3, ["reports.read"], 77)


def test_invalid_input_shows_field_errors(new_context, live_server, policy, admin_user):
    page = login(new_context(), live_server, "root")
    url = change_url(live_server, policy)

    page.goto(url)
    page.fill("#id_capabilities", "reports.send\n*")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert "Line 2: '*' is not allowed" in field_errors(page, "capabilities")

    page.goto(url)
    page.fill("#id_capabilities", "")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert "Enter at least one capability" in field_errors(page, "capabilities")

    page.goto(url)
    # A control character cannot be typed; set it the way a script or a paste would.
    page.eval_on_selector("#id_capabilities", "el => { el.value = 'reports.send\\nbad\\u0001cap'; }")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert "Line 2: must not contain control characters (found U+0001)" in field_errors(page, "capabilities")

    page.goto(url)
    page.fill("#id_max_runs", "0")
    page.fill("#id_max_units", "1000001")
    page.fill("#id_window_value", "32")
    page.select_option("#id_window_unit", "days")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert "greater than or equal to 1" in field_errors(page, "max_runs")
    assert "less than or equal to 1000000" in field_errors(page, "max_units")
    assert "between 1 minute and 31 days" in field_errors(page, "window_value")
    assert "Please correct the errors below." in page.locator(".errornote").inner_text()

    saved = AuthorityPolicy.objects.get(pk=policy.pk)
    assert (saved.revision, saved.max_runs, saved.capabilities) == (1, 10, ["reports.read", "reports.send"])


def test_user_without_change_permission_cannot_edit(new_context, live_server, policy, django_user_model):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_authoritypolicy"))
    page = login(new_context(), live_server, "viewer")
    page.goto(change_url(live_server, policy))
    assert page.locator("h1").inner_text() == "View authority policy"
    assert page.locator("textarea, input[name=_save], input[name=_preview]").count() == 0
    assert "reports.send" in page.locator("#content-main").inner_text()
    # A forged POST from this session is refused.
    status = page.evaluate(
        """async () => {
            const body = new FormData();
            body.append('csrfmiddlewaretoken', document.querySelector('[name=csrfmiddlewaretoken]').value);
            body.append('capabilities', 'x'); body.append('window_value', '1');
            body.append('window_unit', 'hours'); body.append('max_runs', '1');
            body.append('max_units', '1'); body.append('loaded_revision', '1');
            return (await fetch(location.href, {method: 'POST', body})).status;
        }"""
    )
    assert status == 403
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1


def test_the_dashboard(new_context, live_server, admin_user, clock):
    from .test_dashboard import run

    kernel.create_job("mail", "mail.send")
    kernel.create_job("sync", "crm.sync")
    run("mail", "succeeded", clock, n=5)
    run("sync", "failed", clock, n=2)
    page = login(new_context(), live_server, "root")
    page.goto(f"{live_server.url}/admin/")
    page.click("text=Dashboard")
    page.wait_for_selector("#dsch-outcomes-1 svg")
    assert page.locator("#dsch-outcomes-1 rect.dsch-succeeded").count() == 1
    assert page.locator("#dsch-outcomes-1 rect.dsch-dead_letter").count() == 1
    assert "the printer is on fire" in page.inner_text("#dsch-dead-letters")
    screenshot(page, "admin-dashboard")


def week_of_history(clock) -> int:
    """A week of runs of two kinds, some late, some failed, some retried, some with a
    follow-up, a batch now and then, and a backlog at the end; how many six-hour buckets had
    runs that succeeded."""
    import random

    from django_durable_scheduler.admin import dashboard_series

    rng = random.Random(11)
    kernel.create_job("mail", "mail.send", max_attempts=2, retry_base_delay=1, retry_max_delay=1)
    kernel.create_job("sync", "crm.sync")
    end = clock()
    clock.advance(days=-7)
    n = 0
    while clock() < end - timedelta(minutes=30):
        n += 1
        clock.advance(minutes=rng.uniform(5, 60))
        job_id = rng.choice(["mail", "mail", "sync"])
        then = ["sync"] if rng.random() < 0.1 else None
        if n % 60 == 0:
            kernel.enqueue_batch(
                job_id, [{"scheduled_for": clock(), "trigger_key": f"b{n}"}], callback="sync"
            )
        kernel.enqueue(job_id, scheduled_for=clock(), trigger_key=f"t{n}", then=then)
        clock.advance(rng.expovariate(1 / 8) * (20 if 3 <= clock().weekday() <= 4 else 1))
        while (row := kernel.claim(owner="w1", lease=600)) is not None:
            failed = rng.random() < 0.12
            kernel.settle(row.pk, owner="w1", fence=row.fence, outcome="failed" if failed else "succeeded")
    for i in range(6):
        kernel.enqueue("sync", scheduled_for=clock(), trigger_key=f"waiting{i}")
        clock.advance(minutes=4)
    clock.set(end)
    week = dashboard_series.RANGES["week"]
    first = dashboard_series.bucket_starts(week, end)[0]
    settled = Occurrence.objects.filter(status="succeeded", settled_at__gte=first)
    return len(
        {dashboard_series._floor(at, week.step) for at in settled.values_list("settled_at", flat=True)}
    )


def test_the_dashboard_over_a_week(new_context, live_server, admin_user, clock):
    """Charts over time: a bar per six hours, a point per bucket with runs, the range and kind
    selectors; the screenshot is the one in docs/operations.md (docs/images/dashboard.png)."""
    buckets_with_runs = week_of_history(clock)
    page = login(new_context(), live_server, "root")
    page.goto(f"{live_server.url}/admin/durable_scheduler/schedulerdashboard/?range=week")
    page.wait_for_selector("#dsch-chart-throughput svg")
    assert page.locator("#dsch-chart-throughput g.dsch-bucket").count() == 28
    assert page.locator("#dsch-chart-throughput rect.dsch-succeeded").count() == buckets_with_runs
    assert page.locator("#dsch-chart-failures rect.dsch-retried").count() > 0
    assert page.locator("#dsch-chart-lag g.dsch-p95 circle").count() == buckets_with_runs
    assert page.locator("#dsch-chart-depth circle").count() == 28
    assert page.locator("#dsch-chart-chains rect.dsch-follow_ups").count() > 0
    assert page.locator("#dsch-chart-chains rect.dsch-batches").count() > 0
    screenshot(page, "admin-dashboard-week")
    page.select_option("#dsch-picker select", "crm.sync")
    page.click("#dsch-picker button")
    page.wait_for_url("**kind=crm.sync**")
    assert page.locator("#dsch-chart-throughput g.dsch-bucket").count() == 28
    page.click("#dsch-picker >> text=hour")
    page.wait_for_url("**range=hour**kind=crm.sync**")
    assert page.locator("#dsch-chart-throughput g.dsch-bucket").count() == 12
    assert page.locator("#dsch-chart-depth circle").count() == 12
    page.click("#dsch-picker >> text=day")
    page.wait_for_url("**range=day**")
    assert page.locator("#dsch-chart-throughput g.dsch-bucket").count() == 24


def test_operations_on_everything_a_filter_matches(new_context, live_server, admin_user, clock):
    """Queued occurrences filtered, all of them selected across pages, cancelled after the
    confirmation page; then a job's page with its recent occurrences."""
    from .test_dashboard import run

    kernel.create_job("mail", "mail.send")
    run("mail", "succeeded", clock, n=2)
    run("mail", "failed", clock, n=1)
    for n in range(120):  # more than a list page (100)
        kernel.enqueue("mail", scheduled_for=clock(), trigger_key=f"q{n}")
    page = login(new_context(), live_server, "root")
    page.goto(f"{live_server.url}/admin/durable_scheduler/occurrence/?status__exact=queued")
    page.check("#action-toggle")
    page.click("text=Select all 120")
    page.select_option("select[name=action]", "cancel_occurrences")
    page.click("button[name=index]")
    page.wait_for_selector(".dsch-confirm-summary")
    summary = " ".join(page.inner_text(".dsch-confirm-summary").split())
    assert (
        "Every occurrence the list's filters match: 120 occurrences selected. 120 will be cancelled"
        in summary
    )
    screenshot(page, "admin-confirm-cancel")
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_selector(".messagelist")
    assert "Cancelled or asked to stop: 120 occurrences." in page.inner_text(".messagelist")
    screenshot(page, "admin-cancelled")
    assert Occurrence.objects.filter(status="cancelled").count() == 120
    assert Occurrence.objects.filter(status="succeeded").count() == 2

    page.goto(f"{live_server.url}/admin/durable_scheduler/job/mail/change/")
    recent = page.locator(".dsch-recent tr")
    assert recent.count() == 1 + 20  # the header and the 20 newest: the cancelled ones
    assert "cancelled in the admin by root" in recent.nth(1).inner_text()
    screenshot(page, "admin-job-recent")


def test_a_task_schedule_made_in_the_admin(new_context, live_server, admin_user):
    """A staff user gives a task a cron schedule with the form: a task path that is no task
    is refused on its field, then the right one is saved and listed in the task's terms."""
    from django_durable_scheduler.models import Job

    page = login(new_context(), live_server, "root")
    page.click("text=Task schedules")
    page.click("text=Add task schedule")
    page.fill("#id_name", "weekday-report")
    page.fill("#id_task", "tests.testapp.djtasks.nowhere")
    page.fill("#id_trigger", '{"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}')
    page.fill("#id_args", "[2]")
    page.fill("#id_kwargs", '{"b": 3}')
    page.click("input[name=_save]")
    assert "nothing to import" in field_errors(page, "task")
    screenshot(page, "admin-task-schedule-error")
    assert not Job.objects.exists()
    page.fill("#id_task", "tests.testapp.djtasks.add")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist")
    assert 'The task schedule "task-schedule:default:weekday-report" was added' in page.inner_text(
        ".messagelist"
    ).replace("\u201c", '"').replace("\u201d", '"')
    row = page.locator("#result_list tbody tr").first
    assert "weekday-report" in row.inner_text() and "tests.testapp.djtasks.add" in row.inner_text()
    screenshot(page, "admin-task-schedules")
    job = Job.objects.get()
    assert job.payload["args"] == [2] and job.trigger["cron"] == "0 9 * * 1-5"


# The WCAG 2 contrast ratio of two computed CSS colours (rgb() or rgba(), opaque).
CONTRAST_JS = """([fg, bg]) => {
    const luminance = (css) => {
        const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map(Number).map((c) => {
            c /= 255;
            return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
        });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    const [a, b] = [luminance(fg), luminance(bg)].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05);
}"""


@pytest.mark.parametrize(
    ("theme", "scheme"),
    [("light", "light"), ("dark", "light"), ("auto", "dark"), ("auto", "light")],
)
def test_the_all_batches_link_is_readable_on_its_heading(new_context, live_server, admin_user, theme, scheme):
    """The link in the heading of *Batches in progress* against the heading's own background,
    in the theme the toggle sets (``data-theme``) and the one the system prefers: at least
    4.5:1 (WCAG AA for text)."""
    page = login(new_context(), live_server, "root")
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{live_server.url}/admin/durable_scheduler/schedulerdashboard/")
    # As the theme toggle does; then wait out the links' colour transition.
    page.evaluate(
        """async (theme) => {
            document.documentElement.dataset.theme = theme;
            await Promise.all(document.getAnimations().map((a) => a.finished));
        }""",
        theme,
    )
    link = page.locator("#dsch-batches h2 a")
    assert link.inner_text() == "all batches"
    colours = [
        link.evaluate("a => getComputedStyle(a).color"),
        page.locator("#dsch-batches h2").evaluate("h => getComputedStyle(h).backgroundColor"),
    ]
    assert "rgba(0, 0, 0, 0)" not in colours, colours  # the heading has a background of its own
    ratio = page.evaluate(CONTRAST_JS, colours)
    assert ratio >= 4.5, (theme, scheme, colours, round(ratio, 2))


def test_progress_in_the_admin(new_context, live_server, admin_user, clock):
    """A running handler's progress, as Chromium renders it: a bar with its value on the
    occurrence's page, in the list and beside its kind on the dashboard."""
    from django_durable_scheduler.models import WorkerHeartbeat

    kernel.create_job("import", "rows.import")
    occurrence, _ = kernel.enqueue("import", scheduled_for=clock(), trigger_key="p")
    held = kernel.claim(owner="w1", lease=3600)
    assert held is not None and held.pk == occurrence.pk
    kernel.record_progress(held.pk, owner="w1", fence=held.fence, done=45, total=60, note="rows copied")
    WorkerHeartbeat.objects.create(
        worker_id="w1", hostname="host", pid=1, concurrency=4, started_at=clock(), last_seen_at=clock()
    )
    page = login(new_context(), live_server, "root")
    page.goto(f"{live_server.url}/admin/durable_scheduler/occurrence/{held.pk}/change/")
    bar = page.locator(".field-progress_summary progress")
    assert bar.evaluate("el => [el.value, el.max, el.position]") == [45, 60, 0.75]
    assert bar.bounding_box()["width"] > 0  # drawn, not only in the markup
    assert "45 / 60 (75%) rows copied" in page.inner_text(".field-progress_summary")
    screenshot(page, "admin-occurrence-progress")
    page.goto(f"{live_server.url}/admin/durable_scheduler/occurrence/?status__exact=running")
    assert "45 / 60 (75%) rows copied" in page.inner_text("td.field-progress_summary")
    page.goto(f"{live_server.url}/admin/durable_scheduler/schedulerdashboard/")
    workers = page.locator("#dsch-workers")
    assert workers.locator("progress").evaluate("el => el.position") == 0.75
    assert " ".join(workers.inner_text().split()).endswith(
        "w1 0 s ago rows.import 45 / 60 (75%) rows copied cancel"
    )
    screenshot(page, "admin-dashboard-progress")
