"""A handler's progress as the admin shows it (the occurrence page, the occurrences list, the
dashboard's workers): a bar and ``done / total (pct%) note``, read from
``Occurrence.progress``. A report of an earlier attempt says so: the running attempt has
not reported yet."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..rules.progress import Progress


def progress_html(value: Any, fence: int) -> SafeString | str:
    """``value`` (an occurrence's ``progress``) as a bar and its text; ``fence``: the
    occurrence's, to tell a report of an earlier attempt. Empty for none."""
    progress = Progress.of_json(value)
    if progress is None:
        return ""
    earlier = " (an earlier attempt's)" if progress.fence and progress.fence != fence else ""
    text = progress.describe() + earlier
    if progress.total is None or progress.total <= 0:
        # No total: an indeterminate bar, moving as the page is shown.
        return format_html('<span class="dsch-progress"><progress></progress> {}</span>', text)
    return format_html(
        '<span class="dsch-progress"><progress max="{}" value="{}"></progress> {}</span>',
        progress.total,
        progress.done,
        text,
    )
