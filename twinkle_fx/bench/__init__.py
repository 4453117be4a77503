"""The benchmark harness behind ``twinkle-fx bench``.

The end-to-end benchmark runs a transformers training step under each backend
(:mod:`.backends`) on a named workload (:mod:`.workloads`), timed by :mod:`.timing`; the
microbenchmarks (:mod:`.micro`) time each twinkle_triton kernel against its references with the
copy bandwidth as roofline; :mod:`.report` judges and shows the results (table, JSON, PNG).

Examples:
    >>> from twinkle_fx.bench import ModelBenchOptions, run_model_bench, format_table
    >>> options = ModelBenchOptions(model="qwen2", backends=["eager", "inductor"], batch=4, seq=1024,
    ...                             dtype=torch.bfloat16, steps=20, warmup=3, device=torch.device("cuda"))
    >>> # not run by the doctest test: a GPU benchmark of minutes
    >>> print(format_table(run_model_bench(options)))                          # doctest: +SKIP
"""

from .backends import BACKENDS, BackendUnavailable
from .micro import MICRO_CASES, MicroBenchOptions, run_micro_bench
from .model_bench import ModelBenchOptions, run_model_bench
from .report import format_table, write_outputs
from .results import BenchResult, MicroRow, ModelRow
from .workloads import WORKLOADS, get_workload

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "BenchResult",
    "MICRO_CASES",
    "MicroBenchOptions",
    "MicroRow",
    "ModelBenchOptions",
    "ModelRow",
    "WORKLOADS",
    "format_table",
    "get_workload",
    "run_micro_bench",
    "run_model_bench",
    "write_outputs",
]
