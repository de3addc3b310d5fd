#!/usr/bin/env python3
"""plot.py — draw the benchmark plots from bench/results/results.json.

Usage: plot.py RESULTS_JSON OUT_DIR

Writes, for the scenarios present in the results:
  latency-cdf.png         scenario 1: latency CDF, server (allowed, denied) vs the no-op floor
  throughput.png          scenario 1: throughput as a ratio to the no-op floor
  memory.png              scenario 2: RSS and live keys over the run
  cluster-windows.png     scenario 3: admitted per window over time vs the limit
  latency-cdf-envoy.png   scenario 4: latency CDF through Envoy, filter on vs off
and prints the path of each file written. Needs matplotlib
(scripts/install-plot.sh installs it into .tools/venv).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"noop": "#7f7f7f", "allowed": "#1f77b4", "denied": "#d62728",
          "filter off": "#7f7f7f", "filter on, no-op server": "#ff7f0e", "filter on, ratelimit-authz": "#1f77b4"}


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def groups_of(series):
    order = []
    for s in series:
        if s["group"] not in order:
            order.append(s["group"])
    return order


def cdf_plot(series, out, name, title):
    """One column per group: the CDF on top, the tail (1 − quantile, log) below."""
    groups = groups_of(series)
    if not groups:
        return
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 6.6), squeeze=False, sharex="col")
    for col, g in enumerate(groups):
        top, tail = axes[0][col], axes[1][col]
        for s in series:
            if s["group"] != g or not s["points"]:
                continue
            qs = [p[0] for p in s["points"]]
            lat = [max(p[1], 1) for p in s["points"]]
            color = COLORS.get(s["label"])
            top.plot(lat, qs, label=s["label"], color=color, linewidth=1.6)
            tq = [(l, 1 - q) for l, q in zip(lat, qs) if q < 1]
            tail.plot([t[0] for t in tq], [t[1] for t in tq], color=color, linewidth=1.6)
        top.set_title(g)
        top.set_ylim(0, 1.005)
        tail.set_yscale("log")
        tail.set_ylim(1e-4, 1)
        tail.set_yticks([1, 0.1, 0.01, 0.001, 0.0001])
        tail.set_yticklabels(["p0", "p90", "p99", "p99.9", "p99.99"])
        for ax in (top, tail):
            ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.3)
        tail.set_xlabel("latency (µs, log)")
    axes[0][0].set_ylabel("fraction of requests ≤ latency")
    axes[1][0].set_ylabel("tail: requests slower than")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=11)
    save(fig, out, name)


def throughput_plot(single, out):
    rows = single.get("rows") or []
    if not rows:
        return
    concs = sorted({r["concurrency"] for r in rows})
    workloads = ["allowed", "denied"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.35
    for i, w in enumerate(workloads):
        xs, ys, lo, hi = [], [], [], []
        for j, c in enumerate(concs):
            r = next((r for r in rows if r["concurrency"] == c and r["workload"] == w), None)
            if r is None:
                continue
            xs.append(j + (i - 0.5) * width)
            ys.append(r["ratio"])
            lo.append(max(r["ratio"] - r["ratio_min"], 0))
            hi.append(max(r["ratio_max"] - r["ratio"], 0))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=w, color=COLORS[w])
    ax.axhline(1.0, color="#7f7f7f", linewidth=1, label="no-op floor")
    ax.axhline(0.85, color="black", linewidth=1, linestyle="--", label="target 0.85×")
    ax.set_xticks(range(len(concs)))
    ax.set_xticklabels([f"c={c}" for c in concs])
    ax.set_ylabel("checks/s ÷ no-op checks/s")
    ax.set_ylim(0, 1.3)
    ax.set_title("Check throughput relative to the no-op ext_authz server")
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, out, "throughput.png")


def memory_plot(mem, out):
    series = mem.get("series") or []
    if not series:
        return
    t = [s["t_s"] for s in series]
    rss = [s["rss_bytes"] / 2**20 for s in series]
    keys = [max(s["live_keys"], 0) / 1e6 for s in series]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.plot(t, rss, color="#1f77b4", label="RSS (MiB)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MiB)", color="#1f77b4")
    ax2 = ax.twinx()
    ax2.plot(t, keys, color="#d62728", label="live keys (millions)")
    ax2.set_ylabel("live keys (millions)", color="#d62728")
    ax2.set_ylim(bottom=0)
    ax.set_ylim(bottom=0)
    for e in mem.get("events") or []:
        if e["label"].startswith("idle"):
            continue
        ax.axvline(e["t_s"], color="black", linewidth=0.6, linestyle=":")
        ax.text(e["t_s"], ax.get_ylim()[1] * 0.98, " " + e["label"], rotation=90, va="top", fontsize=7)
    ax.set_title(f"{mem['keys']:,} distinct keys in one {mem['window_s']} s window: "
                 f"{mem['bytes_per_key_rss']:.0f} B/key resident, {mem['bytes_per_key_live_heap']:.0f} B/key live heap",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    save(fig, out, "memory.png")


def cluster_plot(cl, out):
    rows = cl.get("rows") or []
    if cl.get("skipped") or not rows:
        return
    algs = [a for a in ["fixed", "sliding"] if any(r["algorithm"] == a for r in rows)]
    limit = cl["limit"]
    fig, axes = plt.subplots(1, len(algs), figsize=(6 * len(algs), 3.8), squeeze=False, sharey=True)
    colors = {2: "#2ca02c", 10: "#1f77b4", 100: "#d62728"}
    for ax, a in zip(axes[0], algs):
        for r in rows:
            if r["algorithm"] != a or not r["admitted"]:
                continue
            t0 = r["start_ms"][0]
            xs = [(s - t0) / 1000 for s in r["start_ms"]]
            ax.plot(xs, r["admitted"], marker="o", markersize=3, label=f"{r['multiple']}× the limit",
                    color=colors.get(r["multiple"]))
        ax.axhline(limit, color="black", linewidth=1, label=f"limit {limit}")
        ax.axhline(limit * 1.1, color="black", linewidth=1, linestyle="--", label="1.1× limit")
        ax.set_title(f"{a} window, {cl['nodes']} nodes, sync {cl['sync_interval']}")
        ax.set_xlabel("window (s from the first)")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("admitted in the window")
    axes[0][-1].legend(fontsize=8)
    save(fig, out, "cluster-windows.png")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        res = json.load(f)
    out = sys.argv[2]
    single = res.get("single")
    if single:
        cdf_plot(single.get("cdfs") or [], out, "latency-cdf.png", "Check latency over gRPC: server vs no-op floor")
        throughput_plot(single, out)
    if res.get("memory"):
        memory_plot(res["memory"], out)
    if res.get("cluster"):
        cluster_plot(res["cluster"], out)
    if res.get("envoy"):
        cdf_plot(res["envoy"].get("cdfs") or [], out, "latency-cdf-envoy.png",
                 "HTTP latency through Envoy: ext_authz filter off, on with the no-op server, on with ratelimit-authz")


if __name__ == "__main__":
    main()
