"""What every ``twinkle-fx`` subcommand shares: one-line usage errors, argument types checked without
importing torch, the device choice (and with it the Triton interpreter), progress on stderr."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CommandError", "positive_int", "non_negative_int", "positive_float", "device_name", "comma_list",
           "check_names", "check_output", "choose_device", "checked_device", "quiet_profiler", "note",
           "StepProgress"]


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


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


# the device types torch.device accepts (c10's DeviceType names; tests/cli checks each against torch)
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hip", "xla", "meta", "hpu", "mtia", "maia", "ipu", "ve", "fpga",
                "lazy", "vulkan", "opengl", "opencl", "ideep", "privateuseone")


def device_name(text: str) -> str:
    """argparse type: a device name (``cpu``, ``cuda``, ``cuda:1``, ...), checked without importing torch;
    whether this machine has it is :func:`choose_device`'s question."""
    match = re.fullmatch(r"([a-z]+)(:\d+)?", text)
    if match is None or match.group(1) not in DEVICE_TYPES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device name (examples: cpu, cuda, cuda:1)")
    return text


def comma_list(text: str) -> list[str]:
    """argparse type: a comma-separated list, blanks dropped, at least one item."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError("is empty; give a comma-separated list")
    return list(dict.fromkeys(items))


def check_names(option: str, given: Iterable[str], valid: Iterable[str], what: str = "name") -> None:
    """A :class:`CommandError` naming each of ``given`` that is not in ``valid``, and the valid ones."""
    valid = list(valid)
    unknown = [name for name in given if name not in valid]
    if unknown:
        raise CommandError(f"{option}: unknown {what}(s) {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")


def check_output(option: str, path: Path | None, **kind: bool | str) -> None:
    """:func:`twinkle_fx.core.outputs.check_output_path` (``kind``: ``directory``, ``parents``, ``file_name``)
    as a :class:`CommandError`: an output the run could not write is refused before the run."""
    from ..core.outputs import check_output_path

    try:
        check_output_path(option, path, **kind)
    except ValueError as e:
        raise CommandError(str(e)) from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def choose_device(text: str | None, *, default_cpu: bool, command: str, full_size: str | None = None,
                  force: bool = False):
    """The ``torch.device`` a command runs on: ``--device``, else the CPU when ``default_cpu``, else CUDA
    when this machine has it. On the CPU the Triton kernels run through the interpreter, switched on
    here, before anything imports triton (so the command never restarts itself).

    ``full_size`` names the work of a run without ``--tiny``: on the CPU that takes hours, so it is
    refused (the same words for every command) unless ``force``.
    """
    import torch

    if text is not None:
        device = checked_device(text)
    elif default_cpu or not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        if full_size is not None and not force:
            raise CommandError(f"a full-size run on the CPU ({full_size} through the Triton interpreter) takes "
                               "hours; use --tiny for the CPU smoke test, a GPU (--device cuda), or --force to run "
                               "it anyway")
        from ..core.settings import use_triton_interpreter

        try:
            use_triton_interpreter(command=command)
        except RuntimeError as e:  # triton imported already, or an interpreter that cannot run: said in one line
            raise CommandError(str(e)) from None
    return device


def quiet_profiler() -> None:
    """Keep torch.profiler's C++ side (kineto) from printing its ``USDT ... profiler_start`` markers on
    stderr. They are printed at kineto's highest log level, so only a level above it silences them
    (its error lines too: the profile a command takes is reported, or its failure, by the command).
    A level the user set wins."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


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
