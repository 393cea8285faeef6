"""Plots for a `conductor-bench replay` result: PNGs written next to its JSON.

    python bench/plot.py bench/results/replay-<time>.json [--out DIR]

Writes <name>-latency-cdf.png (query latency CDF per prompt length), <name>-hit-rate.png
(token hit rate by routing policy against the infinite-cache upper bound) and
<name>-ingest-rss.png (blocks published per second and RSS during the replay: the
harness's own, conductor included, for the default in-process conductor; the conductor's
alone with --conductor-bin, or --conductor with --pid; the JSON's conductor_mode says which).
Needs matplotlib (`make bench` installs it into .venv).
"""

import argparse
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def latency_cdf(res, path):
    cdfs = (res.get("conductor") or {}).get("query_latency_cdf") or []
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=80)
    for c in cdfs:
        ys = [p / 100 for p in range(len(c["percentiles_us"]))]
        ax.plot(c["percentiles_us"], ys, label="%s (%d queries)" % (c["prompts"], c["count"]))
    ax.set_xscale("log")
    ax.set_xlabel("/query latency seen by the router (µs, log scale)")
    ax.set_ylabel("fraction of queries")
    ax.set_title("Query latency CDF by prompt length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def hit_rate(res, path):
    """Bars of each policy's token hit rate, in percent like everything on the plot."""
    pols = res.get("policies") or []
    names = [p["policy"] for p in pols]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=80)
    xs = range(len(pols))
    bound = res.get("infinite_cache_hit_rate")
    top = max([100 * p[k] for p in pols for k in ("hit_rate", "device_hit_rate")] + [100 * (bound or 0), 1])
    top = min(100, 10 * math.ceil(top * 1.2 / 10))
    for shift, key, label in ((-0.2, "hit_rate", "any tier"), (0.2, "device_hit_rate", "device")):
        values = [100 * p[key] for p in pols]
        bars = ax.bar([x + shift for x in xs], values, width=0.4, label=label)
        # Inside the bar where it is tall enough (clear of the upper-bound line), else above it.
        tall = [v >= 0.15 * top for v in values]
        ax.bar_label(bars, ["%.1f%%" % v if t else "" for v, t in zip(values, tall)], label_type="center", fontsize=8, color="white")
        ax.bar_label(bars, ["" if t else "%.1f%%" % v for v, t in zip(values, tall)], fontsize=8, padding=2)
    if bound is not None:
        ax.axhline(100 * bound, color="black", linestyle="--", label="upper bound (infinite cache) %.1f%%" % (100 * bound))
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, top)
    ax.set_ylabel("prompt tokens served from cache (%)")
    ax.set_title("Hit rate by routing policy (%d requests, %d instances)" % (res.get("requests", 0), res.get("instances", 0)))
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def rss_owner(mode):
    """Whose memory the timeline's RSS is, from the result's conductor_mode: the harness's
    own process when the conductor ran inside it, the conductor's when it ran apart."""
    if mode == "in-process":
        return "harness + in-process conductor"
    if mode in ("spawned", "external"):
        return "conductor (%s process)" % mode
    return "process (conductor mode not recorded)"


def ingest_rss(res, path, mode):
    tl = (res.get("conductor") or {}).get("timeline") or []
    owner = rss_owner(mode)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 5.4), dpi=80, sharex=True)
    ts, rate = [], []
    for prev, cur in zip(tl, tl[1:]):
        dt = cur["t_s"] - prev["t_s"]
        if dt <= 0:
            continue
        blocks = (cur["stored_blocks"] + cur["removed_blocks"]) - (prev["stored_blocks"] + prev["removed_blocks"])
        ts.append(cur["t_s"])
        rate.append(blocks / dt)
    a1.plot(ts, rate)
    a1.set_ylabel("blocks stored+removed / s")
    a1.set_title("Ingest rate during the replay")
    a1.grid(True, alpha=0.3)
    rss = [(p["t_s"], p["rss_bytes"] / 2**20) for p in tl if p.get("rss_bytes")]
    if rss:
        a2.plot([r[0] for r in rss], [r[1] for r in rss], color="tab:red")
        a2.set_title("RSS of the %s" % owner)
    else:
        a2.set_title("RSS not measured (an external conductor needs --pid)")
    a2.set_ylabel("RSS (MiB)")
    a2.set_xlabel("seconds since the first request")
    a2.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result", help="replay JSON written by conductor-bench")
    ap.add_argument("--out", help="directory for the PNGs (default: beside the JSON)")
    ap.add_argument("--prefix", help="file name prefix (default: the JSON's name)")
    args = ap.parse_args()
    with open(args.result) as f:
        doc = json.load(f)
    res = doc.get("result", doc)
    base = args.prefix or os.path.splitext(os.path.basename(args.result))[0]
    out = args.out or os.path.dirname(os.path.abspath(args.result))
    os.makedirs(out, exist_ok=True)
    mode = doc.get("conductor_mode", "")
    plots = (
        ("latency-cdf", lambda path: latency_cdf(res, path)),
        ("hit-rate", lambda path: hit_rate(res, path)),
        ("ingest-rss", lambda path: ingest_rss(res, path, mode)),
    )
    for suffix, draw in plots:
        path = os.path.join(out, "%s-%s.png" % (base, suffix))
        draw(path)
        print("plot: %s" % path)


if __name__ == "__main__":
    main()
