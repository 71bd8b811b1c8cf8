"""Writes RESULTS_DIR/report.md (Markdown tables) and PNG charts from the JSON files a
benchmark run left in RESULTS_DIR: meta.json, roofline.json, cells.json and, when the
prompt-cache check ran, cache_regression.json. Any of them may be missing, and cells.json
may hold only part of the grid (a run that is still going or was cut off): what is absent
shows as "–". Charts need matplotlib; without it the report is written without them.

usage: python bench/report.py RESULTS_DIR
"""

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

OURS = "mlx-serve"
REF = "mlx_lm.server"
MISSING = "–"


@dataclass
class Results:
    """What one run wrote, with the grid the report walks: contexts × concurrency rows
    and one column group per configuration."""

    meta: dict
    roofline: dict | None
    cells: list
    cache: dict | None
    contexts: list
    concurrency: list
    configs: list  # [(config name, whether mlx_lm.server has that configuration)]
    index: dict  # (server, config, context, concurrency) -> cell

    def cell(self, server, config, context, concurrency):
        return self.index.get((server, config, context, concurrency))

    def servers(self, has_ref):
        return (OURS, REF) if has_ref else (OURS,)


# ---------------------------------------------------------------- loading


def load_json(path):
    """The parsed file, or None when the run has not written it (yet). A file cut off
    mid-write by a killed run counts as missing too, with a warning, so the rest of the
    report still comes out."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        print(f"report.py: ignoring {path}: {e}", file=sys.stderr)
        return None


def config_columns(meta, cells):
    """(config, has_ref) in meta.json's order; "ref": null means mlx_lm.server has no such
    configuration, so that config gets no mlx_lm.server or ratio column. Without meta.json,
    the configs the cells name, in the order they first appear."""
    if meta.get("configs"):
        return [(name, (spec or {}).get("ref") is not None) for name, spec in meta["configs"].items()]
    names = dict.fromkeys(c["config"] for c in cells)
    return [(n, any(c["config"] == n and c["server"] == REF for c in cells)) for n in names]


def load_results(results_dir):
    meta = load_json(results_dir / "meta.json") or {}
    cells = load_json(results_dir / "cells.json") or []
    index = {(c["server"], c["config"], c["context"], c["concurrency"]): c for c in cells}
    return Results(
        meta=meta,
        roofline=load_json(results_dir / "roofline.json"),
        cells=cells,
        cache=load_json(results_dir / "cache_regression.json"),
        # meta.json names the planned grid; the cells are the fallback when it is missing.
        contexts=meta.get("contexts") or sorted({c["context"] for c in cells}),
        concurrency=meta.get("concurrency") or sorted({c["concurrency"] for c in cells}),
        configs=config_columns(meta, cells),
        index=index,
    )


def ok_value(cell, key):
    """The metric of a cell that ran; None for a missing, skipped or failed cell, whose
    metrics are absent or null."""
    if cell is None or cell.get("status") != "ok":
        return None
    return cell.get(key)


def roofline_tps(res, config, context, concurrency):
    """The roofline the suite computed for this point; any server's cell of the config
    carries it (the servers share the model and the KV format)."""
    for server in (OURS, REF):
        cell = res.cell(server, config, context, concurrency)
        if cell and cell.get("roofline_tps") is not None:
            return cell["roofline_tps"]
    return None


# ---------------------------------------------------------------- formatting


def fmt_tps(x):
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}"


def fmt_ms(x):
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def fmt_s(x):
    return f"{x:.2f}"


def fmt_mib(x):
    return f"{x:.0f}"


def context_label(n):
    """4096 -> "4K": the suite's contexts are powers of two, and "4K" reads faster."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def yes_no(flag):
    return {True: "yes", False: "no"}.get(flag, "n/a")


def cell_text(cell, key, fmt):
    """A table entry: the formatted metric, or why there is none."""
    if cell is None:
        return MISSING
    if cell.get("status") in ("skipped", "failed"):
        return cell["status"]
    value = ok_value(cell, key)
    return MISSING if value is None else fmt(value)


