"""Where ``check_kernels`` and its report types were first documented: they live in
:mod:`twinkle_fx.cli.checklist` (one module per checklist item)."""

from .cli.checklist import (CHECKLIST, SPEEDUP_BAR, CheckInputs, CheckReport, CorrectnessCase, KernelCheck,
                            SpeedCase, check_kernels)

__all__ = ["CHECKLIST", "SPEEDUP_BAR", "CheckInputs", "CheckReport", "CorrectnessCase", "KernelCheck", "SpeedCase",
           "check_kernels"]
