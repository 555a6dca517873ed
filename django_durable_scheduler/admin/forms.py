"""Admin forms. They validate what a person typed, then write through the public API
(``policies.set_policy``, ``kernel.create_job``/``update_job``), never ``Model.save()``.

The write happens inside ``is_valid()``: a compare-and-set can only be checked by attempting
it, and a lost race has to come back as a form error (shown on the re-rendered page, with
nothing written), not as a server error after validation has passed. The admin view wraps
the whole request in a transaction, so an error raised later still rolls the write back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError

from .. import kernel
from ..exceptions import (
    AuthorityPolicyConflict,
    Conflict,
    InvalidArgument,
    NotFound,
    RevisionConflict,
    SchedulerError,
)
from ..kernel.authority import policies
from ..models import AuthorityPolicy, Job, TaskSchedule
from ..rules.authority import MAX_BUDGET, MAX_CAPABILITIES, MAX_WINDOW_MS, MIN_WINDOW_MS
from ..rules.validation import MAX_CONCURRENCY, MAX_IDENTIFIER_LENGTH, normalize_identifier
from .fields import JsonTextField, ThrottleField

WINDOW_UNITS: dict[str, int] = {"minutes": 60, "hours": 3600, "days": 86_400}
_SECONDS_UNIT = ("seconds", "seconds")


def split_window(window_ms: int) -> tuple[int, str]:
    """The largest unit that expresses ``window_ms`` exactly: (3, "hours") for 3 h.

    A window that is not whole minutes (possible through the API) is shown in seconds."""
    seconds, remainder = divmod(window_ms, 1000)
    for unit in ("days", "hours", "minutes"):
        size = WINDOW_UNITS[unit]
        if not remainder and seconds and seconds % size == 0:
            return seconds // size, unit
    return max(1, round(window_ms / 1000)), "seconds"


def describe_window(window_ms: int) -> str:
    """``24 hours`` -> ``1 day``; ``90 minutes`` -> ``90 minutes``."""
    amount, unit = split_window(window_ms)
    return f"{amount} {unit[:-1] if amount == 1 else unit}"


def parse_capability_lines(text: str) -> tuple[list[str], list[int]]:
    """Capabilities from a textarea, one per line: (capabilities in first-seen order, their
    line numbers). Blank lines are skipped; every other line must be an exact identifier."""
    errors: list[ValidationError] = []
    capabilities: list[str] = []
    lines: list[int] = []
    seen: set[str] = set()
    # Browsers submit CRLF; any other control character left in a line is an error below.
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            capability = normalize_identifier(raw, "capability")
        except InvalidArgument as exc:
            reason = str(exc).removeprefix("capability: ")
            errors.append(ValidationError(f"Line {number}: {reason}.", code="invalid"))
            continue
        if capability == "*":
            errors.append(
                ValidationError(
                    f"Line {number}: '*' is not allowed; list each capability exactly.", code="wildcard"
                )
            )
            continue
        if capability not in seen:
            seen.add(capability)
            capabilities.append(capability)
            lines.append(number)
    if errors:
        raise ValidationError(errors)
    if not capabilities:
        raise ValidationError("Enter at least one capability, one per line.", code="required")
    if len(capabilities) > MAX_CAPABILITIES:
        raise ValidationError(
            f"At most {MAX_CAPABILITIES} capabilities (got {len(capabilities)}).", code="too_many"
        )
    return capabilities, lines


class CapabilitiesField(forms.CharField):
    """One capability per line; cleans to a list. The line numbers of the last clean are kept
    on ``lines``, so that an error the API reports for ``capabilities[i]`` names the line."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 8, "cols": 60, "spellcheck": "false"}))
        # Leading/trailing whitespace is per line; stripping the whole value would shift
        # the line numbers of the error messages.
        kwargs.setdefault("strip", False)
        super().__init__(**kwargs)
        self.lines: list[int] = []

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return "\n".join(str(item) for item in value)
        return value

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return []
        capabilities, self.lines = parse_capability_lines(text)
        return capabilities

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            new = sorted(self.to_python(data))
        except ValidationError:
            return True
        return sorted(initial or []) != new

    def validate(self, value: Any) -> None:
        if self.required and not value:
            raise ValidationError("Enter at least one capability, one per line.", code="required")