def ratio_text(ours, ref, key):
    o, r = ok_value(ours, key), ok_value(ref, key)
    return f"{o / r:.2f}" if o is not None and r else MISSING


def share_text(cell, key, roof):
    """tok/s with its share of the roofline, e.g. "310.2 (8%)"."""
    text = cell_text(cell, key, fmt_tps)
    value = ok_value(cell, key)
    if value is not None and roof:
        text += f" ({100 * value / roof:.0f}%)"
    return text


def median_text(values, fmt):
    """Median of a per-client list, leaving out clients that reported nothing; "n/a" when
    none did (mlx_lm.server does not report cached tokens, for one)."""
    present = [v for v in values or [] if v is not None]
    return fmt(statistics.median(present)) if present else "n/a"


def md_table(header, rows, label_columns=1):
    """Markdown table; the leading label columns align left, the numbers right."""
    align = ["---"] * label_columns + ["---:"] * (len(header) - label_columns)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


# ---------------------------------------------------------------- report sections


def header_section(meta):
    model = meta.get("model") or {}
    device = meta.get("device", "?")
    memory = f" ({meta['device_memory_gib']:.1f} GiB)" if meta.get("device_memory_gib") else ""
    weights = f", {model['weight_bytes'] / 1e9:.2f} GB of weights" if model.get("weight_bytes") else ""
    quantization = f", {model['quantization']}" if model.get("quantization") else ""
    lines = [
        f"# mlx-serve vs mlx_lm.server — {model.get('name', '?')} on {device}",
        "",
        f"- date: {meta.get('date', '?')}",
        f"- device: {device}{memory}",
        f"- host: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores, {meta.get('os', '?')}",
        f"- backend: {meta.get('backend', '?')}",
        f"- commit: {meta.get('commit', '?')}",
        f"- mlx-serve: {meta.get('mlx_serve', '?')}",
        f"- mlx / mlx-lm: {meta.get('mlx', '?')} / {meta.get('mlx_lm', '?')}",
        f"- model: {model.get('name', '?')}{weights}{quantization}",
        f"- generated tokens per request: {meta.get('gen_tokens', '?')}",
    ]
    if meta.get("command"):
        lines += ["- command:", "", "  ```", f"  {meta['command']}", "  ```"]
    lines += [
        "",
        "ratio = mlx-serve / mlx_lm.server; above 1 is better for tok/s, below 1 is better "
        "for TTFT and memory.",
        "",
    ]
    return lines


def roofline_rows(res, points, key):
    """One row per (context, concurrency): per config the roofline, then each server's
    measured tok/s with its share of that roofline."""
    rows = []
    for context, concurrency, label in points:
        row = label
        for config, has_ref in res.configs:
            roof = roofline_tps(res, config, context, concurrency)
            row.append(fmt_tps(roof) if roof is not None else MISSING)
            row += [share_text(res.cell(s, config, context, concurrency), key, roof)
                    for s in res.servers(has_ref)]
        rows.append(row)
    return rows


def roofline_header(res, first):
    """The label columns, then per config its roofline and a column per server."""
    header = list(first)
    for config, has_ref in res.configs:
        header += [f"{config} roofline"] + [f"{config} {s}" for s in res.servers(has_ref)]
    return header


