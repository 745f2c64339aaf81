"""A server's `GET /metrics` as the benches read it: one scrape as {sample: value}, and the families they use read
out of the difference of two scrapes (the names: docs/deploy.md, "Metric families")."""

from __future__ import annotations

import http.client
import re

Samples = dict[str, float]  # 'name{label="v",...}' (as the server writes it) -> value
# mmproc_cpu_seconds_total's roles (service/observe/thread_cpu.py)
CPU_ROLES = ("event_loop", "grpc_loop", "runner", "gpu_decode", "decode_workers", "other")


def parse(text: str) -> Samples:
    """The samples of a text exposition (comments and unparsable lines skipped)."""
    values: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def scrape(http_target: str, timeout: float = 10.0) -> Samples:
    """One scrape of `HOST:PORT` (or http://HOST:PORT); raises OSError when it cannot be read."""
    host, _, port = http_target.removeprefix("http://").rstrip("/").rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        connection.request("GET", "/metrics")
        reply = connection.getresponse()
        body = reply.read().decode(errors="replace")
    except (http.client.HTTPException, ValueError) as exc:
        raise OSError(f"/metrics of {http_target}: {exc}") from exc
    finally:
        connection.close()
    if reply.status != 200:
        raise OSError(f"/metrics of {http_target}: HTTP {reply.status}")
    return parse(body)


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """{label value: sample} of family sample `name` with the one label `label`."""
    pattern = re.compile(rf'{re.escape(name)}\{{{re.escape(label)}="([^"]*)"\}}')
    return {m.group(1): value for key, value in samples.items() if (m := pattern.fullmatch(key))}


def grew(before: Samples, after: Samples, name: str) -> float:
    """How much counter (or histogram _sum/_count) sample `name` grew between two scrapes."""
    return after.get(name, 0.0) - before.get(name, 0.0)


def grew_by(before: Samples, after: Samples, name: str, label: str) -> dict[str, float]:
    """`grew` for each value of family sample `name`'s one label `label` (empty when the server has no such family)."""
    old = by_label(before, name, label)
    return {key: value - old.get(key, 0.0) for key, value in by_label(after, name, label).items()}
