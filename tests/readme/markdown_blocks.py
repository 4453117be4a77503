"""The code blocks of a Markdown page, and how a user runs them.

A block is a fenced ```python or ```bash block. An HTML comment on the line right above the fence says how
the tests treat it (the rendered page does not show it; the surrounding text says the same to the reader):

- ``<!-- skip: REASON -->``: not run (it installs from the network, or runs the test suite itself); the test
  reports it skipped with REASON;
- ``<!-- needs: gpu -->``: run only where CUDA is available;
- ``<!-- tested in: tests/path.py -->``: a command that test file runs already (the check is that it names the
  command's script, or the module a ``-m`` runs);
- no comment: run. A Python block is written to a file at the repository root and run as ``python <file>``
  in a fresh process, with the environment of a user (no ``TRITON_INTERPRET`` preset: a block sets it itself
  on the CPU); a bash block runs line by line with ``bash -c``, in the repository root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = re.compile(r"(?:^<!-- (?P<marker>[a-z ]+): (?P<value>[^\n]*?) -->\n)?^```(?P<lang>python|bash)\n(?P<code>.*?)^```$",
                    flags=re.S | re.M)
MARKERS = ("skip", "needs", "tested in")
# the trainer recipes need the test extra's packages (CI has them; a GPU image may not)
OPTIONAL_INTEGRATIONS = ("datasets", "trl", "accelerate")


@dataclass(frozen=True)
class Block:
    page: str      # path relative to the repository root
    index: int     # 0-based among the page's python and bash blocks
    lang: str
    code: str
    marker: str | None
    value: str | None

    @property
    def id(self) -> str:
        first = next((line for line in self.code.splitlines()
                      if line.strip() and not line.startswith(("import", "from", "#"))), "")
        return f"{self.page}:{self.index}:{first.strip()[:40]}"


def blocks(page: Path) -> list[Block]:
    found = []
    for index, match in enumerate(_BLOCK.finditer(page.read_text())):
        marker = match["marker"]
        if marker is not None and marker not in MARKERS:
            raise ValueError(f"{page}: block {index} has an unknown marker {marker!r}; known: {MARKERS}")
        found.append(Block(str(page.relative_to(ROOT)), index, match["lang"], match["code"], marker, match["value"]))
    return found


def user_environment() -> dict[str, str]:
    """This process's environment as a user's shell would have it: no Triton interpreter preset (the test
    session sets it on the CPU), the Hub served by the session's offline cache (conftest's HF_HOME)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    return env


def run_python(code: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python block.py`` with the block pasted into a file at the repository root."""
    path = ROOT / f"_block_{uuid.uuid4().hex[:12]}.py"
    path.write_text(code)
    try:
        return subprocess.run([sys.executable, path.name], cwd=ROOT, env=user_environment(), capture_output=True,
                              text=True, timeout=timeout)
    finally:
        path.unlink()


# What torch itself prints, whoever calls it: on a CUDA machine Inductor's advice to enable TF32 for fp32
# matmuls (the blocks build fp32 models) and Dynamo's event logger closing an event it never opened
# (torch 2.11); on some CPU builds Kineto's probe lines around a profiler session. None comes from twinkle_fx.
TORCH_NOISE = re.compile(
    r"(?m)^\S*torch/_inductor/compile_fx\.py:\d+: UserWarning: TensorFloat32 tensor cores .*\n(?:\s+warnings\.warn\(.*\n)?"
    r"|^W\d{4} [\d:.]+ \d+ \S*torch/_dynamo/utils\.py:\d+\] \[[\d/]+\] ChromiumEventLogger: Start event not in stack, "
    r"ignoring\n"
    # Kineto's tracing probes (some torch CPU builds) mark each torch.profiler session on stderr
    r"|^USDT:[\d-]+ [\d:.]+ \d+:\d+ SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)\n")


def run_bash(line: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = user_environment()
    # the console scripts of this interpreter's environment (twinkle-fx) come first, as in an activated venv
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def commands(code: str) -> list[str]:
    """The commands of a bash block: its lines without comments (a trailing ``# ...`` is a remark to the reader)."""
    return [line.split("  #", 1)[0].strip() for line in code.splitlines() if line.strip() and not line.startswith("#")]


def check(block: Block, *, has_cuda: bool) -> str | None:
    """Run ``block`` as its marker says; the reason when it is not run (the caller skips), else None.
    A block that runs must exit 0; a Python block prints nothing on stderr (no warning, no log line on the happy
    path), a command no warning (the command-line tools report progress on stderr)."""
    if block.marker == "skip":
        return block.value
    if block.marker == "needs":
        if block.value != "gpu":
            raise ValueError(f"{block.id}: 'needs: {block.value}': only 'needs: gpu' is known")
        if not has_cuda:
            return "needs a CUDA device; this machine has none"
    if block.marker == "tested in":
        test_file = (ROOT / block.value).read_text()
        if Path(block.page).name in test_file:  # the test reads this page and runs its blocks
            return None
        for command in commands(block.code):
            words = command.split()
            script = next((word for word in words if word.endswith(".py")), "")
            if not script and "-m" in words[:-1]:  # python -m / torchrun -m: the module
                script = words[words.index("-m") + 1]
            assert script and script.split("/")[-1] in test_file, f"{block.value} does not run `{command}`"
        return None
    if block.lang == "python":
        runs = [run_python(block.code)]
    else:
        if any(command.split()[0] == "twinkle-fx" for command in commands(block.code)) and not shutil.which("twinkle-fx"):
            return "the twinkle-fx command is not installed here (pip install -e .)"
        runs = [run_bash(command) for command in commands(block.code)]
    for done in runs:
        missing = next((name for name in OPTIONAL_INTEGRATIONS if f"No module named '{name}'" in done.stderr), None)
        if done.returncode and missing:
            return f"needs {missing} (pip install -e \".[test]\")"
        output = f"$ {' '.join(map(str, done.args))}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert done.returncode == 0, output
        if block.lang == "python":
            # the tests serve the Hub from an offline cache, where `kernels` cannot check a publisher and says so;
            # a user online never sees that line
            stderr = re.sub(r"(?m)^Skipping publisher trust check for .* offline mode\.\n?", "", done.stderr)
            stderr = TORCH_NOISE.sub("", stderr)
            assert not stderr.strip(), f"a Python block prints nothing on stderr on the happy path\n{output}"
        else:  # the command-line tools report progress on stderr, but no warning
            assert not re.search(r"(?i)warn", done.stderr), f"a command warns on the happy path\n{output}"
    return None
