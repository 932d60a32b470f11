"""HF's memory metrics (``skip_memory_metrics=False``): how much memory each stage of a ``Trainer`` allocated.

HF's ``TrainerMemoryTracker`` measures four stages: the ``Trainer``'s construction (``init``), ``train()``
(``train``), ``evaluate()`` (``eval``) and ``predict()`` (``test``). For each it reports the process's resident
memory (RSS) change from the stage's start to its end (``{stage}_mem_cpu_alloc_delta``) and how far the peak went
above the end (``{stage}_mem_cpu_peaked_delta``); with CUDA the same from torch's allocator
(``{stage}_mem_gpu_*``). The ``init`` figures and ``before_init_mem_cpu`` (RSS when the ``Trainer`` started) ride
along with the first stage that reports. A stage started inside another (an evaluation during training) is not
measured. The keys and their order are HF's.

Two differences on purpose: RSS is read from ``/proc/self/statm`` when ``psutil`` is not installed (HF then reports
nothing), and the peak is sampled every millisecond by a background thread (HF's thread samples in a busy loop,
which takes a whole core from training).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import torch


def _rss_reader():
    """A function returning this process's resident memory in bytes, or ``None`` where it cannot be read."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        process = psutil.Process()
        return lambda: process.memory_info().rss
    if os.path.exists("/proc/self/statm"):
        page = os.sysconf("SC_PAGE_SIZE")

        def read() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page

        return read
    return None


class MemoryTracker:
    """Measures the memory of HF's ``Trainer`` stages (see the module docstring).

    Args:
        skip: ``args.skip_memory_metrics``; when true (HF's default) every method does nothing.
    """

    def __init__(self, skip: bool) -> None:
        self._rss = None if skip else _rss_reader()
        self.skip = self._rss is None
        self._cuda = not self.skip and torch.cuda.is_available()
        self.stage: str | None = None
        self.cpu: dict[str, dict[str, int]] = {}
        self.gpu: dict[str, dict[str, int]] = {}
        self.init_reported = False
        self._sampling = False
        self._sampler: threading.Thread | None = None
        self._peak = 0

    def start(self, stage: str) -> None:
        """Start measuring ``stage`` (``init``, ``train``, ``eval`` or ``test``) unless another stage is running."""
        if self.skip or (self.stage is not None and self.stage != stage):
            return
        self.stage = stage
        gc.collect()
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.empty_cache()
            self._gpu_begin = torch.cuda.memory_allocated()
        self._cpu_begin = self._rss()
        self._peak = self._cpu_begin
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample_peak, name="hf-lightning-memory-peak", daemon=True)
        self._sampler.start()

    def _sample_peak(self) -> None:
        while self._sampling:
            self._peak = max(self._peak, self._rss())
            time.sleep(0.001)

    def stop(self, stage: str) -> None:
        """Stop measuring ``stage`` and keep its figures (nothing when another stage is being measured)."""
        if self.skip or self.stage != stage:
            return
        self._sampling = False
        if self._sampler is not None:
            self._sampler.join()
        gc.collect()
        if self._cuda:
            torch.cuda.empty_cache()
            now, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
            self.gpu[stage] = {"begin": self._gpu_begin, "end": now, "alloc": now - self._gpu_begin,
                               "peaked": max(0, peak - now)}
        now = self._rss()
        self._peak = max(self._peak, now)
        self.cpu[stage] = {"begin": self._cpu_begin, "end": now, "alloc": now - self._cpu_begin,
                           "peaked": max(0, self._peak - now)}
        self.stage = None

    def update_metrics(self, stage: str, metrics: dict[str, Any]) -> None:
        """Add ``stage``'s figures to ``metrics`` (and the ``init`` ones, the first time), in HF's key order."""
        if self.skip or (self.stage is not None and self.stage != stage):
            return
        stages = [stage]
        if not self.init_reported:
            stages.insert(0, "init")
            self.init_reported = True
        for name in stages:
            for kind in ("alloc", "peaked"):
                if kind in self.cpu.get(name, {}):
                    metrics[f"{name}_mem_cpu_{kind}_delta"] = self.cpu[name][kind]
                if self._cuda and kind in self.gpu.get(name, {}):
                    metrics[f"{name}_mem_gpu_{kind}_delta"] = self.gpu[name][kind]
        if stages[0] == "init" and "init" in self.cpu:
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if self._cuda and "init" in self.gpu:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(self, stage: str, metrics: dict[str, Any] | None = None) -> None:
        """:meth:`stop`, then :meth:`update_metrics` when ``metrics`` is given."""
        if self.skip:
            return
        running = self.stage
        self.stop(stage)
        if metrics is not None and running == stage:
            self.update_metrics(stage, metrics)
