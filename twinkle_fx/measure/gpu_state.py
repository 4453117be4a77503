"""The clocks, power and temperature a GPU ran at while a measurement ran (``nvidia-smi``).

Two timings compare only when the GPU ran both at the same clocks. A GPU at its power or thermal limit
lowers its SM clock, and the same kernels then take longer: two runs of one training step on an H200 at its
power cap spent 5% apart in the same cuBLAS kernels. The samples are means over a whole step: GEMMs at the cap
run at the clock their own power allows, below the mean that the memory-bound kernels between them lift, so
a like mean clock does not make like GEMM clocks; a repeated row of the same code (``--repeat-first``) shows
the spread. :class:`GpuStateSampler`
runs ``nvidia-smi``'s own sampling loop (``--loop-ms``) in a child process while the timed calls run, so
sampling costs the measured process nothing, and :class:`GpuState` says what it saw: the SM clock's mean and
minimum against the GPU's maximum, the power draw against its limit, the hottest reading, and whether the
driver reported a power or thermal slowdown in any sample.

Where there is no CUDA device or no ``nvidia-smi`` (the CPU, a container without the tool), nothing is
sampled and the state is None.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["GpuState", "GpuStateSampler", "QUERY", "gpu_state_from_csv"]

# nvidia-smi --query-gpu fields, in the order parsed below; drivers before the "clocks_event_reasons" names
# (R535) reject the last three, and the sampler then asks for the first five only
QUERY = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu",
         "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.hw_slowdown",
         "clocks_event_reasons.sw_thermal_slowdown")
_BASE_FIELDS = 5
_SLOWDOWNS = ("power cap", "hardware slowdown", "thermal slowdown")


@dataclass
class GpuState:
    """What the samples taken during a measurement showed (clocks in MHz, power in W, temperature in °C)."""

    samples: int
    sm_mhz_mean: float
    sm_mhz_min: float
    sm_mhz_max_supported: float | None = None
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    temperature_c_max: float | None = None
    slowdowns: tuple[str, ...] = ()  # reasons the driver gave for lower clocks in any sample

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "slowdowns": list(self.slowdowns)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuState:
        return cls(**{**data, "slowdowns": tuple(data.get("slowdowns", ()))})

    def describe(self) -> str:
        """One line for a progress log.

        Examples:
            >>> GpuState(4, 1755.0, 1650.0, 1980.0, 640.4, 700.0, 71.0, ("power cap",)).describe()
            'SM clock 1755 MHz (min 1650 of 1980), 640 W of 700, up to 71 C; slowed by: power cap'
        """
        clock = f"SM clock {self.sm_mhz_mean:.0f} MHz (min {self.sm_mhz_min:.0f}"
        clock += f" of {self.sm_mhz_max_supported:.0f})" if self.sm_mhz_max_supported else ")"
        parts = [clock]
        if self.power_w_mean is not None:
            parts.append(f"{self.power_w_mean:.0f} W" + (f" of {self.power_limit_w:.0f}" if self.power_limit_w else ""))
        if self.temperature_c_max is not None:
            parts.append(f"up to {self.temperature_c_max:.0f} C")
        line = ", ".join(parts)
        return line + (f"; slowed by: {', '.join(self.slowdowns)}" if self.slowdowns else "")


def _number(field: str) -> float | None:
    try:
        return float(field)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def gpu_state_from_csv(lines: Iterable[str]) -> GpuState | None:
    """The state behind ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits`` lines (None when no
    line has an SM clock). Lines of another shape (a driver's warning) are skipped.

    Examples:
        >>> gpu_state_from_csv(["1980, 1980, 310.5, 700.00, 55, Not Active, Not Active, Not Active",
        ...                     "1650, 1980, 690.1, 700.00, 70, Active, Not Active, Not Active"])
        GpuState(samples=2, sm_mhz_mean=1815.0, sm_mhz_min=1650.0, sm_mhz_max_supported=1980.0, \
power_w_mean=500.3, power_limit_w=700.0, temperature_c_max=70.0, slowdowns=('power cap',))
    """
    clocks, powers, temperatures, maxima, limits, slowdowns = [], [], [], [], [], set()
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) not in (_BASE_FIELDS, len(QUERY)) or _number(fields[0]) is None:
            continue
        clocks.append(_number(fields[0]))
        for values, field in ((maxima, fields[1]), (powers, fields[2]), (limits, fields[3]),
                              (temperatures, fields[4])):
            if _number(field) is not None:
                values.append(_number(field))
        slowdowns.update(reason for reason, flag in zip(_SLOWDOWNS, fields[5:]) if flag == "Active")
    if not clocks:
        return None
    return GpuState(
        samples=len(clocks), sm_mhz_mean=round(sum(clocks) / len(clocks), 1), sm_mhz_min=min(clocks),
        sm_mhz_max_supported=max(maxima) if maxima else None,
        power_w_mean=round(sum(powers) / len(powers), 1) if powers else None,
        power_limit_w=max(limits) if limits else None,
        temperature_c_max=max(temperatures) if temperatures else None,
        slowdowns=tuple(reason for reason in _SLOWDOWNS if reason in slowdowns),
    )


@functools.cache
def _query(index: int) -> tuple[str, tuple[str, ...]] | None:
    """(``--id``, fields) that nvidia-smi answers for CUDA device ``index`` (one probe query each): the GPU's UUID,
    since CUDA and nvidia-smi may number GPUs differently (CUDA_VISIBLE_DEVICES renumbers them), else its index;
    :data:`QUERY`, else its first fields where the driver rejects the slowdown reasons. None when none answers."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    for selector in ([f"GPU-{uuid}"] if uuid is not None else []) + [str(index)]:
        for fields in (QUERY, QUERY[:_BASE_FIELDS]):
            try:
                probe = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                                        "--format=csv,noheader,nounits", f"--id={selector}"],
                                       capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return None
            if probe.returncode == 0 and gpu_state_from_csv(probe.stdout.splitlines()) is not None:
                return selector, fields
    return None


