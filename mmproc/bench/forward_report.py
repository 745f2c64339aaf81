"""`mmproc bench encoder`'s output: one table line per row, the checks line, the summary and the plot."""

from __future__ import annotations

from mmproc.bench.report import bars


def _format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['workload']:>8} {r['impl']:>14} FAILED {r['error'][:100]}"
    ratio = f"{r['vs_baseline']:.2f}x" if "vs_baseline" in r else "-"
    mfu = "-" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%"
    return (
        f"{r['workload']:>8} {r['impl']:>14} {r['images']:>4} {r['patches']:>6} {r['ms']:>8.2f} "
        f"{r['images_per_s']:>8.1f} {r['tokens_per_s'] / 1e3:>8.1f}k {r['tflops']:>7.1f} {mfu:>6} "
        f"{ratio:>6} {r['first_s']:>7.2f}"
    )


def _format_checks(check: dict, kernels: tuple[str, ...]) -> str:
    """The per-workload checks as one readable line (not a dict's repr)."""
    parts = [f"syncs/forward {check['syncs_per_forward']}", f"host ms to issue {check['host_ms_to_issue_forward']:.2f}"]
    if "rel_err_vs_baseline" in check:
        parts.append(f"rel. error vs baseline {check['rel_err_vs_baseline']:.1e}")
    if "fp8_speedup" in check:
        parts.append(f"fp8 {check['fp8_speedup']:.2f}x, token cos mean {check['fp8_token_cos_mean']:.5f} worst "
                     f"{check['fp8_token_cos_worst']:.5f}, rel. error {check['fp8_rel_err']:.3f}")  # fmt: skip
    names = ("attention", "RoPE", "fc0+GELU", "add+norm")
    parts.append("kernels " + ", ".join(f"{n} {k}" for n, k in zip(names, kernels)))
    return f"{'':>8} " + " | ".join(parts)


def _summary(rows: list[dict]) -> None:
    for r in rows:
        if r["impl"] == "mmproc" and "vs_baseline" in r:
            mfu = "no MFU" if r["mfu"] is None else f"MFU {r['mfu'] * 100:.1f}%"
            print(f"{r['workload']}: {r['images_per_s']:.1f} img/s, {mfu}, "
                  f"{r['vs_baseline']:.2f}x the eager baseline, first forward {r['first_s']:.2f} s")  # fmt: skip
        if r["impl"] == "fp8" and "vs_default" in r:
            print(f"{r['workload']}: fp8 {r['images_per_s']:.1f} img/s, {r['vs_default']:.2f}x the default")


def plot_encoder(plt: object, rows: list[dict], title: str) -> None:
    """img/s per workload for each implementation; beside it MFU per workload when a peak is known."""
    good = [r for r in rows if "error" not in r]
    workloads = list(dict.fromkeys(r["workload"] for r in good))
    impls = list(dict.fromkeys(r["impl"] for r in good))
    value = {(r["workload"], r["impl"]): r for r in good}
    with_mfu = any(r["mfu"] is not None for r in good)
    fig, axes = plt.subplots(1, 2 if with_mfu else 1, figsize=(11 if with_mfu else 6, 4), squeeze=False)  # type: ignore[attr-defined]
    series = {i: [value[(w, i)]["images_per_s"] if (w, i) in value else None for w in workloads] for i in impls}
    bars(axes[0][0], workloads, series, "images / s")
    axes[0][0].set_title("throughput")
    if with_mfu:
        mfu = [value[(w, "mmproc")]["mfu"] * 100 if (w, "mmproc") in value else None for w in workloads]
        bars(axes[0][1], workloads, {"mmproc": mfu}, "MFU %")
        axes[0][1].set_title("MFU (mmproc)")
    fig.suptitle(title)
