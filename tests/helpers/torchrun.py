"""Launching the distributed test scripts: the command for N processes and the environment they start from."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]

# What torchrun sets for its workers; a leftover from the test process would confuse a fresh launch.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch_env(**extra: str) -> dict[str, str]:
    """This process's environment for a launched script: the project on ``PYTHONPATH``, one thread per process
    (as the tests' own process), no launcher variables; ``extra`` on top."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    for key in _LAUNCHER_VARIABLES:
        env.pop(key, None)
    return env


def python_command(nproc: int, *torchrun_options: str) -> list[str]:
    """``python`` for one process, ``python -m torch.distributed.run --standalone --nproc_per_node=N`` for more;
    the script and its arguments follow."""
    if nproc <= 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *torchrun_options]


def wait_or_fail(proc: subprocess.Popen, name: str, timeout: float = 300) -> None:
    """Wait for a launched run (started with ``stderr=PIPE``, text mode) and fail the test if it failed or hung.

    A process waiting in a collective the other never joins hangs; after ``timeout`` seconds the run is killed and
    the test fails with the end of its error output instead of waiting forever.
    """
    import pytest

    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the 2-process {name} run hung:\n{err[-4000:]}")
    assert proc.returncode == 0, f"{name}:\n{err[-4000:]}"


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """Run a launched script's ``main()``, then leave the process without tearing torch's objects down.

    Whatever ``main`` returns (the trainer and model) stays referenced until the end: freeing a DDP reducer after
    the process group is gone can deadlock in torch 2.13 (``~ProcessGroupGloo`` joins a gloo thread that waits for
    the GIL the freeing thread holds; seen with HF's Trainer, py-spy: Reducer dealloc -> ~ProcessGroupGloo ->
    thread join). Everything a script produces is written before ``main`` returns; an exception in it still exits
    non-zero.
    """
    kept = main()  # noqa: F841 (kept alive on purpose)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
