#!/usr/bin/env python3
"""plot_bench.py IN.json [OUT.png] - one 1600x900 PNG from a `qrun bench` / `qrun compare` JSON.

bench:   loss per step (warm-up steps hollow) | step time per step with its median |
         step time by kernel group when a profile is present, else the summary figures.
compare: loss of A and B with their absolute difference under it (verdict in the title) |
         step time of A and B | kernel groups of A and B side by side when both have a
         profile, else the main summary ratios b/a.
Fields may be null where not measured (GPU fields on a CPU machine): what is there is plotted,
text says "n/a". OUT defaults to IN with .png. Bad input: a message naming the file, exit 2.
"""
import json
import math
import os
import sys

W, H, DPI = 16, 9, 100
SUMMARY = [("tokens_per_s", "tokens/s", "{:,.0f}"), ("mfu", "MFU", "{:.1%}"),
           ("step_time_median_s", "step median", "{:.3f} s"), ("step_time_p90_s", "step p90", "{:.3f} s"),
           ("first_step_s", "first step", "{:.3f} s"), ("gpu_kernels_per_step", "GPU kernels/step", "{:,.0f}"),
           ("cpu_ops_per_step", "CPU ops/step", "{:,.0f}"), ("gpu_busy", "GPU busy", "{:.1%}"),
           ("peak_gpu_allocated_mib", "peak GPU alloc", "{:,.0f} MiB"), ("padding_fraction", "padding", "{:.1%}")]


class Bad(Exception):
    """Input that cannot be plotted; the message names the field and the reason."""


def num(v, where, null=True):
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and math.isinf(v)):
        raise Bad(f"{where}: expected a number{' or null' if null else ''}, got {json.dumps(v)}")
    return float(v)


def obj(v, where, null=False):
    if v is None and null:
        return None
    if not isinstance(v, dict):
        raise Bad(f"{where}: expected an object, got {type(v).__name__ if v is not None else 'null'}")
    return v


def seq(v, where):
    if not isinstance(v, list):
        raise Bad(f"{where}: expected a list, got {type(v).__name__ if v is not None else 'null'}")
    return v


def fmt(v, spec):
    return "n/a" if v is None else spec.format(v)


def bench(d, where):
    """The fields of one bench object, checked and with nulls kept as None."""
    d = obj(d, where)
    steps = []
    for i, s in enumerate(seq(d.get("per_step"), f"{where}.per_step")):
        s = obj(s, f"{where}.per_step[{i}]")
        steps.append({"step": num(s.get("step"), f"{where}.per_step[{i}].step", null=False),
                      "warmup": bool(s.get("warmup")),
                      "time_s": num(s.get("time_s"), f"{where}.per_step[{i}].time_s", null=False),
                      "loss": num(s.get("loss"), f"{where}.per_step[{i}].loss")})
    summary = obj(d.get("summary"), f"{where}.summary")
    summary = {k: num(summary.get(k), f"{where}.summary.{k}") for k, _, _ in SUMMARY}
    prof = obj(d.get("profile"), f"{where}.profile", null=True)
    groups = None
    if prof is not None:
        groups = {}
        for i, g in enumerate(seq(prof.get("groups"), f"{where}.profile.groups")):
            g = obj(g, f"{where}.profile.groups[{i}]")
            name = g.get("group")
            if not isinstance(name, str):
                raise Bad(f"{where}.profile.groups[{i}].group: expected a string")
            groups[name] = (num(g.get("time_ms"), f"{where}.profile.groups[{i}].time_ms", null=False),
                            num(g.get("share"), f"{where}.profile.groups[{i}].share"))
    device, qrun = obj(d.get("device"), f"{where}.device", True) or {}, obj(d.get("qrun"), f"{where}.qrun", True) or {}
    label = d.get("label") or d.get("recipe") or where
    return {"label": str(label), "device": device.get("name") or "n/a",
            "commit": str(qrun.get("commit") or "n/a")[:10], "steps": steps, "summary": summary, "groups": groups}


def floats(v, where):
    return [math.nan if x is None else num(x, f"{where}[{i}]") for i, x in enumerate(seq(v, where))]


