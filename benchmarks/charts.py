"""The current results as Markdown tables and matplotlib charts, from one source:
`benchmarks/results.json`.

`python benchmarks/charts.py` (or `nox -s charts`) rewrites every table block marked
`<!-- results:NAME -->` ... `<!-- /results:NAME -->` in README.md, docs/ and
benchmarks/README.md, and draws the charts into docs/images/. The benchmark scripts' figures
go into results.json first (`benchmarks/loss_curves.py` writes its own part); a test
(tests/integration/test_docs.py) fails when a table in a page differs from results.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
IMAGES = ROOT / "docs" / "images"
BLOCK = re.compile(r"<!-- results:(\w+) -->\n.*?<!-- /results:\1 -->", re.DOTALL)


def results() -> dict:
    return json.loads(RESULTS.read_text())


def pages() -> list[Path]:
    """Every page a results table may sit in."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").rglob("*.md"))]


def _cell(value: object) -> str:
    """A number as measured: integers with thousands separators, floats as written in
    results.json, those below 10 with at least two decimals (3.2 GiB is shown 3.20)."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        whole, _, decimals = repr(value).partition(".")
        return f"{int(whole):,}.{decimals.ljust(2 if abs(value) < 10 else 1, '0')}"
    return str(value)


def table(name: str, data: dict | None = None) -> str:
    """Result `name` as a Markdown table, the command that measures it below."""
    entry = (data or results())[name]
    if "layouts" in entry:
        entry = {**entry, **_loss_rows(entry)}
    lines = [f"**{entry['title']}.** {entry['what']}", "",
             "| " + " | ".join(entry["columns"]) + " |", "|" + "---|" * len(entry["columns"])]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in entry["rows"]]
    lines.append(f"\nReproduce: `{entry['command']}`")
    return "\n".join(lines)


def _loss_rows(entry: dict) -> dict:
    """The loss curves' table: first and last loss of each layout, and its largest relative
    difference from the first layout's (the one process) over all steps."""
    reference = next(iter(entry["layouts"].values()))
    rows = [[layout, f"{losses[0]:.6f}", f"{losses[-1]:.6f}",
             f"{max(abs(a - b) / b for a, b in zip(losses, reference, strict=True)):.1e}"]
            for layout, losses in entry["layouts"].items()]
    return {"columns": ["layout", "loss, step 1", f"loss, step {len(reference)}",
                        "largest relative difference from one process"], "rows": rows}


def block(name: str, data: dict | None = None) -> str:
    return f"<!-- results:{name} -->\n{table(name, data)}\n<!-- /results:{name} -->"


def synced(text: str, data: dict | None = None) -> str:
    """`text` with every results block rewritten from results.json."""
    return BLOCK.sub(lambda match: block(match.group(1), data), text)


def write_tables() -> None:
    data = results()
    for page in pages():
        text = page.read_text()
        if synced(text, data) != text:
            page.write_text(synced(text, data))
            print(f"updated {page.relative_to(ROOT)}", file=sys.stderr)


def draw_charts() -> list[Path]:
    """The PNGs of docs/images/, drawn from results.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = results()
    IMAGES.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update({"figure.figsize": (6, 3.6), "figure.dpi": 100, "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    drawn = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = IMAGES / name
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        drawn.append(path)

    memory = data["layout_memory"]
    stale = set(memory.get("older_rows", []))
    fig, ax = plt.subplots()
    for column, layout in enumerate(memory["columns"][1:], start=1):
        # on one rank every layout is the one process
        points = [(row[0], row[column] if row[column] is not None else row[1])
                  for row in memory["rows"] if row[0] not in stale]
        line, = ax.plot(*zip(*points, strict=True), marker="o", label=layout)
        for row in memory["rows"]:
            if row[0] in stale and row[column] is not None:
                ax.plot(row[0], row[column], marker="o", fillstyle="none",
                        color=line.get_color())
    ax.set(xlabel="ranks", ylabel="peak memory per rank, GiB", xticks=[1, 2, 4],
           title="127M Qwen3: the largest rank's peak, by layout", ylim=(0, None))
    if stale:
        ax.annotate("hollow: " + ", ".join(f"{r} ranks" for r in sorted(stale))
                    + ", an older measurement", (0.99, 0.02), xycoords="axes fraction",
                    ha="right", fontsize=8, color="gray")
    ax.legend(frameon=False, loc="lower left")
    save(fig, "memory_per_rank.png")

    speed = data["speed"]
    fig, ax = plt.subplots()
    labels = speed["columns"][1:]
    width = 0.25
    for i, label in enumerate(labels):
        ratios = [row[1 + i] / row[-1] for row in speed["rows"]]
        bars = ax.bar([x + (i - 1) * width for x in range(len(ratios))], ratios, width,
                      label=label)
        ax.bar_label(bars, fmt="%.2fx")
    ax.set_xticks(range(len(speed["rows"])), [f"{row[0]} model" for row in speed["rows"]])
    ax.set(ylabel="step time / PyTorch eager's", title="Step time against PyTorch eager (CPU)")
    ax.legend(frameon=False)
    save(fig, "step_time_vs_pytorch.png")

    curves = data["loss_curves"]
    fig, (ax, diff) = plt.subplots(2, 1, sharex=True, height_ratios=[3, 1.3],
                                   figsize=(6, 4.4))
    styles = ["-", "--", ":", "-."]
    reference = next(iter(curves["layouts"].values()))
    for (layout, losses), style in zip(curves["layouts"].items(), styles, strict=False):
        steps = range(1, len(losses) + 1)
        ax.plot(steps, losses, style, linewidth=2, label=layout)
        relative = [abs(a - b) / b for a, b in zip(losses, reference, strict=True)]
        diff.plot(steps, relative, style, linewidth=1.5)
    ax.set(ylabel="loss", title=f"{Path(curves['config']).stem}: the loss of every layout")
    ax.legend(frameon=False)
    diff.set(xlabel="step", ylabel="relative\ndifference", yscale="symlog",
             ylim=(0, 1e-5))
    diff.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([0, 1e-6, 1e-5]))
    diff.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    save(fig, "loss_by_layout.png")

    pipeline = data["pipeline_bubbles"]
    fig, ax = plt.subplots()
    schedules = list(dict.fromkeys(row[0] for row in pipeline["rows"]))
    counts = sorted({row[1] for row in pipeline["rows"]})
    for i, count in enumerate(counts):
        values = [next(row[2] for row in pipeline["rows"] if row[:2] == [schedule, count])
                  for schedule in schedules]
        bars = ax.bar([x + (i - 0.5) * 0.35 for x in range(len(schedules))], values, 0.35,
                      label=f"{count} micro-batches")
        ax.bar_label(bars, fmt="%.3f")
    ax.set_xticks(range(len(schedules)), schedules)
    ax.set(ylabel="bubble (idle share of a stage)", title="Pipeline bubbles, 2 stages")
    ax.legend(frameon=False)
    save(fig, "pipeline_bubbles.png")
    return drawn


def main() -> None:
    write_tables()
    for path in draw_charts():
        print(f"drew {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
