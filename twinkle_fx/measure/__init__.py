"""Measuring kernels, as a library: what the checklist (:mod:`twinkle_fx.checklist`) and the
benchmark harness (:mod:`twinkle_fx.bench`) both time and record with.

- :mod:`.clock`: the device clock (CUDA events, or ``time.perf_counter`` on the CPU) and peak memory;
- :mod:`.kernel_timing`: :func:`~.kernel_timing.benchmark_kernel`, one callable timed the way the
  custom-kernel guide does (``twinkle_fx.benchmark_kernel``);
- :mod:`.profiler_events`: the device time of a ``torch.profiler`` row;
- :mod:`.gpu_state`: the SM clock, power and temperature a GPU ran at during timed calls (``nvidia-smi``);
- :mod:`.overlap`: exposed communication (NCCL time no compute kernel hides) from a profile's kernels;
- :mod:`.environment`: where a measurement ran (device, versions, commit).
"""
