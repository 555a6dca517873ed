"""Scratch databases for tests that need one of their own (an empty or partly migrated
database for subprocesses): a temporary SQLite file, or a database named after this process
on the leg's PostgreSQL or MariaDB server, dropped afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from django.db import connection


def _server(settings: dict) -> dict:
    return {
        "host": settings.get("HOST") or "127.0.0.1",
        "port": int(settings["PORT"]) if settings.get("PORT") else None,
        "user": settings.get("USER") or "",
        "password": settings.get("PASSWORD") or "",
    }


def _admin_sql(vendor: str, server: dict, statement: str) -> None:
    """One statement outside any database, with the leg's driver (so a server that does not
    answer fails here, as it fails the leg's other tests)."""
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(
            host=server["host"],
            port=server["port"] or 5432,
            user=server["user"],
            password=server["password"] or None,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        ) as conn:
            conn.execute(statement)
    else:
        import MySQLdb

        with closing(
            MySQLdb.connect(
                host=server["host"],
                port=server["port"] or 3306,
                user=server["user"],
                passwd=server["password"],
                connect_timeout=10,
            )
        ) as conn:
            conn.cursor().execute(statement)


@contextmanager
def scratch_database(directory: Path, prefix: str) -> Iterator[str]:
    """DATABASE_URL of a new empty database of this leg's kind (``prefix`` and this process
    id name it on a server; ``directory`` holds a SQLite file), dropped afterwards."""
    vendor = connection.vendor
    if vendor == "sqlite":
        yield f"sqlite:///{directory / f'{prefix}.sqlite3'}"
        return
    server = _server(connection.settings_dict)
    name = f"{prefix}_{os.getpid()}"
    if vendor == "postgresql":
        scheme, quoted, create = "postgres", f'"{name}"', ""
    else:
        scheme, quoted, create = "mysql", f"`{name}`", " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    _admin_sql(vendor, server, f"DROP DATABASE IF EXISTS {quoted}")
    _admin_sql(vendor, server, f"CREATE DATABASE {quoted}{create}")
    password = f":{server['password']}" if server["password"] else ""
    port = f":{server['port']}" if server["port"] else ""
    try:
        yield f"{scheme}://{server['user']}{password}@{server['host']}{port}/{name}"
    finally:
        _admin_sql(vendor, server, f"DROP DATABASE IF EXISTS {quoted}")
