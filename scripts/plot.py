#!/usr/bin/env python3
"""plot.py — draw the benchmark plots from bench/results/results.json.

Usage: plot.py RESULTS_JSON OUT_DIR

Writes, for the scenarios present in the results:
  memory.png              memory: RSS and live keys over the run
  latency-cdf-envoy.png   envoy: latency CDF through Envoy, each filter against none
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


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        res = json.load(f)
    out = sys.argv[2]
    if res.get("memory"):
        memory_plot(res["memory"], out)
    if res.get("envoy"):
        cdf_plot(res["envoy"].get("cdfs") or [], out, "latency-cdf-envoy.png",
                 "HTTP latency through Envoy: no filter, ext_authz (no-op server, ratelimit-authz), the quota filter")


if __name__ == "__main__":
    main()