def roofline_section(res):
    roof = res.roofline
    if roof is None and not any(c.get("roofline_tps") is not None for c in res.cells):
        return []
    lines = ["## Roofline", ""]
    if roof:
        lines += [
            f"- memory bandwidth: {roof['bandwidth_gbs']:.1f} GB/s ({roof.get('bandwidth_method', '?')})",
            f"- weight bytes per token: {roof['weight_bytes_per_token'] / 1e9:.3f} GB "
            f"({roof.get('weight_bytes_note', '?')})",
        ]
        if roof.get("kv_bytes_per_token"):
            lines.append("- KV cache bytes per token: "
                         + ", ".join(f"{name} {b:,}" for name, b in roof["kv_bytes_per_token"].items()))
        if roof.get("quantized_kv_start") is not None:
            lines.append(f"- quantized KV caches (--kv-bits) are quantized from token "
                         f"{roof['quantized_kv_start']:,} on; shorter caches stay unquantized")
        lines.append("")
    lines += [
        "The roofline is the decode tok/s the memory bandwidth allows: each step reads the "
        "weights once plus every stream's KV cache. Measured tok/s follow with their share "
        "of it in parentheses.",
        "",
    ]
    if 1 in res.concurrency:
        single = [(ctx, 1, [context_label(ctx)]) for ctx in res.contexts]
        lines += ["### Concurrency 1: decode tok/s", ""]
        lines += md_table(roofline_header(res, ["context"]), roofline_rows(res, single, "decode_tps"))
    multi = [(ctx, c, [context_label(ctx), str(c)]) for ctx in res.contexts
             for c in res.concurrency if c > 1]
    if multi:
        lines += ["### Concurrency above 1: aggregate decode tok/s (all streams, prefill excluded)", ""]
        lines += md_table(roofline_header(res, ["context", "concurrency"]),
                          roofline_rows(res, multi, "decode_aggregate_tps"), label_columns=2)
    return lines


METRICS = [  # title, what it measures, cell field, formatter
    ("Decode tok/s per stream", "Median over the streams of each stream's decode tok/s",
     "decode_tps", fmt_tps),
    ("Aggregate tok/s (wave)", "All generated tokens / wall time of the wave, prefill included",
     "aggregate_tps", fmt_tps),
    ("TTFT ms (median)", "Time to first token, median over the wave's requests", "ttft_ms", fmt_ms),
    ("End-to-end s (median)", "Request latency, median over the wave's requests", "e2e_s", fmt_s),
    ("Peak RSS MiB", "Peak resident memory of the server process", "peak_rss_mib", fmt_mib),
    ("MLX peak MiB", "Peak memory MLX allocated, as the server reports it", "mlx_peak_mib", fmt_mib),
]


def metric_table(res, key, fmt):
    header = ["context", "concurrency"]
    for config, has_ref in res.configs:
        header += [f"{config} {s}" for s in res.servers(has_ref)] + [f"{config} ratio"] * has_ref
    rows = []
    for context in res.contexts:
        for concurrency in res.concurrency:
            row = [context_label(context), str(concurrency)]
            for config, has_ref in res.configs:
                ours = res.cell(OURS, config, context, concurrency)
                row.append(cell_text(ours, key, fmt))
                if has_ref:
                    ref = res.cell(REF, config, context, concurrency)
                    row += [cell_text(ref, key, fmt), ratio_text(ours, ref, key)]
            rows.append(row)
    return md_table(header, rows, label_columns=2)


def metrics_section(res):
    lines = []
    for title, meaning, key, fmt in METRICS:
        lines += [f"## {title}", "", f"{meaning}.", ""] + metric_table(res, key, fmt)
    return lines


def problems_section(res):
    """Skipped and failed cells grouped by reason, so a reason many cells share (say, a
    context that does not fit in memory) is listed once."""
    groups = {}
    for cell in res.cells:
        if cell.get("status") in ("skipped", "failed"):
            reason = cell.get("reason") or "no reason recorded"
            where = (f"{cell['server']} {cell['config']} "
                     f"{context_label(cell['context'])}×{cell['concurrency']}")
            groups.setdefault((cell["status"], reason), []).append(where)
    if not groups:
        return []
    lines = ["## Skipped and failed cells", ""]
    lines += [f"- **{status}**: {reason} ({', '.join(where)})" for (status, reason), where in groups.items()]
    return lines + [""]


def verdict_line(verdict):
    if not verdict:
        return "Verdict: none recorded."
    result = {True: "PASS", False: "FAIL"}.get(verdict.get("ok"), "n/a")
    notes = f" {verdict['notes']}" if verdict.get("notes") else ""
    return (f"Verdict: **{result}** (cache hits on repeats: {yes_no(verdict.get('hits_on_repeats'))}; "
            f"memory stable: {yes_no(verdict.get('memory_stable'))}; "
            f"errors: {verdict.get('errors', '?')}).{notes}")


