"""The archive: what retention deletes, written first as gzip-compressed JSON lines through
Django's storage API (``DURABLE_SCHEDULER_ARCHIVE = {"storage": <name in STORAGES>, "prefix":
...}``), one file per table and period, read back and checked before the rows may go.

A file is a header line (``{"archive": 1, "model": ..., "table": ..., "period": [...],
"fields": [...]}``) and then one object per row, keyed by the model's concrete fields'
attribute names (``Model._meta``, so a field added by a migration is archived with no edit
here), encoded with ``DjangoJSONEncoder``. ``read`` gives the rows back as unsaved model
instances, which ``manage.py scheduler_restore_archive`` loads.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from django.apps import apps
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model

from .. import conf
from ..db import dialect

FORMAT = 1
APP_LABEL = "durable_scheduler"
# Up to this many bytes of a file are built in memory, beyond it in a temporary file.
SPOOL_BYTES = 8 * 1024 * 1024


class ArchiveError(Exception):
    """An archive file could not be written, verified or read: nothing was deleted."""


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y%m%dT%H%M%S")


@dataclass
class Sink:
    """Writes archive files into one storage under one prefix."""

    storage: Storage
    prefix: str

    def write(self, model: type[Model], period: tuple[datetime, datetime], rows: Iterable[Model]) -> str:
        """Write ``rows`` of ``model`` for ``period`` as one file, read it back to check its
        row count and checksum, and return its name in the storage; ``ArchiveError`` (and no
        file left behind, where it can be deleted) when any of that fails."""
        fields = dialect.concrete_fields(model)
        header = {
            "archive": FORMAT,
            "model": model._meta.label,
            "table": model._meta.db_table,
            "period": [period[0], period[1]],
            "fields": [field.attname for field in fields],
        }
        digest = hashlib.sha256()
        count = 0
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as buffer:
            with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed:
                for line in self._lines(header, fields, rows):
                    packed.write(line)
                    digest.update(line)
                    count += 1
            buffer.seek(0)
            name = self._save(self._name(model, period, digest.hexdigest()), buffer)
        try:
            self._verify(name, count, digest.hexdigest())
        except Exception:
            self._discard(name)
            raise
        return name

    @staticmethod
    def _lines(header: dict[str, Any], fields: Any, rows: Iterable[Model]) -> Iterator[bytes]:
        yield _line(header)
        for row in rows:
            yield _line({field.attname: field.value_from_object(row) for field in fields})

    def _name(self, model: type[Model], period: tuple[datetime, datetime], digest: str) -> str:
        table = model._meta.db_table
        folder = f"{self.prefix}/{table}" if self.prefix else table
        start, end = period
        return f"{folder}/{start:%Y-%m-%d}/{table}-{_stamp(start)}-{_stamp(end)}-{digest[:12]}.jsonl.gz"

    def _save(self, name: str, content: IO[bytes]) -> str:
        try:
            return str(self.storage.save(name, File(content, name=name)))
        except Exception as exc:
            raise ArchiveError(f"could not write {name}: {type(exc).__name__}: {exc}") from exc

    def _verify(self, name: str, lines: int, checksum: str) -> None:
        """Read the stored file back: the same number of lines with the same checksum."""
        digest = hashlib.sha256()
        found = 0
        try:
            with self.storage.open(name, "rb") as stored, gzip.GzipFile(fileobj=stored, mode="rb") as packed:
                for line in packed:
                    digest.update(line)
                    found += 1
        except Exception as exc:
            raise ArchiveError(f"could not read {name} back: {type(exc).__name__}: {exc}") from exc
        if (found, digest.hexdigest()) != (lines, checksum):
            raise ArchiveError(
                f"{name} reads back as {found - 1} rows with checksum {digest.hexdigest()[:12]}, "
                f"not the {lines - 1} rows with checksum {checksum[:12]} written"
            )

    def _discard(self, name: str) -> None:
        # Best effort: the error being raised says what failed.
        with contextlib.suppress(Exception):
            self.storage.delete(name)


def sink(alias: str) -> Sink | None:
    """The archive retention writes to before deleting from database ``alias`` (None when
    ``DURABLE_SCHEDULER_ARCHIVE`` is not set). One archive serves every database: a file
    holds rows of one table, and its name says which."""
    config = conf.settings.ARCHIVE
    if config is None:
        return None
    return Sink(storages[config["storage"]], config["prefix"])


@dataclass
class Contents:
    """An archive file read back: its model, period and rows (unsaved instances)."""

    model: type[Model]
    period: tuple[str, str]
    rows: list[Model]


def read(storage: Storage, name: str) -> Contents:
    """The rows of archive file ``name``; ``ArchiveError`` when it is missing or is not an
    archive of this app's tables."""
    if not storage.exists(name):
        raise ArchiveError(f"no archive file {name!r} in that storage")
    try:
        with storage.open(name, "rb") as stored, gzip.GzipFile(fileobj=stored, mode="rb") as packed:
            lines = [json.loads(line) for line in packed]
    except (OSError, EOFError, ValueError) as exc:
        raise ArchiveError(f"{name} is not a gzip file of JSON lines: {exc}") from exc
    header = lines[0] if lines and isinstance(lines[0], dict) else {}
    label = header.get("model")
    if header.get("archive") != FORMAT or not isinstance(label, str) or not label.startswith(f"{APP_LABEL}."):
        raise ArchiveError(f"{name} is not a scheduler archive (its first line is no archive header)")
    try:
        model = apps.get_model(label)
    except LookupError as exc:
        raise ArchiveError(f"{name} holds rows of {label}, which this app does not have") from exc
    fields = {field.attname: field for field in dialect.concrete_fields(model)}
    rows = [
        model(**{key: fields[key].to_python(value) for key, value in row.items() if key in fields})
        for row in lines[1:]
    ]
    start, end = header.get("period") or ("", "")
    return Contents(model, (str(start), str(end)), rows)
