"""Inventory of one drop: a row per file and per tar member, with sha256 = asset_id and provenance.

Plain Python, no Dagster. Bytes are streamed (constant memory); raw objects are only read.
Unreadable objects, unsafe tar members and broken tars become rows with ``status`` and ``reason``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import pandas as pd

from vidassets.config import IngestSettings
from vidassets.ingest.drops import PROVENANCE_SIDECAR, Drop
from vidassets.storage.objects import CHUNK, ObjectInfo, ReadOnlyBucket, printable_name
from vidassets.storage.rows import StepStats

VERSION = "inventory-v1"
"""Producer version of raw_inventory rows (bump when the listing or hashing changes)."""

PROVENANCE_FIELDS = ("license", "territory", "crawl_url", "generated_by")
_ALIASES = {"license_id": "license", "licence": "license", "url": "crawl_url", "source_url": "crawl_url"}


def sha256_stream(stream: BinaryIO, buffer: bytearray | None = None) -> tuple[str, int]:
    """sha256 and length of everything ``stream`` yields, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    total = 0
    if isinstance(stream, io.FileIO | io.BufferedReader):
        view = memoryview(buffer or bytearray(CHUNK))
        while True:
            n = stream.readinto(view)
            if not n:
                break
            digest.update(view[:n])
            total += n
    else:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            total += len(chunk)
    return digest.hexdigest(), total


