"""`mmproc bench serve --plot PATH.png`: each side's latency CDF, and its throughput and mean latency as bars
(A/B bars under `--compare`). Drawn from the per-request rows of the record (mmproc/bench/serve_stats.py)."""

from __future__ import annotations

from typing import Any

from mmproc.bench.report import bars


def plot_serve(plt: Any, record: dict) -> None:
    runs = record["runs"]
    work = record["workload"]
    fig, (cdf, rate, latency) = plt.subplots(1, 3, figsize=(14, 4))
    for run in runs:
        values = sorted(r["latency_ms"] for r in run.get("requests", ()) if r["error"] is None and r["latency_ms"])
        if values:
            cdf.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=run["label"])
    cdf.set_xlabel("latency (ms)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("latency CDF")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize="small")
    labels = [run["label"] for run in runs]
    bars(rate, labels, {"req/s": [run["throughput_rps"] for run in runs]}, "requests / s")
    rate.set_title(f"throughput at concurrency {work['concurrency']}")
    means = [None if run["latency_ms"] is None else run["latency_ms"]["mean"] for run in runs]
    p99s = [None if run["latency_ms"] is None else run["latency_ms"]["p99"] for run in runs]
    bars(latency, labels, {"mean": means, "p99": p99s}, "ms")
    latency.set_title("latency")
    ab = record.get("compare")
    title = (
        f"{record['server_info'].get('model_name', '?')}: {work['requests']} requests x {work['images_per_request']}"
    )
    if ab and ab.get("throughput_ratio") is not None:
        title += f" | {ab['a']} / {ab['b']}: throughput x{ab['throughput_ratio']:.3f}"
    fig.suptitle(title)