def headline(b):
    s = b["summary"]
    return (f"{b['label']}  |  {b['device']}  |  qrun {b['commit']}  |  "
            f"{fmt(s['tokens_per_s'], '{:,.0f}')} tokens/s  |  MFU {fmt(s['mfu'], '{:.1%}')}")


def empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_loss(ax, b):
    pts = [(s["step"], s["loss"], s["warmup"]) for s in b["steps"] if s["loss"] is not None]
    if not pts:
        return empty(ax, "no loss recorded")
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color="C0", lw=1.2, label=b["label"])
    warm = [p for p in pts if p[2]]
    if warm:
        ax.plot([p[0] for p in warm], [p[1] for p in warm], "o", mfc="none", color="C0", label="warm-up")
    ax.plot([p[0] for p in pts if not p[2]], [p[1] for p in pts if not p[2]], ".", color="C0")


def plot_times(ax, b, color="C0", legend_label=None):
    st = b["steps"]
    if not st:
        return empty(ax, "no steps")
    ax.plot([s["step"] for s in st], [s["time_s"] * 1e3 for s in st], ".-", color=color, lw=1,
            label=legend_label or "step time")
    warm = [s for s in st if s["warmup"]]
    if warm:
        ax.plot([s["step"] for s in warm], [s["time_s"] * 1e3 for s in warm], "o", mfc="none", color=color,
                label=None if legend_label else "warm-up")
    med = b["summary"]["step_time_median_s"]
    if med is not None:
        ax.axhline(med * 1e3, color=color, ls="--", lw=1, label=f"median {med * 1e3:.1f} ms")


def plot_groups(ax, b):
    items = sorted(b["groups"].items(), key=lambda kv: kv[1][0])
    if not items:
        return empty(ax, "profile has no kernel groups")
    bars = ax.barh([k for k, _ in items], [t for _, (t, _) in items], color="C2")
    ax.bar_label(bars, [fmt(sh, "{:.1%}") for _, (_, sh) in items], padding=3, fontsize=9)
    ax.set_xlabel("time per step (ms)")
    ax.margins(x=0.15)


def plot_summary_text(ax, b):
    ax.axis("off")
    s = b["summary"]
    rows = [f"{name:<18}{fmt(s[k], spec):>16}" for k, name, spec in SUMMARY]
    ax.text(0.02, 0.95, "summary (no profile)\n\n" + "\n".join(rows), va="top", family="monospace",
            fontsize=11, transform=ax.transAxes)


def draw_bench(fig, b):
    axes = fig.subplots(1, 3)
    plot_loss(axes[0], b)
    axes[0].set(title="loss per step", xlabel="step", ylabel="loss")
    plot_times(axes[1], b)
    axes[1].set(title="step time", xlabel="step", ylabel="ms")
    if b["groups"] is not None:
        plot_groups(axes[2], b)
        axes[2].set_title("step time by kernel group (share %)")
    else:
        plot_summary_text(axes[2], b)
    for ax in axes[:2]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=9)
    fig.suptitle(headline(b), fontsize=13)