def _form_field(api_field: str, form: forms.BaseForm, aliases: dict[str, str] | None = None) -> str | None:
    """The form field an API error's ``details["field"]`` belongs to (``trigger.cron`` ->
    ``trigger``), or None for a form-level error."""
    head = api_field.split(".", 1)[0].split("[", 1)[0]
    head = (aliases or {}).get(head, head)
    return head if head in form.fields and not form.fields[head].disabled else None


class _ApiForm(forms.ModelForm):  # type: ignore[type-arg]
    """Shared by the admin forms: a hidden revision, a username, and the write in ``is_valid``."""

    # Set by the admin on the class it builds for one request.
    changed_by: ClassVar[str | None] = None
    preview_only: ClassVar[bool] = False

    loaded_revision = forms.IntegerField(widget=forms.HiddenInput, min_value=0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved: Any = None
        self._written = False
        # Initial values also on a bound form: changed_data (the admin log's change message,
        # JobForm's changes) compares the submitted values with them.
        self.initial["loaded_revision"] = 0 if self.adding else self.instance.revision

    @property
    def adding(self) -> bool:
        # Not ``pk is None``: a job's primary key is a CharField, "" on a new instance.
        return bool(self.instance._state.adding)

    def is_valid(self) -> bool:
        if not super().is_valid():
            return False
        if self.preview_only:
            # Re-render with the preview of the typed values; the page shows no error.
            return False
        if not self._written:
            self._written = True
            try:
                self.saved = self.write()
            except SchedulerError as exc:
                self.add_api_error(exc)
                return False
        return not self.errors

    def write(self) -> Any:
        raise NotImplementedError

    def add_api_error(self, exc: SchedulerError) -> None:
        raise NotImplementedError

    def _post_clean(self) -> None:
        """No model validation, and the instance is left as loaded: the model's checks would
        judge a half-built instance (the API fills the rest in), and the API validates
        everything when it writes; its errors come back as field errors."""


# --------------------------------------------------------------------------- policies


class AuthorityPolicyForm(_ApiForm):
    """A policy as a person edits it: capabilities one per line, the window as a number and
    a unit, budgets, enabled. Saved with ``policies.set_policy`` against the loaded revision."""

    capabilities = CapabilitiesField(
        label="Capabilities",
        help_text="One exact capability per line (for example reports.send). '*' is not allowed.",
    )
    window_value = forms.IntegerField(
        label="Window",
        min_value=1,
        help_text="Budgets reset at the start of every window (1 minute to 31 days).",
    )
    window_unit = forms.ChoiceField(
        label="Window unit", choices=[(unit, unit) for unit in WINDOW_UNITS], initial="hours"
    )
    max_runs = forms.IntegerField(
        label="Max runs per window",
        required=False,
        min_value=1,
        max_value=MAX_BUDGET,
        help_text="Empty: no limit. With neither limit, runs are not charged.",
    )
    max_units = forms.IntegerField(
        label="Max units per window",
        required=False,
        min_value=1,
        max_value=MAX_BUDGET,
        help_text="Empty: no limit.",
    )
    max_running = forms.IntegerField(
        label="Max running at once",
        required=False,
        min_value=1,
        max_value=MAX_CONCURRENCY,
        help_text="How many of the principal's occurrences may run at once on all workers (empty: no cap).",
    )
    throttle = ThrottleField(
        label="Throttle",
        keyed=False,
        help_text='How fast the principal\'s occurrences may start on all workers: {"limit": 100, '
        '"period": 5, "burst": 20} (period in seconds; no key; empty: none). Work over the rate waits.',
    )

    class Meta:
        model = AuthorityPolicy
        fields = ["principal_type", "principal_id", "enabled", "max_runs", "max_units", "max_running"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        instance = self.instance
        if not self.adding:
            amount, unit = split_window(instance.window_ms)
            if unit == "seconds":
                # Set through the API: offer seconds so the form can show (and keep) it.
                unit_field = self.fields["window_unit"]
                assert isinstance(unit_field, forms.ChoiceField)
                unit_field.choices = [_SECONDS_UNIT, *((u, u) for u in WINDOW_UNITS)]
            self.initial.update(
                capabilities=list(instance.capabilities),
                window_value=amount,
                window_unit=unit,
                throttle=instance.throttle,
            )
        else:
            self.initial.setdefault("window_value", 24)
            self.initial.setdefault("window_unit", "hours")
        for name in ("principal_type", "principal_id"):
            if name in self.fields:
                self.fields[name].help_text = "Who the policy applies to (the jobs' authority.principal)."

    def clean(self) -> None:
        super().clean()
        data = self.cleaned_data
        value, unit = data.get("window_value"), data.get("window_unit")
        if value is not None and unit:
            seconds = value * (1 if unit == "seconds" else WINDOW_UNITS[unit])
            if not MIN_WINDOW_MS <= seconds * 1000 <= MAX_WINDOW_MS:
                self.add_error("window_value", "The window must be between 1 minute and 31 days.")
            else:
                data["window_seconds"] = seconds

    @property
    def principal(self) -> tuple[str, str]:
        if not self.adding:
            return self.instance.principal_type, self.instance.principal_id
        return self.cleaned_data["principal_type"], self.cleaned_data["principal_id"]

    def write(self) -> AuthorityPolicy:
        data = self.cleaned_data
        principal_type, principal_id = self.principal
        return policies.set_policy(
            principal_type,
            principal_id,
            capabilities=data["capabilities"],
            window=timedelta(seconds=data["window_seconds"]),
            max_runs=data.get("max_runs"),
            max_units=data.get("max_units"),
            max_running=data.get("max_running"),
            throttle=data.get("throttle"),
            enabled=data["enabled"],
            expected_revision=data["loaded_revision"],
            changed_by=self.changed_by,
        )

    def add_api_error(self, exc: SchedulerError) -> None:
        if isinstance(exc, AuthorityPolicyConflict):
            actual = exc.details.get("actual_revision")
            if self.adding:
                message = (
                    f"A policy for this principal already exists (revision {actual}); "
                    "open it from the list of policies to change it."
                )
            else:
                message = (
                    f"This policy was changed by someone else (now revision {actual}) since you "
                    "opened it; reload to see their change."
                )
            self.add_error(None, ValidationError(message, code="conflict"))
            return
        if isinstance(exc, InvalidArgument):
            api_field = str(exc.details.get("field", ""))
            message = str(exc)
            field = _form_field(api_field, self, {"window": "window_value"})
            if field == "capabilities" and "[" in api_field:
                capabilities = self.fields["capabilities"]
                assert isinstance(capabilities, CapabilitiesField)
                index = int(api_field.split("[", 1)[1].split("]", 1)[0])
                if index < len(capabilities.lines):
                    message = f"Line {capabilities.lines[index]}: {message.split(': ', 1)[-1]}"
            self.add_error(field, ValidationError(message, code="invalid"))
            return
        self.add_error(None, ValidationError(str(exc), code=exc.code))


# --------------------------------------------------------------------------- jobs


class JobForm(_ApiForm):
    """A job's editable attributes; trigger, payload and authority as JSON text. Saved with
    ``kernel.update_job`` against the loaded revision (``kernel.create_job`` when adding)."""

    trigger = JsonTextField(
        label="Trigger",
        required=False,
        help_text='{} (enqueue only), {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}, '
        '{"every": 300} or {"at": "2026-12-01T09:00:00+00:00"}.',
    )
    payload = JsonTextField(
        label="Payload", required=False, help_text="Any JSON value, given to the handler (null: none)."
    )
    authority = JsonTextField(
        label="Authority",
        help_text='{"principal": {"type": ..., "id": ...}, "requestedCapabilities": [...], ...}',
    )
    then = JsonTextField(
        label="Then",
        required=False,
        help_text="The jobs whose occurrence follows each of this job's that succeeds: a list of job ids "
        'or {"job_id": ..., "payload": ...} (null: none).',
    )
    on_dead_letter = JsonTextField(
        label="On dead letter",
        required=False,
        help_text="The same, for each occurrence that is dead-lettered (null: none).",
    )
    retry_base_delay = forms.FloatField(
        label="Retry base delay (s)", required=False, help_text="First retry delay; it doubles each attempt."
    )
    retry_max_delay = forms.FloatField(label="Retry max delay (s)", required=False)
    max_attempts = forms.IntegerField(min_value=1, max_value=kernel.MAX_ATTEMPTS_LIMIT, initial=3)
    timeout = forms.FloatField(
        label="Timeout (s)",
        required=False,
        help_text="How long one run may take (empty: the handler's, else DURABLE_SCHEDULER_HANDLER_TIMEOUT).",
    )
    concurrency = forms.IntegerField(
        label="Max running at once",
        required=False,
        min_value=1,
        max_value=MAX_CONCURRENCY,
        help_text="How many of the job's occurrences may run at once on all workers (empty: no cap).",
    )
    concurrency_key = forms.CharField(
        label="Concurrency key",
        required=False,
        help_text="Counts the limit per key: a template on the payload such as {customer} (empty: none).",
    )
    throttle = ThrottleField(
        label="Throttle",
        help_text='How fast its occurrences may start on all workers: {"limit": 100, "period": 5, '
        '"burst": 20, "key": "{account}"} (period in seconds; burst and key optional; empty: none). '
        "Work over the rate waits in the queue.",
    )

    class Meta:
        model = Job
        fields = ["job_id", "kind", "enabled", "max_attempts"]

    _API_NAMES: ClassVar[dict[str, str]] = {
        "kind": "kind",
        "trigger": "trigger",
        "payload": "payload",
        "authority": "authority",
        "then": "then",
        "on_dead_letter": "on_dead_letter",
        "enabled": "enabled",
        "max_attempts": "max_attempts",
        "retry_base_delay": "retry_base_delay",
        "retry_max_delay": "retry_max_delay",
        "timeout": "timeout",
        "concurrency": "concurrency",
        "concurrency_key": "concurrency_key",
        "throttle": "throttle",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        instance = self.instance
        if not self.adding:
            self.initial.update(
                trigger=instance.trigger,
                payload=instance.payload,
                authority=instance.authority,
                then=instance.then,
                on_dead_letter=instance.on_dead_letter,
                retry_base_delay=instance.retry_base_delay_ms / 1000,
                retry_max_delay=instance.retry_max_delay_ms / 1000,
                timeout=None if instance.timeout_ms is None else instance.timeout_ms / 1000,
                concurrency=instance.concurrency,
                concurrency_key=instance.concurrency_key,
                throttle=instance.throttle,
            )
        else:
            self.initial.setdefault("trigger", {})
            self.initial.setdefault("payload", None)

    def clean_job_id(self) -> str:
        value = self.cleaned_data["job_id"]
        try:
            return normalize_identifier(value, "job_id", max_length=MAX_IDENTIFIER_LENGTH)
        except InvalidArgument as exc:
            raise ValidationError(str(exc).removeprefix("job_id: ").capitalize() + ".") from None

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        names = list(self._API_NAMES) if self.adding else self.changed_data
        changes: dict[str, Any] = {}
        for name in names:
            if name not in self._API_NAMES:
                continue
            value = data.get(name)
            if name == "trigger" and value is None:
                value = {}
            if name in ("retry_base_delay", "retry_max_delay") and value is None:
                continue
            if name == "concurrency_key" and not value:
                value = None  # empty: no key
            changes[self._API_NAMES[name]] = value
        return changes

    def write(self) -> Job:
        changes = self.changes()
        if self.adding:
            job_id = self.cleaned_data["job_id"]
            kind = changes.pop("kind")
            return kernel.create_job(job_id, kind, **changes)
        if not changes:
            unchanged: Job = self.instance  # nothing changed: no new revision
            return unchanged
        return kernel.update_job(
            self.instance.job_id, expected_revision=self.cleaned_data["loaded_revision"], **changes
        )

    def add_api_error(self, exc: SchedulerError) -> None:
        add_job_error(self, exc, "job_id", "job", "id")


def add_job_error(form: forms.BaseForm, exc: SchedulerError, id_field: str, noun: str, id_word: str) -> None:
    """A job API's error as the form's: on the field it names, else on the form."""
    if isinstance(exc, RevisionConflict):
        actual = exc.details.get("actual_revision")
        message = (
            f"This {noun} was changed by someone else (now revision {actual}) since you opened it; "
            "reload to see their change."
        )
        form.add_error(None, ValidationError(message, code="conflict"))
    elif isinstance(exc, Conflict):
        form.add_error(
            id_field, ValidationError(f"A {noun} with this {id_word} already exists.", code="conflict")
        )
    elif isinstance(exc, InvalidArgument):
        field = _form_field(str(exc.details.get("field", "")), form, {"job_id": id_field})
        form.add_error(field, ValidationError(str(exc), code="invalid"))
    elif isinstance(exc, NotFound) and (field := _form_field(str(exc.details.get("field", "")), form)):
        # A job a chain names (then / on_dead_letter), not this one.
        form.add_error(field, ValidationError(str(exc), code="not_found"))
    elif isinstance(exc, NotFound):
        form.add_error(None, ValidationError(f"This {noun} no longer exists.", code="not_found"))
    else:
        form.add_error(None, ValidationError(str(exc), code=exc.code))


class TaskScheduleForm(_ApiForm):
    """A task's schedule as a person writes it: the task's path, a trigger, the args and
    kwargs of each run. Saved as the job ``tasks.schedule`` would declare
    (``schedules.schedule_settings``), with ``kernel.create_job``/``update_job``."""

    name = forms.CharField(
        max_length=200,
        required=False,
        help_text="Tells two schedules of one task apart; empty: the task's path.",
    )
    task = forms.CharField(
        max_length=MAX_IDENTIFIER_LENGTH,
        help_text="The task's import path, e.g. myapp.tasks.send_report (a @task on a DurableBackend).",
    )
    trigger = JsonTextField(
        label="Trigger",
        help_text='{"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}, {"every": 300} or '
        '{"at": "2026-12-01T09:00:00+00:00"}, with misfire, catchup_window, overlap, start_at, end_at.',
    )
    args = JsonTextField(label="Args", required=False, help_text="A JSON list given to each run.")
    kwargs = JsonTextField(label="Kwargs", required=False, help_text="A JSON object given to each run.")

    class Meta:
        model = Job
        fields = ["enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.adding:
            self.initial.setdefault("args", [])
            self.initial.setdefault("kwargs", {})
            return
        payload = self.instance.payload if isinstance(self.instance.payload, dict) else {}
        self.initial.update(
            task=payload.get("task", ""),
            trigger=self.instance.trigger,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
        )
        del self.fields["name"]  # the job's id: fixed once made

    def write(self) -> Job:
        # Imported here: the task framework is needed only where tasks are used.
        from ..tasks.schedules import durable_backend_of, schedule_job_id, schedule_settings, task_at

        data = self.cleaned_data
        task = task_at(data["task"])
        backend = durable_backend_of(task)
        values = {"args": data["args"], "kwargs": data["kwargs"]}
        for field, empty in (("args", []), ("kwargs", {})):
            value = empty if values[field] is None else values[field]  # empty: none
            try:
                values[field] = backend.json_value(value, field)
            except (TypeError, ValueError) as exc:  # the framework's own refusal, on its field
                raise InvalidArgument(field, str(exc)) from None
        settings = schedule_settings(task, data["trigger"], values["args"], values["kwargs"])
        using = backend.using_alias()
        if self.adding:
            job_id = schedule_job_id(backend, data.get("name") or task.module_path)
            job = kernel.create_job(job_id, enabled=data["enabled"], using=using, **settings)
        elif not self.changed_data:
            unchanged: Job = self.instance
            return unchanged
        else:
            job = kernel.update_job(
                self.instance.job_id,
                expected_revision=data["loaded_revision"],
                enabled=data["enabled"],
                using=using,
                **settings,
            )
        # As a task schedule, so that the admin's message and links name it as one.
        return TaskSchedule.objects.using(using).get(pk=job.pk)

    def add_api_error(self, exc: SchedulerError) -> None:
        add_job_error(self, exc, "name", "task schedule", "name")
