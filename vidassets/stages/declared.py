"""What one asset may read, enforced: its settings and tables come through views built from its
catalog entry, and a read the entry does not declare raises ``UndeclaredRead``.

- ``settings``: the sections and leaves the entry lists in ``settings`` (which are part of its
  version), and the inert ones (``catalog.INERT_SETTINGS``: where things live, how steps run).
- ``tables``: the asset's own tables (its previous rows) and those of the assets its rows are
  computed from (``reads``, transitively: their versions are its rows' input versions).
- ``which``: the tables of the assets it runs after (``deps``, transitively), for *which* items to
  work on (the canonical videos of a drop, the selected clips), never for values.

Every declared read is logged (``ReadLog``), so a test can compare what each asset actually read
during a run with what its entry declares (over-declaring expires rows for nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from vidassets import catalog
from vidassets.storage.tables import TableStore


class UndeclaredRead(RuntimeError):
    """A stage read a setting or a table its catalog entry does not declare."""


class ReadLog:
    """What each asset read in this process: settings paths and tables, by purpose."""

    def __init__(self) -> None:
        self.settings: dict[str, set[str]] = defaultdict(set)
        self.tables: dict[str, set[tuple[str, str]]] = defaultdict(set)


def _covers(prefixes: Iterable[str], path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


def _below(prefixes: Iterable[str], path: str) -> bool:
    return any(p.startswith(path + ".") for p in prefixes)


class SettingsView:
    """Attribute access to the settings an asset declares (whole sections come back as themselves)."""

    def __init__(self, model: BaseModel, asset: str, log: ReadLog, path: str = ""):
        self._model, self._asset, self._log, self._path = model, asset, log, path
        self._declared = catalog.entry(asset).settings

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._model, name)
        path = f"{self._path}.{name}" if self._path else name
        if _covers(self._declared, path):
            self._log.settings[self._asset].add(path)
            return value
        if _covers(catalog.INERT_SETTINGS, path):
            return value
        if isinstance(value, BaseModel) and (_below(self._declared, path) or _below(catalog.INERT_SETTINGS, path)):
            return SettingsView(value, self._asset, self._log, path)
        raise UndeclaredRead(f"{self._asset} reads the setting {path!r}, which its catalog entry does not declare "
                             f"(it declares {', '.join(self._declared) or 'none'}): add it to the entry's settings, "
                             "so that a change to it expires this asset's rows")


_READS = {"read", "read_or_empty", "read_groups", "previous", "read_all", "exists", "partitions", "versions", "latest_rows", "version", "written_since"}
_WRITES = {"write", "write_groups"}


def _closure(name: str, via: str) -> set[str]:
    found: set[str] = set()
    todo = list(getattr(catalog.entry(name), via))
    while todo:
        other = todo.pop()
        if other not in found:
            found.add(other)
            todo.extend(getattr(catalog.entry(other), via))
    return found


def readable_tables(name: str, purpose: str, vault: bool = False) -> set[str]:
    """Tables ``name`` may read: for its values (``tables``) or for which items to work on (``which``)."""
    assets = _closure(name, "reads" if purpose == "tables" else "deps")
    field = "vault_tables" if vault else "tables"
    return {t for a in assets for t in getattr(catalog.entry(a), field)}


class DeclaredTables:
    """A ``TableStore`` that reads only the tables its asset declares (and writes only its own)."""

    def __init__(self, store: TableStore, asset: str, purpose: str, log: ReadLog, vault: bool = False):
        self._store, self._asset, self._purpose, self._log = store, asset, purpose, log
        own = set(catalog.entry(asset).vault_tables if vault else catalog.entry(asset).tables)
        self._own = own if purpose == "tables" else set()
        self._readable = readable_tables(asset, purpose, vault) | self._own
        self.objects, self.uri = store.objects, store.uri

    def _check(self, table: str, write: bool) -> None:
        if table in (self._own if write else self._readable):
            if not write:
                self._log.tables[self._asset].add((self._purpose, table))
            return
        owner = next((a.name for a in catalog.ASSETS if table in a.tables or table in a.vault_tables), "no asset")
        declared = "writes only its own tables" if write else f"reads {self._purpose} {sorted(self._readable)}"
        raise UndeclaredRead(f"{self._asset} {'writes' if write else 'reads'} the table {table!r} (of {owner}) as "
                             f"{self._purpose}, which its catalog entry does not declare: it {declared}")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # never delegated: unpickling (on an engine's worker) asks before _store is set
            raise AttributeError(attr)
        method = getattr(self._store, attr)
        if attr in _READS or attr in _WRITES:
            def guarded(table: str, *args: Any, **kwargs: Any) -> Any:
                self._check(table, attr in _WRITES)
                return method(table, *args, **kwargs)

            return guarded
        if attr == "park":
            def park(tables: Iterable[str], *args: Any, **kwargs: Any) -> Any:
                tables = list(tables)
                for table in tables:
                    self._check(table, True)
                return method(tables, *args, **kwargs)

            return park
        return method  # hand_over, … : moving rows between drops, no values read
