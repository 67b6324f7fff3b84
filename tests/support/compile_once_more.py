"""Runs a compile or build command once more when g++ failed it with "constraints not satisfied"
(or with the static_assert that reports the same slip: "has no ds::tensor_traits specialisation").

g++ 12.2 (Debian bookworm's) now and then rejects a correct file that way, for a type whose
tensor_traits specialisation is in scope; the same command then compiles it (scripts/compile.sh,
which does this for the project's own builds, says more). The Python scripts that compile programs
of their own (the documents' compile lines, the consumer checks) run their commands through this.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

SPURIOUS_CONCEPT_FAILURES = ("constraints not satisfied", "has no ds::tensor_traits specialisation")


def run_compile(cmd: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[bytes], bool]:
    """(the last run, stdout and stderr merged; whether it was the second). A second run happens only
    when the first failed and its output holds g++'s message; any other failure is returned as is.
    subprocess.TimeoutExpired and FileNotFoundError reach the caller."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                          cwd=cwd)
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode == 0 or not any(message in out for message in SPURIOUS_CONCEPT_FAILURES):
        return proc, False
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                          cwd=cwd), True
