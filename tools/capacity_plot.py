#!/usr/bin/python3
"""Draws `dropless capacity` results: dropped assignments and wasted FLOPs
(in percent) against the capacity factor, one line per routing and token
count, with the capacity factor from which padding takes 30% of the expert
GEMMs marked. `dropless capacity --plot` runs this script (compiled into the
command); it can also be run by hand:

    dropless capacity CASE --routing uniform,zipf:1.2 --cf 1:4:0.05 --json r.json
    /usr/bin/python3 tools/capacity_plot.py r.json out.png png

The figure is 10 x 4 inches at 100 dpi: 1000 x 400 pixels as PNG,
720 x 288 pt as SVG. Only the JSON is read; nothing is recomputed."""
import json
import sys

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 4.0, 100


def label(s):
    name = s["routing"] if s["routing"] != "zipf" else "Zipf(%g)" % s["zipf_s"]
    return "%s, T=%d" % (name, s["tokens"])


def curves(s):
    """(cf, dropped %, waste %) per capacity factor; the drop policy changes
    which assignments drop, never how many, so the first policy's rows do."""
    first = s["capacity_rows"][0]["policy"] if s["capacity_rows"] else None
    rows = [r for r in s["capacity_rows"] if r["policy"] == first]
    return ([r["cf"] for r in rows], [r["dropped_pct"] for r in rows],
            [r["waste_pct"] for r in rows])


def main(argv):
    if len(argv) != 4 or argv[3] not in ("png", "svg"):
        sys.stderr.write("usage: capacity_plot.py RESULTS.json OUT png|svg\n")
        return 2
    with open(argv[1]) as f:
        data = json.load(f)
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write("matplotlib is not installed for %s (Debian: python3-matplotlib)\n"
                         % sys.executable)
        return 1
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "dropless"  # reproducible SVG ids
    import matplotlib.pyplot as plt

    fig, (ax_d, ax_w) = plt.subplots(1, 2, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    mark = None
    for i, s in enumerate(data["series"]):
        cf, dropped, waste = curves(s)
        color = "C%d" % (i % 10)
        ax_d.plot(cf, dropped, drawstyle="steps-post", color=color, label=label(s))
        wm = s["waste_mark"]
        mark = wm["fraction"]
        wlabel = label(s)
        if wm["cf_above"] is not None:
            wlabel += ": %.0f%% for cf > %.3g" % (100 * mark, wm["cf_above"])
            if cf and min(cf) <= wm["cf_above"] <= max(cf):
                ax_w.axvline(wm["cf_above"], color=color, linestyle=":", linewidth=1)
        ax_w.plot(cf, waste, drawstyle="steps-post", color=color, label=wlabel)
        tile = [r for r in s["dropless_rows"] if r["block"] == 128]
        if tile:
            ax_w.axhline(tile[0]["waste_pct"], color=color, linestyle="--", linewidth=0.8)
    if mark is not None:
        ax_w.axhline(100 * mark, color="grey", linewidth=0.8)
    layer = data["layer"]
    ax_d.set_title("dropped assignments (dropless: 0)", fontsize=10)
    ax_w.set_title("wasted expert-GEMM FLOPs (dashed: dropless, 128-row tiles)", fontsize=10)
    for ax, what in ((ax_d, "dropped assignments (%)"), (ax_w, "padded rows = wasted FLOPs (%)")):
        ax.set_xlabel("capacity factor")
        ax.set_ylabel(what)
        ax.set_ylim(bottom=0)
        ax.grid(True, linewidth=0.3)
    ax_d.legend(fontsize=7)
    ax_w.legend(fontsize=7, loc="center right")
    fig.suptitle("%s: E = %d, k = %d, capacity rule %s" % (data["case"], layer["experts"],
                                                           layer["top_k"], data["rule"]),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[2], format=argv[3], dpi=DPI, metadata={"Date": None} if argv[3] == "svg"
                else {"Software": None})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
