"""PNG plots of benchmark tables (matplotlib, the ``bench`` extra), one helper per shape.

Every benchmark's ``--plot PATH`` writes its table as a bar chart through this module,
headless (the ``Agg`` backend). The caption names the clock, the baseline and the load
average, so a plot read without its table still says what was measured.
"""
from __future__ import annotations

import os


def _pyplot():
    """``matplotlib.pyplot`` on the headless backend.

    Raises:
        SystemExit: matplotlib is not installed (``pip install -e '.[bench]'``).
    """
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib ({e}); install the bench extra: "
                         "pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str, title: str, caption: str) -> None:
    """Titles and captions ``fig``, writes it to ``path`` (PNG; its directory is
    created) and closes it."""
    fig.suptitle(title, fontsize=10)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05 if caption else 0, 1, 0.96))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as ``"1.2 / 0.9 / 0.7"``."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def bar_panels(path: str, title: str, panels: list[dict], caption: str = "",
               columns: int | None = None) -> None:
    """Write horizontal bar charts to ``path`` (PNG), ``columns`` per row of the grid.

    Args:
        path: output file; its directory is created.
        title: figure title.
        panels: one dict per panel: ``labels`` (list of str, top to bottom), ``values``
            (list of float or None: None draws no bar and writes "-"), ``xlabel``,
            optional ``title``, ``log`` (log x axis), ``fmt`` (value label format,
            default ``"{:,.0f}"``), ``ref`` (an x value drawn as a dashed line, e.g. 1.0
            on a ratio axis) and ``hatched`` (labels whose bars are hatched, e.g. prefix
            runs).
        caption: text under the panels (clock, baseline, load).
        columns: panels per row (default: all in one row).
    """
    plt = _pyplot()
    columns = columns or len(panels)
    grid_rows = -(-len(panels) // columns)
    bars_per_panel = max(len(p["labels"]) for p in panels)
    height = (0.4 * bars_per_panel + 1.2) * grid_rows + 0.8
    fig, axes = plt.subplots(grid_rows, columns, squeeze=False, figsize=(5.2 * columns, height))
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    for ax, p in zip(flat, panels):
        labels = p["labels"][::-1]
        values = p["values"][::-1]
        hatched = set(p.get("hatched", ()))
        ys = range(len(labels))
        bars = ax.barh(list(ys), [v or 0 for v in values], color="#4c72b0")
        for bar, label in zip(bars, labels):
            if label in hatched:
                bar.set_hatch("//")
                bar.set_facecolor("#a6bddb")
        ax.set_yticks(list(ys), labels, fontsize=8)
        if p.get("log"):
            ax.set_xscale("log")
        else:  # few ticks, with thousands separators, so large values do not overlap
            from matplotlib.ticker import FuncFormatter, MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.xaxis.set_major_formatter(
                FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 10 else f"{x:g}"))
        fmt = p.get("fmt", "{:,.0f}")
        for y, v in zip(ys, values):
            ax.annotate("-" if v is None else fmt.format(v), (v or 0, y), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=7)
        if p.get("ref") is not None:
            ax.axvline(p["ref"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(p["xlabel"], fontsize=8)
        ax.margins(x=0.25)
        if p.get("title"):
            ax.set_title(p["title"], fontsize=9)
    _save(plt, fig, path, title, caption)


def line_chart(path: str, title: str, xs: list[float], series: dict[str, list[float]], xlabel: str,
               ylabel: str, caption: str = "") -> None:
    """Write one line per series against ``xs`` to ``path`` (PNG), for a quantity that
    evolves over a run (e.g. state bytes per epoch).

    Args:
        path: output file; its directory is created.
        title: figure title.
        xs: x values, shared by every series.
        series: ``{label: y values}``, each as long as ``xs``.
        xlabel / ylabel: axis labels.
        caption: text under the chart (clock, sizes, load).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, ys in series.items():
        ax.plot(xs, ys, marker=".", label=label)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    _save(plt, fig, path, title, caption)
