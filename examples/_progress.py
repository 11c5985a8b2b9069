"""The long examples' progress bar: a rich bar on a terminal, nothing at all anywhere else.

An example wraps its loop and leaves its prints as they are::

    with ProgressBar(args.episodes, "episodes", enabled=args.progress) as bar:
        for _ in range(args.episodes):
            ...
            print(f"Episode {episode} ...")  # above the bar on a terminal, a plain line otherwise
            bar.advance()

When stdout is a terminal (and ``TERM`` is not ``dumb``), the bar is drawn at
the bottom of the screen with the units done, the time spent and the time left,
and what the example prints (stdout and rank 0's stderr) scrolls above it: rich
redirects both while the bar is live. Anywhere else (piped, redirected to a
file, under the tests) or with ``--no-progress``, the bar does nothing: the
example's prints are the plain lines they always were, byte for byte. rich
drops the colours itself where ``NO_COLOR`` is set.
"""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["ProgressBar"]


class ProgressBar:
    """A progress bar over ``total`` units on a terminal; a no-op where stdout is not one.

    Args:
        total: the units the loop will do (episodes, epochs, seconds...).
        unit: their name, shown after the count ("3/60 episodes").
        description: shown before the bar; :meth:`update` changes it.
        enabled: ``False`` (``--no-progress``) turns the bar off on a terminal too.
        console: the rich console to draw on; by default one on stdout, a
            terminal only where ``sys.stdout.isatty()`` (not merely where
            ``FORCE_COLOR`` is set, so piped output always stays plain).
    """

    def __init__(
        self,
        total: float,
        unit: str,
        *,
        description: str = "",
        enabled: bool = True,
        console: Console | None = None,
    ) -> None:
        if console is None:  # soft_wrap: the terminal wraps long lines as it would without the bar
            console = Console(force_terminal=sys.stdout.isatty(), soft_wrap=True)
        self.console = console
        self._progress: Progress | None = None
        self._task = TaskID(0)
        if enabled and console.is_terminal and not console.is_dumb_terminal:
            digits = 0 if float(total).is_integer() else 1
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn(f"{{task.completed:.{digits}f}}/{{task.total:.{digits}f}} {{task.fields[unit]}}"),
                TimeElapsedColumn(),
                TextColumn("elapsed,"),
                TimeRemainingColumn(),
                TextColumn("left"),
                console=console,
                refresh_per_second=4,
            )
            self._task = self._progress.add_task(description, total=total, unit=unit)

    @property
    def shown(self) -> bool:
        """Whether there is a bar on screen (a terminal, and not ``--no-progress``)."""
        return self._progress is not None

    def advance(self, units: float = 1) -> None:
        """Count ``units`` more done."""
        if self._progress is not None:
            self._progress.advance(self._task, units)

    def update(self, *, completed: float | None = None, description: str | None = None) -> None:
        """Set the units done so far (a time-bound loop: the seconds elapsed) or the description."""
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, description=description)

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
