"""Egress NetworkPolicies per pod role, derived from the settings and the catalog (no Dagster).

Step pods read untrusted media, so each may reach only what its work needs. ``media`` pods: the
object store (``compute.object_store_cidr`` / ``object_store_ports``), the Dagster database, the
near-duplicate index's database (``store.near_duplicate_index``, when set) and cluster DNS. ``annotator`` pods — the steps whose catalog settings include a model endpoint that is
configured (``config.ENDPOINT_SETTINGS``) — those plus each configured endpoint's host and port: an
IP address as itself, an in-cluster service name (``vlm``, ``vlm.models``,
``vlm.models.svc.cluster.local``) as the pods labelled ``app.kubernetes.io/name: <service>`` in its
namespace. A host a NetworkPolicy cannot name (a public DNS name) is refused: put an egress proxy or
an in-cluster service in front of it. Neither policy allows ingress.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from vidassets import catalog
from vidassets.config import EGRESS_ROLES, ENDPOINT_SETTINGS, ConfigError, Settings


def _covers(prefixes: tuple[str, ...], path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


def configured_endpoints(settings: Settings) -> dict[str, str]:
    """Setting path -> URL of every model endpoint the settings configure."""
    found = {}
    for path in ENDPOINT_SETTINGS:
        value: Any = settings
        for part in path.split("."):
            value = getattr(value, part, None)
        if value is not None:
            found[path] = value.endpoint
    return found


def endpoints_of(settings: Settings, asset: str) -> dict[str, str]:
    """The configured endpoints an asset's settings include (its catalog entry's ``settings``)."""
    declared = catalog.entry(asset).settings
    return {path: url for path, url in configured_endpoints(settings).items()
            if _covers(declared, path) or any(d.startswith(path + ".") for d in declared)}


def role_of(settings: Settings, assets: list[str] | tuple[str, ...] | str) -> str:
    """``annotator`` when any of ``assets`` calls a configured model endpoint, else ``media``."""
    names = [assets] if isinstance(assets, str) else list(assets)
    return "annotator" if any(endpoints_of(settings, a) for a in names) else "media"


def endpoint_peer(field: str, url: str) -> tuple[dict[str, Any], int]:
    """(the NetworkPolicy peer, port) of a URL (a model endpoint, the index database); a ConfigError
    naming ``field`` where a NetworkPolicy cannot name the host."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"{field} {url!r} has no host")
    port = parts.port or {"https": 443, "postgresql": 5432}.get(parts.scheme.split("+")[0], 80)
    try:
        address = ipaddress.ip_address(parts.hostname)
    except ValueError:
        labels = parts.hostname.split(".")
        cluster = len(labels) == 1 or (len(labels) == 2) or parts.hostname.endswith(".svc.cluster.local") \
            or (len(labels) == 3 and labels[2] == "svc")
        if not cluster:
            raise ConfigError(f"{field} {url!r}: a NetworkPolicy cannot allow the public host "
                              f"{parts.hostname!r}; reach it through an in-cluster service or egress proxy") from None
        peer: dict[str, Any] = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": labels[0]}}}
        if len(labels) >= 2:
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": labels[1]}}
        return peer, port
    return {"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}, port


def _base_rules(settings: Settings) -> list[dict[str, Any]]:
    c = settings.compute
    index = settings.store.near_duplicate_index  # video_fingerprint's database, when not the default SQLite
    database = []
    if index and not index.startswith("sqlite"):
        peer, port = endpoint_peer("store.near_duplicate_index", index)
        database = [{"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}]
    return database + [
        {"to": [{"ipBlock": {"cidr": c.object_store_cidr}}],
         "ports": [{"protocol": "TCP", "port": p} for p in c.object_store_ports]},
        {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "postgresql"}}}],
         "ports": [{"protocol": "TCP", "port": 5432}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    ]


def _policy(name: str, role: str, egress: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": dict(EGRESS_ROLES[role])}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [], "egress": egress}}


def policies(settings: Settings) -> list[dict[str, Any]]:
    """The media pods' policy, and the annotator pods' when any endpoint is configured."""
    out = [_policy("vidassets-media-egress", "media", _base_rules(settings))]
    endpoints = configured_endpoints(settings)
    if endpoints:
        rules = _base_rules(settings)
        for path, url in sorted(endpoints.items()):
            peer, port = endpoint_peer(f"{path}.endpoint", url)
            rules.append({"to": [peer], "ports": [{"protocol": "TCP", "port": port}]})
        out.append(_policy("vidassets-annotator-egress", "annotator", rules))
    return out
