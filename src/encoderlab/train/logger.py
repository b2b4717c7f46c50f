"""Run logging: a tqdm bar, metrics.csv, TensorBoard event files and, at the end, a curves PNG."""

from __future__ import annotations

import csv
import io
import logging
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from encoderlab.io import atomic_write_text, progress_bar
from encoderlab.viz.curves import plot_metrics

log = logging.getLogger(__name__)

# rtd_* and replaced_fraction: ELECTRA's discriminator (mlm_* is then its generator); ce_loss: distillation;
# cos_loss: distillation's cosine to the teacher, or MLM's to its anchor.
COLUMNS = ("step", "elapsed_s", "loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "rtd_loss",
           "rtd_accuracy", "replaced_fraction", "ce_loss", "cos_loss", "lr", "grad_norm", "tokens_per_s",
           "eval_loss", "eval_mlm_loss", "eval_mlm_accuracy", "eval_perplexity", "eval_nsp_accuracy",
           "eval_rtd_loss", "eval_rtd_accuracy", "eval_replaced_fraction", "eval_ce_loss", "eval_cos_loss")


class RunLogger:
    """Writes what a run measured; a no-op on ranks other than 0 (enabled=False)."""

    def __init__(self, run_dir: Path | None, recipe: dict[str, Any] | None, enabled: bool = True, resume: bool = False,
                 resume_step: int = 0, columns: tuple[str, ...] = COLUMNS, visuals: bool = True) -> None:
        """recipe: written to recipe.yaml when given; visuals: TensorBoard event files and the curves PNG."""
        self.shown = enabled  # rank 0 shows the bar and notes; it writes files only into a run folder
        self.enabled, self.started, self.columns = enabled and run_dir is not None, time.time(), columns
        self.run_dir, self.visuals, self.tb = Path(run_dir or "."), visuals, None
        self.csv_path = self.run_dir / "metrics.csv"
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if recipe is not None:
            atomic_write_text(self.run_dir / "recipe.yaml", yaml.safe_dump(recipe, sort_keys=False))
        self._start_csv(resume, resume_step)
        if not visuals:
            return
        try:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step if resume else None)
        except ImportError:  # TensorBoard logs are a convenience: metrics.csv holds the same numbers
            log.warning("tensorboardX is not installed: no TensorBoard logs (metrics.csv still written)")

    def _start_csv(self, resume: bool, resume_step: int) -> None:
        """A fresh CSV, or on resume the old one without rows past the checkpoint (they will be redone)."""
        rows = []
        if resume and self.csv_path.is_file():
            rows = [r for r in csv.DictReader(self.csv_path.open(encoding="utf-8")) if int(r["step"]) <= resume_step]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, self.columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.csv_path, buffer.getvalue())

    def progress(self, start: int, total: int, show: bool = True, name: str = "train") -> tqdm:
        """The progress bar (steps), shown on rank 0 only."""
        return progress_bar(total=total, initial=start, desc=name, unit="step", disable=not (show and self.shown))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row to metrics.csv and the same scalars to TensorBoard."""
        if not self.enabled:
            return
        row = {"step": step, "elapsed_s": round(time.time() - self.started, 2)}
        row.update({k: v for k, v in metrics.items() if k in self.columns})
        with self.csv_path.open("a", encoding="utf-8", newline="") as handle:
            csv.DictWriter(handle, self.columns).writerow(row)
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)

    def note(self, message: str) -> None:
        """A line for the person watching."""
        if self.shown:
            tqdm.write(message, file=sys.stderr)

    def finish(self) -> Path | None:
        """Close the logs and draw the curves PNG; returns its path."""
        if not (self.enabled and self.visuals):
            return None
        if self.tb is not None:
            self.tb.close()
        return plot_metrics(self.csv_path, self.run_dir / "curves.png")


def sittings(rows: list[dict[str, str]]) -> list[tuple[int, float]]:
    """(first step, seconds) of each sitting of a run, from its metrics.csv rows: elapsed_s restarts at 0 on --resume."""
    out: list[tuple[int, float]] = []
    previous = float("inf")
    for row in rows:
        elapsed = float(row["elapsed_s"])
        if elapsed < previous:
            out.append((int(row["step"]), 0.0))
        out[-1] = (out[-1][0], elapsed)
        previous = elapsed
    return out
