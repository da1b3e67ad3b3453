"""A tqdm progress bar for interactive runs: rank 0, and only when the stream is a terminal.

Batch jobs (stderr redirected to a file, msrun's worker logs) get no bar: its carriage returns
would fill the log. While the bar is shown, log records that would go to the console are
routed through `tqdm.write` (`tqdm.contrib.logging.logging_redirect_tqdm`, for the root and
`mf_train` loggers), so the per-step loss line prints above the bar instead of breaking it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import IO, Any

from ..observe.callbacks import Callback, StepRecord, TrainContext


class ProgressBar(Callback):
    """Steps done out of `total_steps`, with the last loss and learning rate."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream
        self._bar: Any = None
        self._redirect = contextlib.ExitStack()

    def on_train_begin(self, ctx: TrainContext) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        if not ctx.is_main or not _is_terminal(stream):
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._bar = tqdm(total=ctx.total_steps, initial=ctx.start_step, file=stream,
                         unit="step", desc="train", dynamic_ncols=True)
        loggers = [logging.root, logging.getLogger("mf_train")]
        self._redirect.enter_context(logging_redirect_tqdm(loggers=loggers))

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self._bar is None:
            return
        self._bar.set_postfix(loss=f"{record.loss:.4f}", lr=f"{record.lr:.2e}", refresh=False)
        self._bar.update(record.step - self._bar.n)

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        if self._bar is None:
            return
        self._redirect.close()
        self._bar.close()
        self._bar = None


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
