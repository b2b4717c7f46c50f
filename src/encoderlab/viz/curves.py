"""Training curves from a run's metrics.csv (loss on the left, accuracy on the right); a benchmark's per-seed spread."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from encoderlab.io import atomic_write


# (metrics.csv column, label, panel): every objective's terms; a run draws the columns it logged.
CURVES = (
    ("mlm_loss", "train MLM loss", "loss"), ("eval_mlm_loss", "held-out MLM loss", "loss"),
    ("nsp_loss", "train NSP/SOP loss", "loss"), ("rtd_loss", "train RTD loss (unweighted)", "loss"),
    ("eval_rtd_loss", "held-out RTD loss", "loss"), ("ce_loss", "train distillation KL", "loss"),
    ("cos_loss", "train cosine loss", "loss"),
    ("mlm_accuracy", "train MLM accuracy", "accuracy"), ("eval_mlm_accuracy", "held-out MLM accuracy", "accuracy"),
    ("eval_nsp_accuracy", "held-out NSP/SOP accuracy", "accuracy"),
    ("rtd_accuracy", "train RTD accuracy", "accuracy"), ("eval_rtd_accuracy", "held-out RTD accuracy", "accuracy"),
)


def plot_metrics(csv_path: str | Path, out_path: str | Path, title: str | None = None) -> Path:
    """Draw a run's train/held-out losses and accuracies (MLM, NSP/SOP, RTD, distillation) against steps."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot backend switched under a notebook

    with Path(csv_path).open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    fig = Figure(figsize=(11, 4))
    left, right = fig.subplots(1, 2)
    for key, label, side in CURVES:
        points = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
        if points:
            steps, values = zip(*points)
            axis = left if side == "loss" else right
            axis.plot(steps, values, marker="o" if key.startswith("eval") else None, markersize=3, label=label)
    left.set(xlabel="step", ylabel="loss", title="loss")
    right.set(xlabel="step", ylabel="accuracy", title="accuracy")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    fig.suptitle(title or Path(csv_path).parent.name)
    fig.tight_layout()
    out_path = Path(out_path)
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return out_path


def plot_spread(values: dict[str, list[float]], out_path: str | Path, title: str) -> Path:
    """One row per figure: each seed's value as a dot and the median as a bar, so the spread over seeds shows."""
    from matplotlib.figure import Figure  # a bare Figure, as plot_metrics

    names = list(values)
    fig = Figure(figsize=(8, 1 + 0.4 * len(names)))
    axis = fig.subplots()
    for row, name in enumerate(names):
        axis.scatter(values[name], [row] * len(values[name]), s=18, color="tab:blue", alpha=0.7)
        axis.scatter([statistics.median(values[name])], [row], marker="|", s=300, color="black")
    axis.set(yticks=range(len(names)), yticklabels=names, xlabel="score (per seed; bar: median)", title=title)
    axis.invert_yaxis()
    axis.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out_path = Path(out_path)
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return out_path
