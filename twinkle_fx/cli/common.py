"""What every ``twinkle-fx`` subcommand shares: one-line usage errors, argument types, device checks,
progress on stderr."""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["CommandError", "positive_int", "non_negative_int", "checked_device", "note", "StepProgress"]


class CommandError(Exception):
    """A bad argument or environment for a command: ``twinkle-fx`` prints ``twinkle-fx <command>: error:
    <message>`` (one line, no traceback) and exits with status 2."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def checked_device(text: str):
    """``torch.device(text)`` for a device this machine has; else a :class:`CommandError` saying which
    devices it has."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(f"--device {text!r} is not a device name (examples: cpu, cuda, cuda:1)") from None
    if device.type == "cpu":
        return device
    module = getattr(torch, device.type, None)
    available = getattr(module, "is_available", lambda: False)()
    if not available:
        raise CommandError(f"--device {text}: no {device.type} device on this machine; use --device cpu "
                           "(the Triton kernels then run through the interpreter)")
    count = getattr(module, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        raise CommandError(f"--device {text}: this machine has {count} {device.type} device(s) (0 to {count - 1})")
    return device


def note(line: str) -> None:
    """A progress line on stderr (stdout keeps the report, so it can be redirected)."""
    print(line, file=sys.stderr, flush=True)


class StepProgress:
    """Per-step progress of one long loop: a tqdm bar on stderr when tqdm is installed, else a plain
    line at most every ``every_s`` seconds (and at the end).

    ``tick()`` runs between steps, outside any timed interval, so it never adds to a measured step.
    """

    def __init__(self, total: int, label: str, *, every_s: float = 5.0) -> None:
        self.total, self.label, self.every_s = total, label, every_s
        self.done = 0
        self._last = time.perf_counter()
        try:
            from tqdm.auto import tqdm
        except ModuleNotFoundError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr, leave=False,
                             mininterval=0.5, dynamic_ncols=True)

    def tick(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update()
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s or self.done == self.total:
            self._last = now
            note(f"    {self.label}: {self.done}/{self.total}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