def tokens_text(n):
    return "?" if n is None else f"{n:.0f}"


def cache_section(cache):
    if not cache:
        return []
    lines = [
        "## Prompt-cache regression",
        "",
        "All clients at once; each round every client sends its own long document with a new "
        "question, then a new short request. From round 2 the documents should come from the "
        "prompt cache (cached tokens reported, lower TTFT) while memory stays flat. TTFT and "
        "cached tokens are medians over the clients; RSS and MLX active memory are read after "
        "each round.",
        "",
    ]
    header = ["round", "long TTFT ms", "short TTFT ms", "long cached tokens", "errors",
              "RSS MiB", "MLX active MiB"]
    for key, run in cache.items():
        lines += [
            f"### {key}",
            "",
            f"{run.get('clients', '?')} clients, long prompt {tokens_text(run.get('long_prompt_tokens'))} "
            f"tokens, short prompt {tokens_text(run.get('short_prompt_tokens'))} tokens.",
            "",
        ]
        rows = [[str(r.get("round", "?")),
                 median_text(r.get("long_ttft_ms"), fmt_ms),
                 median_text(r.get("short_ttft_ms"), fmt_ms),
                 median_text(r.get("long_cached_tokens"), lambda x: f"{x:.0f}"),
                 str(r.get("errors", "?")),
                 fmt_mib(r["rss_mib"]) if r.get("rss_mib") is not None else "n/a",
                 fmt_mib(r["mlx_active_mib"]) if r.get("mlx_active_mib") is not None else "n/a"]
                for r in run.get("rounds", [])]
        lines += md_table(header, rows) + [verdict_line(run.get("verdict")), ""]
    return lines


def charts_section(charts):
    if not charts:
        return []
    return ["## Charts", ""] + [f"![{title}]({name})\n" for title, name in charts]


# ---------------------------------------------------------------- charts


@dataclass
class Chart:
    file: str
    title: str
    ylabel: str
    key: str
    scale: float = 1.0  # divides the cell value, e.g. MiB -> GiB
    log_y: bool = False
    roofline: bool = False


def chart_specs(res):
    # MLX peak is what the model and caches took; RSS adds the process around it, so it
    # stands in only when no server reported an MLX peak (the CPU backend, say).
    if any(ok_value(c, "mlx_peak_mib") is not None for c in res.cells):
        memory = Chart("memory.png", "MLX peak memory", "GiB", "mlx_peak_mib", scale=1024)
    else:
        memory = Chart("memory.png", "Peak RSS (no MLX peak reported)", "GiB", "peak_rss_mib", scale=1024)
    return [
        # Log scale: the roofline is often ten times the measured speed at short contexts,
        # and on a linear axis it would flatten every measured line to the bottom.
        Chart("decode.png", "Decode tok/s per stream", "tok/s per stream (log scale)", "decode_tps",
              log_y=True, roofline=True),
        Chart("aggregate.png", "Aggregate tok/s (wave, prefill included)", "tok/s, all streams",
              "aggregate_tps"),
        Chart("ttft.png", "TTFT (median)", "ms (log scale)", "ttft_ms", log_y=True),
        memory,
    ]


def chart_points(res, server, config, concurrency, chart):
    """y per context, NaN where a cell has no result: matplotlib breaks the line there
    instead of drawing across a failed or skipped cell as if it had been measured.
    None when the series has no result at all."""
    ys = []
    for context in res.contexts:
        value = ok_value(res.cell(server, config, context, concurrency), chart.key)
        ys.append(math.nan if value is None else value / chart.scale)
    return None if all(math.isnan(y) for y in ys) else (res.contexts, ys)


def roofline_points(res, concurrency):
    """Per-stream roofline of the first (baseline) config: the aggregate roofline shared
    by the streams."""
    config = res.configs[0][0]
    points = []
    for context in res.contexts:
        roof = roofline_tps(res, config, context, concurrency)
        if roof is not None:
            points.append((context, roof / concurrency))
    return config, points