class GpuStateSampler:
    """Samples the GPU of ``device`` every ``interval_ms`` while the ``with`` block runs; :attr:`state` is then
    the :class:`GpuState` (None without a CUDA device or ``nvidia-smi``, or when no sample arrived).

    ``command`` replaces the ``nvidia-smi`` invocation (it must print :data:`QUERY`'s CSV lines until stopped).

    Examples:
        >>> with GpuStateSampler(torch.device("cpu")) as sampler:
        ...     pass
        >>> sampler.state is None
        True
    """

    def __init__(self, device: torch.device | str, *, interval_ms: int = 100,
                 command: Sequence[str] | None = None) -> None:
        device = torch.device(device)
        self.state: GpuState | None = None
        self._command: list[str] | None = None
        if command is not None:
            self._command = list(command)
        elif device.type == "cuda" and shutil.which("nvidia-smi"):
            query = _query(device.index if device.index is not None else torch.cuda.current_device())
            if query is not None:
                selector, fields = query
                self._command = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                 f"--loop-ms={interval_ms}", f"--id={selector}"]
        self._process: subprocess.Popen | None = None
        self._output = None

    def __enter__(self) -> GpuStateSampler:
        if self._command is not None:
            # to a file, not a pipe: nobody reads the pipe while the measurement runs, and a full one would stall
            self._output = tempfile.TemporaryFile(mode="w+")
            try:
                self._process = subprocess.Popen(self._command, stdout=self._output, stderr=subprocess.DEVNULL,
                                                  stdin=subprocess.DEVNULL)
            except OSError:
                self._output.close()
                self._output = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._output.seek(0)
        self.state = gpu_state_from_csv(self._output.read().splitlines())
        self._output.close()