def draw_compare(fig, d):
    a, b = bench(d.get("a"), "a"), bench(d.get("b"), "b")
    n = obj(d.get("numerics"), "numerics")
    steps = floats(n.get("steps"), "numerics.steps")
    la, lb = floats(n.get("loss_a"), "numerics.loss_a"), floats(n.get("loss_b"), "numerics.loss_b")
    diff = floats(n.get("loss_abs_diff"), "numerics.loss_abs_diff")
    if not len(steps) == len(la) == len(lb) == len(diff):
        raise Bad("numerics: steps, loss_a, loss_b and loss_abs_diff differ in length")
    tol = obj(n.get("tolerance"), "numerics.tolerance", null=True) or {}
    tol_loss = num(tol.get("loss_abs"), "numerics.tolerance.loss_abs")
    verdict, first = str(n.get("verdict") or "n/a"), n.get("first_divergent_step")
    ratios = obj(d.get("ratios"), "ratios", null=True) or {}

    gs = fig.add_gridspec(2, 3, height_ratios=[3, 1])
    ax_loss = fig.add_subplot(gs[0, 0])
    ax_diff = fig.add_subplot(gs[1, 0], sharex=ax_loss)
    ax_time, ax_right = fig.add_subplot(gs[:, 1]), fig.add_subplot(gs[:, 2])
    if steps:
        ax_loss.plot(steps, la, ".-", color="C0", label=a["label"])
        ax_loss.plot(steps, lb, ".-", color="C1", label=b["label"])
        ax_loss.legend(fontsize=9)
        positive = [x if x > 0 else math.nan for x in diff]  # a log axis has no 0
        ax_diff.semilogy(steps, positive, ".-", color="C3")
        if all(math.isnan(x) for x in positive):
            empty(ax_diff, "|A - B| = 0 at every step")
        if tol_loss:
            ax_diff.axhline(tol_loss, color="gray", ls="--", lw=1, label=f"tolerance {tol_loss:g}")
            ax_diff.legend(fontsize=8)
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            for ax in (ax_loss, ax_diff):
                ax.axvline(first, color="C3", ls=":", lw=1)
    else:
        empty(ax_loss, "no common steps")
    ax_loss.set(title="loss per step", ylabel="loss")
    ax_diff.set(xlabel="step", ylabel="|A - B|")

    plot_times(ax_time, a, "C0", a["label"])
    plot_times(ax_time, b, "C1", b["label"])
    ax_time.set(title="step time", xlabel="step", ylabel="ms")
    if ax_time.get_legend_handles_labels()[0]:
        ax_time.legend(fontsize=9)

    if a["groups"] is not None and b["groups"] is not None:
        names = sorted(set(a["groups"]) | set(b["groups"]),
                       key=lambda g: max(a["groups"].get(g, (0,))[0], b["groups"].get(g, (0,))[0]))
        y, h = list(range(len(names))), 0.4
        for off, x, color in ((h / 2, a, "C0"), (-h / 2, b, "C1")):
            ax_right.barh([v + off for v in y], [x["groups"].get(g, (0,))[0] for g in names], h,
                          color=color, label=x["label"])
        ax_right.set_yticks(y, names)
        ax_right.set(title="step time by kernel group", xlabel="time per step (ms)")
        ax_right.legend(fontsize=9)
    else:
        pairs = [(name, num(ratios.get(k), f"ratios.{k}")) for k, name, _ in SUMMARY]
        pairs = [(name, r) for name, r in pairs if r is not None][::-1]
        if pairs:
            bars = ax_right.barh([p[0] for p in pairs], [p[1] for p in pairs], color="C4")
            ax_right.bar_label(bars, [f"{p[1]:.2f}x" for p in pairs], padding=3, fontsize=9)
            ax_right.axvline(1.0, color="gray", lw=1)
            ax_right.margins(x=0.15)
        else:
            empty(ax_right, "no ratios measured")
        ax_right.set(title="summary ratios B / A", xlabel="B / A")
    first_txt = f", first divergent step {first}" if first is not None else ""
    fig.suptitle(f"A: {headline(a)}\nB: {headline(b)}\nnumerics: {verdict}{first_txt}", fontsize=12)


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    src = argv[1]
    out = argv[2] if len(argv) == 3 else os.path.splitext(src)[0] + ".png"
    try:
        with open(src, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        return fail(src, e.strerror or str(e))
    except (ValueError, UnicodeDecodeError) as e:
        return fail(src, f"not valid JSON ({e})")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(W, H), dpi=DPI, layout="constrained")
    try:
        kind = obj(data, "top level").get("kind")
        if kind == "bench":
            draw_bench(fig, bench(data, "bench"))
        elif kind == "compare":
            draw_compare(fig, data)
        else:
            raise Bad(f"kind: expected \"bench\" or \"compare\", got {json.dumps(kind)}")
        fig.savefig(out, dpi=DPI)
    except Bad as e:
        return fail(src, str(e))
    except OSError as e:
        return fail(out, f"cannot write ({e.strerror or e})")
    except Exception as e:  # anything else the data provoked in matplotlib: still no traceback
        return fail(src, f"cannot plot ({type(e).__name__}: {e})")
    finally:
        plt.close(fig)
    print(f"plot: {out} ({W * DPI}x{H * DPI})")
    return 0


def fail(path, reason):
    print(f"plot_bench: {path}: {reason}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