SERVER_STYLE = {OURS: {"linestyle": "-", "marker": "o"}, REF: {"linestyle": "--", "marker": "x"}}


def set_log_y(ax):
    """Log y with plain numbers at 1, 2 and 5 of each decade: a short range (200 to 4,000
    ms, say) would otherwise show a single labelled power of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def draw_panel(ax, res, chart, concurrency):
    """One concurrency level; returns whether anything was drawn."""
    drawn = False
    for i, (config, has_ref) in enumerate(res.configs):
        for server in res.servers(has_ref):
            points = chart_points(res, server, config, concurrency, chart)
            if points:
                ax.plot(*points, color=f"C{i % 10}", label=f"{config} {server}",
                        linewidth=1.8, markersize=6, **SERVER_STYLE[server])
                drawn = True
    if chart.roofline:
        config, points = roofline_points(res, concurrency)
        if points:
            ax.plot(*zip(*points), color="grey", linestyle=":", linewidth=1.2,
                    label=f"roofline ({config})", zorder=1)
    ax.set_title(f"concurrency {concurrency}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(res.contexts, [context_label(c) for c in res.contexts])
    ax.tick_params(axis="x", which="minor", bottom=False)
    ax.set_xlabel("context (prompt tokens)")
    ax.grid(True, alpha=0.3)
    if chart.log_y and drawn:
        set_log_y(ax)
    elif not chart.log_y:
        ax.set_ylim(bottom=0)
    if not drawn:
        ax.text(0.5, 0.5, "no results", transform=ax.transAxes, ha="center", color="grey")
    return drawn


def draw_chart(res, chart):
    """The figure, or None when no cell of the chart has a result yet."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4.5), layout="constrained")
    axes = fig.subplots(1, len(res.concurrency), squeeze=False)[0]
    drawn = [draw_panel(ax, res, chart, c) for ax, c in zip(axes, res.concurrency)]
    if not any(drawn):
        return None
    axes[0].set_ylabel(chart.ylabel)
    # A series may have points in one panel only, so the legend gathers all panels.
    legend = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside right center")
    model = (res.meta.get("model") or {}).get("name", "?")
    fig.suptitle(f"{chart.title} — {model} on {res.meta.get('device', '?')}")
    return fig


def write_charts(res, out_dir):
    """Writes the PNGs; returns (title, file name) of those written."""
    try:
        import matplotlib
    except ImportError:
        print("report.py: charts skipped: matplotlib is not installed", file=sys.stderr)
        return []
    # Figures are built with matplotlib.figure.Figure, not pyplot: savefig then renders
    # PNGs with the Agg canvas and never opens a display, and a program that imports
    # this module keeps its own backend and rc settings.
    written = []
    with matplotlib.rc_context({"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10}):
        for chart in chart_specs(res):
            fig = draw_chart(res, chart) if res.concurrency and res.contexts else None
            if fig is not None:
                fig.savefig(out_dir / chart.file, dpi=100)
                written.append((chart.title, chart.file))
    return written


# ---------------------------------------------------------------- entry points


def write_report(results_dir):
    """Writes report.md and the charts into results_dir; returns the report's path."""
    results_dir = Path(results_dir)
    res = load_results(results_dir)
    charts = write_charts(res, results_dir)
    lines = (header_section(res.meta) + roofline_section(res) + metrics_section(res)
             + problems_section(res) + cache_section(res.cache) + charts_section(charts))
    path = results_dir / "report.md"
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    return path


def main():
    parser = argparse.ArgumentParser(description="Markdown report and charts of a benchmark run.")
    parser.add_argument("results_dir", type=Path, help="folder with meta.json, cells.json, ...")
    args = parser.parse_args()
    if not args.results_dir.is_dir():
        parser.error(f"{args.results_dir} is not a folder")
    print(write_report(args.results_dir))


if __name__ == "__main__":
    main()