class Provenance:
    """The drop's ``_provenance.json``: drop-level fields plus optional per-file entries under
    ``files`` (keyed by path relative to the drop; a tar's entry covers its members, and
    ``<tar>#<member>`` addresses one member)."""

    def __init__(self, drop_level: Mapping[str, Any], per_file: Mapping[str, Mapping[str, Any]], error: str | None):
        self.drop_level = dict(drop_level)
        self.per_file = {k: dict(v) for k, v in per_file.items()}
        self.error = error

    @classmethod
    def load(cls, bucket: ReadOnlyBucket, drop: Drop) -> Provenance:
        key = f"{drop.prefix}/{PROVENANCE_SIDECAR}"
        if not bucket.exists(key):
            return cls({}, {}, None)
        try:
            doc = json.loads(bucket.get_bytes(key).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return cls({}, {}, f"{PROVENANCE_SIDECAR} is not valid JSON: {exc}")
        if not isinstance(doc, dict):
            return cls({}, {}, f"{PROVENANCE_SIDECAR} must hold a JSON object")
        files = doc.pop("files", {}) or {}
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            return cls(doc, {}, f"{PROVENANCE_SIDECAR}: 'files' must map paths to objects; ignored")
        return cls(doc, files, None)

    def for_object(self, relative: str, member: str | None = None) -> dict[str, Any]:
        merged = {_ALIASES.get(k, k): v for k, v in self.drop_level.items()}
        for key in (relative, f"{relative}#{member}" if member else None):
            if key and key in self.per_file:
                merged.update({_ALIASES.get(k, k): v for k, v in self.per_file[key].items()})
        if self.error:
            merged["provenance_error"] = self.error
        return merged


def _provenance_columns(prov: dict[str, Any]) -> dict[str, Any]:
    cols = {name: (None if prov.get(name) is None else str(prov[name])) for name in PROVENANCE_FIELDS}
    cols["provenance"] = json.dumps(prov, sort_keys=True, default=str)
    return cols


def _media_type(name: str, settings: IngestSettings) -> str:
    lower = name.lower()
    if lower.endswith(settings.video_extensions):
        return "video"
    return "image" if settings.image_extensions and lower.endswith(settings.image_extensions) else "other"


def is_tar(name: str, settings: IngestSettings) -> bool:
    return name.lower().endswith(settings.tar_extensions)


def unsafe_member_reason(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if printable_name(name) != name:
        return "tar member name is not valid UTF-8; refused"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "tar member has an absolute path; refused"
    if ".." in name.replace("\\", "/").split("/"):
        return "tar member path contains '..'; refused"
    if member.issym() or member.islnk():
        return "tar member is a link; not followed"
    if not member.isfile():
        return "tar member is not a regular file"
    return None


def inventory_drop(
    bucket: ReadOnlyBucket,
    drop: Drop,
    settings: IngestSettings,
    producer_version: str,
    previous: pd.DataFrame | None = None,
    marker: str = "_SUCCESS",
) -> tuple[list[dict[str, Any]], StepStats]:
    """Rows for every object of ``drop`` (duplicate columns left empty; see ``duplicates``).

    Rows of ``previous`` (the partition's last inventory) are reused without re-hashing when the
    object's version (mtime+size or ETag) and the producer version are unchanged. The stats count
    objects listed (``rows_in``), rows reused and computed, bytes hashed and seconds spent hashing.
    """
    stats = StepStats()
    provenance = Provenance.load(bucket, drop)
    reusable = _reusable_rows(previous, producer_version)
    rows: list[dict[str, Any]] = []
    buffer = bytearray(CHUNK)
    control = {PROVENANCE_SIDECAR, marker}  # only at the top of the drop; nested ones are data
    for info in bucket.list(drop.prefix):
        relative = info.key[len(drop.prefix) + 1 :]
        if relative in control:
            continue
        stats.rows_in += 1
        base = {
            "key": info.key,
            "size": info.size,
            "object_version": info.version,
            "source_shard": drop.key,
            "source_tier": drop.source_tier,
            "drop_id": drop.drop_id,
            "producer_version": producer_version,
        }
        old = reusable.get(info.key)
        if old and all(r["object_version"] == info.version for r in old):
            for r in old:
                prov = provenance.for_object(relative, r.get("member"))
                rows.append({**r, **_provenance_columns(prov), "duplicate_of": None, "duplicate_of_uri": None})
            stats.reused += len(old)
            continue
        started = time.perf_counter()
        if info.refusal:
            rows.append(_failed(base, bucket.uri_for(info.key), "file", relative, "refused", info.refusal, provenance, settings))
        elif is_tar(relative, settings):
            for row in _tar_rows(bucket, info, relative, base, provenance, settings, buffer):
                rows.append(row)
                stats.add("bytes_hashed", row["size"] if row["status"] == "ok" else 0)
        else:
            uri = bucket.uri_for(info.key)
            try:
                with bucket.open_read(info.key) as stream:
                    asset_id, size = sha256_stream(stream, buffer)
                rows.append(
                    {
                        **base,
                        "uri": uri,
                        "member": None,
                        "member_offset": None,
                        "container": "file",
                        "media_type": _media_type(relative, settings),
                        "size": size,
                        "asset_id": asset_id,
                        "status": "ok",
                        "reason": None,
                        **_provenance_columns(provenance.for_object(relative)),
                    }
                )
                stats.add("bytes_hashed", size)
            except Exception as exc:  # noqa: BLE001 - any read failure is data, not a crash
                rows.append(_failed(base, uri, "file", relative, "error", f"unreadable: {_describe(exc)}", provenance, settings))
        stats.seconds += time.perf_counter() - started
    for r in rows:  # model-generated: a synthetic tier, or a generator named in the provenance
        r["synthetic"] = r["source_tier"] in settings.synthetic_tiers or bool(r.get("generated_by"))
    rows.sort(key=lambda r: r["uri"])
    stats.computed = len(rows) - stats.reused
    for r in rows:
        stats.count(r["status"])
    return rows, stats


def _reusable_rows(previous: pd.DataFrame | None, producer_version: str) -> dict[str, list[dict[str, Any]]]:
    if previous is None or previous.empty:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for row in previous.to_dict("records"):
        if row["producer_version"] != producer_version or row["status"] == "error":
            continue  # transient read errors are always retried
        row = {k: (None if _is_null(v) else v) for k, v in row.items()}
        out.setdefault(row["key"], []).append(row)
    return out


def _is_null(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _failed(
    base: dict[str, Any],
    uri: str,
    container: str,
    relative: str,
    status: str,
    reason: str,
    provenance: Provenance,
    settings: IngestSettings,
    member: str | None = None,
) -> dict[str, Any]:
    return {
        **base,
        "uri": uri,
        "member": member,
        "member_offset": None,
        "container": container,
        "media_type": _media_type(member or relative, settings),
        "size": base["size"] if container != "tar_member" else 0,
        "asset_id": None,
        "status": status,
        "reason": reason,
        **_provenance_columns(provenance.for_object(relative, member)),
    }


def _tar_rows(
    bucket: ReadOnlyBucket,
    info: ObjectInfo,
    relative: str,
    base: dict[str, Any],
    provenance: Provenance,
    settings: IngestSettings,
    buffer: bytearray,
) -> Iterator[dict[str, Any]]:
    tar_uri = bucket.uri_for(info.key)
    compressed = not relative.lower().endswith(".tar")
    seen: set[str] = set()
    members = 0
    try:
        with bucket.open_read(info.key) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                if member.isdir():
                    continue
                members += 1
                reason = unsafe_member_reason(member)
                name = printable_name(member.name)
                uri = f"{tar_uri}#{name}"
                if name in seen:
                    reason, uri = "tar member name repeats an earlier member; refused", f"{uri}@{members}"
                seen.add(name)
                if reason:
                    yield {**_failed(base, uri, "tar_member", relative, "refused", reason, provenance, settings,
                                     name), "size": max(member.size, 0)}
                    continue
                try:
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    asset_id, size = sha256_stream(extracted, buffer)
                    if size != member.size:
                        raise tarfile.ReadError(f"member truncated: {size} of {member.size} bytes")
                except Exception as exc:  # noqa: BLE001
                    yield _failed(base, uri, "tar_member", relative, "error", f"unreadable tar member: {_describe(exc)}",
                                  provenance, settings, member.name)
                    return
                yield {
                    **base,
                    "uri": uri,
                    "member": member.name,
                    "member_offset": None if compressed else member.offset_data,
                    "container": "tar_member",
                    "media_type": _media_type(member.name, settings),
                    "size": size,
                    "asset_id": asset_id,
                    "status": "ok",
                    "reason": None,
                    **_provenance_columns(provenance.for_object(relative, member.name)),
                }
    except Exception as exc:  # noqa: BLE001 - a broken tar is a row, members read so far are kept
        yield _failed(base, tar_uri, "tar", relative, "error",
                      f"tar unreadable after {members} member(s): {_describe(exc)}", provenance, settings)


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if exc.__class__.__name__ not in text else text
