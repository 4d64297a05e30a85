"""A SQL database the global indexes keep their state in: SQLite next to a local store, PostgreSQL
in production (every step pod shares it). What the near-duplicate index and dedup's state need of
it, said once: the engine (SQLite in WAL mode, waiting for a lock rather than failing), many rows in
one driver call, and ``IN`` lists passed the way each driver takes them."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from vidassets.storage.objects import ObjectStore


class Database:
    """The database at ``url`` (a SQLAlchemy URL: ``sqlite:///…``, ``postgresql://…``)."""

    def __init__(self, url: str):
        from sqlalchemy import create_engine, event
        from sqlalchemy.pool import NullPool

        self.url = url
        self.sqlite = url.startswith("sqlite")
        self._held = False
        if self.sqlite and url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        # SQLite: a connection per use (cheap), so a database file replaced on disk (a store restored
        # from a copy) is the one read, never a pooled handle on the old one
        self.engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False},
                                        poolclass=NullPool, future=True) if self.sqlite \
            else create_engine(url, future=True)
        if self.sqlite:
            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi, _record):  # concurrent writers share one file: WAL, wait for the lock
                cursor = dbapi.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA cache_size=-131072")  # 128 MiB of pages: postings land at random keys
                # pages read in place from the OS page cache, not copied into SQLite's (up to SQLite's
                # compiled maximum, 2 GiB in Python's build): dedup's postings lookups, measured with
                # and without by bench/dedup_profile.py (results/dedup_profile.json)
                cursor.execute(f"PRAGMA mmap_size={1 << 40}")
                cursor.close()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """For the duration (a step's use of its state), every use of the database shares one
        connection: on SQLite, otherwise each use opens the file afresh, with an empty page cache
        (deeper trees as the state grows: more pages read again), and the close of the last
        connection writes the write-ahead log back into the database every time; held, the log is
        written back once, when the step ends. A database file replaced on disk meanwhile is not
        seen until then (a store is restored between runs, not during one). PostgreSQL's pool
        already keeps its connections: nothing changes there."""
        if not self.sqlite or self._held:
            yield
            return
        from sqlalchemy import create_engine
        from sqlalchemy.pool import StaticPool

        own, raw = self.engine, self.engine.raw_connection()
        self.engine = create_engine(self.url, poolclass=StaticPool, creator=lambda: raw.dbapi_connection, future=True)
        self._held = True
        try:
            yield
        finally:
            self.engine.dispose(close=False)
            self.engine, self._held = own, False
            raw.close()

    @property
    def blob(self) -> str:
        return "BLOB" if self.sqlite else "BYTEA"

    @property
    def without_rowid(self) -> str:
        return " WITHOUT ROWID" if self.sqlite else ""

    @staticmethod
    def sql(statement: str) -> Any:
        from sqlalchemy import text

        return text(statement)

    def create(self, statements: Sequence[str], lock: int, then: Callable[[Any], None] | None = None) -> None:
        """Run ``statements`` (``{blob}``, ``{without_rowid}`` filled in), then ``then(db)``, in one
        transaction, under an advisory lock on PostgreSQL so concurrent first runs create the tables
        once."""
        with self.engine.begin() as db:
            if not self.sqlite:
                db.execute(self.sql(f"SELECT pg_advisory_xact_lock({lock})"))
            for statement in statements:
                db.execute(self.sql(statement.format(blob=self.blob, without_rowid=self.without_rowid)))
            if then is not None:
                then(db)

    def bulk(self, db: Any, statement: str, rows: Sequence[tuple]) -> None:
        """Many rows in one call of the driver (``statement`` has ``VALUES %s``): SQLite's
        executemany, psycopg2's execute_values (SQLAlchemy's per-row parameter handling would cost
        more than the database)."""
        if not rows:
            return
        if self.sqlite:
            db.exec_driver_sql(statement.replace("%s", "(" + ",".join("?" * len(rows[0])) + ")"), list(rows))
        else:
            from psycopg2.extras import execute_values

            execute_values(db.connection.dbapi_connection.cursor(), statement, list(rows), page_size=5000)

    def many(self, db: Any, statement: str, rows: Sequence[tuple]) -> None:
        """``statement`` with ``?`` placeholders run once per row, in one driver call."""
        if rows:
            db.exec_driver_sql(statement if self.sqlite else statement.replace("?", "%s"), list(rows))

    def _in(self, db: Any, head: str, values: Sequence[Any], tail: str, chunk: int) -> list[Any]:
        """The driver's results of ``{head} IN (values){tail}``: ``values`` in chunks on SQLite (it
        allows 32,766 per statement), one array on PostgreSQL."""
        values = list(values)
        if not values:
            return []
        if not self.sqlite:
            return [db.exec_driver_sql(f"{head} = ANY(%s){tail}", (values,))]
        return [db.exec_driver_sql(f"{head} IN ({','.join('?' * len(part))}){tail}", tuple(part))
                for part in (values[start:start + chunk] for start in range(0, len(values), chunk))]

    def delete_in(self, db: Any, head: str, values: Sequence[Any], chunk: int = 30_000) -> None:
        """``{head} IN (values)`` (a DELETE)."""
        self._in(db, head, values, "", chunk)

    def select_in(self, db: Any, head: str, values: Sequence[Any], tail: str = "", chunk: int = 30_000) -> list[tuple]:
        """Rows of ``{head} IN (values){tail}``."""
        return [tuple(r) for found in self._in(db, head, values, tail, chunk) for r in found]


BINDING_KEY = "state/databases.json"


def bound_version(objects: ObjectStore, version: str) -> str:
    """``version`` bound to the store ``objects``: a token the store keeps (made on first use). A
    global stage's state database records the version it was built by, so a database left by
    another store at the same URL (a store wiped and made again, two S3 stores sharing a temporary
    SQLite file) is rebuilt, never trusted."""
    if not objects.exists(BINDING_KEY):
        objects.put_bytes(BINDING_KEY, json.dumps({"token": uuid.uuid4().hex}).encode())
    return f"{version}@{json.loads(objects.get_bytes(BINDING_KEY))['token']}"
