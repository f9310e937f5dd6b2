"""The flights job's output as a picture: mean departure delay per route and month.

``monthly_route_delays`` folds the daily windows of ``route_daily_delays`` into months
(exactly: each day's mean is weighted by its flights with a reported delay, flights
minus cancelled ones, as a flight has a delay exactly when it departed);
``delay_heatmap_png`` draws the busiest routes as a heatmap (matplotlib, headless);
``delay_plot_metadata`` is the Dagster metadata the sink asset gets after each run
(``dkvstream.assets.definitions``). From the shell::

    python -m dkvstream.examples.flights_plot --store .dkvstream --out docs/img/flights-delays.png
"""
from __future__ import annotations

import argparse
import base64
import io
import sys

import pandas as pd
import pyarrow as pa

# Routes drawn, the busiest first (224 routes do not fit one readable picture).
ROUTES_SHOWN = 25


def monthly_route_delays(table: pa.Table) -> pd.DataFrame:
    """Per route and UTC month of the window start: flights and the mean departure delay.

    Args:
        table: rows of the ``route_daily_delays`` sink (``dkvstream.examples.flights.OUTPUT_SCHEMA``).

    Returns:
        Columns ``route`` (``origin-dest``), ``month`` (1-12), ``flights``,
        ``dep_delay_mean`` (minutes; NaN for a month without a departed flight), sorted by
        route and month.
    """
    df = table.select(["origin", "dest", "window_start", "flights", "cancelled", "dep_delay_mean"]).to_pandas()
    df["route"] = df["origin"] + "-" + df["dest"]
    df["month"] = df["window_start"].dt.month
    df["departed"] = df["flights"] - df["cancelled"]
    df["delay_sum"] = df["dep_delay_mean"].fillna(0.0) * df["departed"]
    g = df.groupby(["route", "month"], as_index=False)[["flights", "departed", "delay_sum"]].sum()
    g["dep_delay_mean"] = g["delay_sum"] / g["departed"].where(g["departed"] > 0)
    return g[["route", "month", "flights", "dep_delay_mean"]].sort_values(["route", "month"], ignore_index=True)


def delay_heatmap_png(monthly: pd.DataFrame, routes: int = ROUTES_SHOWN, dpi: int = 80) -> bytes:
    """A heatmap PNG: the ``routes`` busiest routes (rows, busiest on top) by month
    (columns), colour the mean departure delay in minutes, each cell labelled.

    Args:
        monthly: ``monthly_route_delays``'s frame.
        routes: routes drawn.
        dpi: resolution.

    Returns:
        The PNG's bytes.

    Raises:
        ImportError: matplotlib is not installed (the ``bench`` extra has it).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    busiest = monthly.groupby("route")["flights"].sum().sort_values(ascending=False).index[:routes]
    grid = (monthly[monthly["route"].isin(busiest)]
            .pivot(index="route", columns="month", values="dep_delay_mean").reindex(busiest))
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(grid) + 1.6))
    image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn_r", vmin=0, vmax=40)
    ax.set_xticks(range(len(grid.columns)), [f"{m:02d}" for m in grid.columns])
    ax.set_yticks(range(len(grid)), grid.index)
    for (i, j), value in pd.DataFrame(grid.to_numpy()).stack().items():
        ax.text(j, i, f"{round(value)}", ha="center", va="center", fontsize=7)
    ax.set_xlabel("month (UTC)")
    ax.set_title(f"Mean departure delay (minutes), the {len(grid)} busiest routes from New York")
    fig.colorbar(image, ax=ax, label="minutes", fraction=0.03)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi)
    plt.close(fig)
    return out.getvalue()


def delay_plot_metadata(table: pa.Table) -> dict:
    """Dagster metadata of the ``route_daily_delays`` sink: ``delay_plot``, the heatmap
    (``delay_heatmap_png``) as Markdown with the PNG inline; ``{}`` for an empty table
    or without matplotlib (the asset then simply has no picture)."""
    from dagster import MetadataValue

    if table.num_rows == 0:
        return {}
    try:
        png = delay_heatmap_png(monthly_route_delays(table))
    except ImportError:
        return {}
    return {"delay_plot": MetadataValue.md(
        f"![mean departure delay per route and month](data:image/png;base64,{base64.b64encode(png).decode()})")}


def main(argv: list[str] | None = None) -> int:
    """Write the heatmap of a store's ``route_daily_delays`` output to a PNG file."""
    from dkvstream.assets.resources import ObjectStoreResource
    from dkvstream.examples.flights import flights_job

    p = argparse.ArgumentParser(prog="python -m dkvstream.examples.flights_plot", description=__doc__.splitlines()[0])
    p.add_argument("--store", default=None, help="object-store root (default: $DKVSTREAM_STORE or .dkvstream)")
    p.add_argument("--job-name", default="flights", help="the flights job's name (default flights)")
    p.add_argument("--out", required=True, help="PNG file to write")
    a = p.parse_args(argv)
    store = (ObjectStoreResource() if a.store is None else ObjectStoreResource(root_uri=a.store)).open()
    job = flights_job(name=a.job_name)  # only its name and sinks are used
    table = job.sinks["main"].read(store, job.prefix)
    if table.num_rows == 0:
        print(f"no output of job {job.name} under {store.root_uri}: run it first", file=sys.stderr)
        return 1
    with open(a.out, "wb") as f:
        f.write(delay_heatmap_png(monthly_route_delays(table), dpi=100))
    print(f"wrote {a.out} ({table.num_rows:,} daily rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
