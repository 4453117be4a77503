"""Collect the log records of a block at a level or above, wherever they go: torch configures some of its loggers
(fake tensors', Dynamo's) with handlers of their own and ``propagate=False``, so a handler on the root logger, or on
"torch", misses them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def records_at(level: int = logging.ERROR) -> Iterator[list[logging.LogRecord]]:
    """The records of ``level`` or above logged inside the block, by any logger."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append
    loggers = [logging.getLogger()] + [logger for logger in logging.root.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger) and not logger.propagate]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def describe(records: list[logging.LogRecord], limit: int = 3) -> str:
    """The first records, each with its traceback, for an assertion message."""
    formatter = logging.Formatter()
    return "\n\n".join(f"{r.name}: {r.getMessage()}\n{formatter.formatException(r.exc_info) if r.exc_info else ''}"
                       for r in records[:limit])
