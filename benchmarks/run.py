"""hf_lightning side by side with ``transformers.Trainer``, plain Lightning and a plain PyTorch loop.

One command measures everything, CPU, one thread::

    .venv/bin/python benchmarks/run.py [--quick] [--out results.json]

- training throughput (optimizer steps/s, tokens/s) for a tiny and a small GPT-2, with logging every 10 steps
  and evaluation/saving on, and with them off (:mod:`training`);
- ``evaluate()`` time and peak RSS on a 1× and a 10× eval set (:mod:`eval_memory`);
- checkpoint save and resume time for the small GPT-2 (:mod:`checkpoints`);
- import time of ``hf_lightning`` and ``transformers.Trainer``.

Every measurement runs in a fresh Python process (so peak RSS and import time mean something and no contender
inherits another's warm state) and is repeated; the training contenders of a setting run at once and take turns
inside their timed windows (:mod:`turns`), the other sections' contenders run one after another in an order that
rotates each repeat. The tables show medians and the ratios hf_lightning / HF, hf_lightning / plain Lightning and
hf_lightning / plain loop. ``--quick`` runs every code path once with a few steps, the non-training jobs in one
worker process (for the test: its numbers mean nothing). See ``docs/performance.md`` for the latest table and
how to read it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Repeats per measurement in a full run (the machine has 2 cores and may be shared: medians of several runs).
REPEATS = {"train_tiny": 5, "train_small": 5, "eval": 3, "checkpoint": 4, "import": 5}
# Seconds of quiet disk before each checkpoint-save measurement (see Driver.measure).
SAVE_SETTLE_SECONDS = 10
EVAL_ROWS = 512
SAVES = 5
IMPORT_STATEMENTS = {
    "torch": "import torch",
    "lightning": "import lightning.pytorch",
    "hf": "from transformers import Trainer, TrainingArguments",
    "hf_lightning": "import hf_lightning",
}
WORKER_TIMEOUT = 1800


# ---------------------------------------------------------------------------------------------------- worker
def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Carry out one measurement in this process (the worker side)."""
    from workloads import QUICK_WORKLOADS, WORKLOADS

    workloads = QUICK_WORKLOADS if job.get("quick") else WORKLOADS
    workload = workloads[job["workload"]]
    section = job["section"]
    if section == "train":
        from training import run_training

        os.makedirs(job["workdir"], exist_ok=True)
        turns = None
        if job.get("turn_fds"):
            from turns import Turns

            turns = Turns(*job["turn_fds"])
        return run_training(job["contender"], workload, job["flow"] == "on", job["workdir"], turns)
    if section == "eval":
        from eval_memory import run_evaluation

        return run_evaluation(job["contender"], workload, job["rows"], job["workdir"])
    if section == "checkpoint":
        from checkpoints import run_resume, run_save

        if job["step"] == "save":
            return run_save(job["contender"], workload, job["workdir"], job["saves"])
        return run_resume(job["contender"], workload, job["workdir"], job.get("checkpoint"))
    raise ValueError(f"unknown benchmark section {section!r}")


def worker_main(jobs_path: str, results_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        try:
            results.append(run_job(job))
        except Exception as exc:  # reported in the results, so one broken contender does not stop the run
            results.append({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        with open(results_path, "w") as f:
            json.dump(results, f)


# ---------------------------------------------------------------------------------------------------- driver
class Driver:
    """Plans the jobs, runs each in a fresh process, collects the raw results."""

    def __init__(self, quick: bool, workdir: str, log) -> None:
        self.quick = quick
        self.workdir = workdir
        self.log = log
        self.records: list[dict[str, Any]] = []
        self.env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                        TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        if not quick:
            # Byte-compiled modules cached for the run, outside the source tree, as an installed package has
            # them; otherwise (PYTHONDONTWRITEBYTECODE) every process would recompile hf_lightning.
            self.env.pop("PYTHONDONTWRITEBYTECODE", None)
            self.env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
        self._counter = 0
        self.pending: list[dict[str, Any]] = []

    def _next_dir(self, name: str) -> str:
        self._counter += 1
        return os.path.join(self.workdir, f"{self._counter:04d}-{name}")

    def run_worker(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if hasattr(os, "sync"):
            # No worker starts with another contender's written-but-unflushed files still going to the disk (the
            # kernel would flush them while this one runs, e.g. during its checkpoint saves).
            os.sync()
        worker = self._start_worker(jobs)
        try:
            worker["proc"].wait(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            worker["proc"].kill()
        return self._worker_results(worker)

    def _start_worker(self, jobs: list[dict[str, Any]], pass_fds: tuple[int, ...] = ()) -> dict[str, Any]:
        base = self._next_dir("worker")
        os.makedirs(base, exist_ok=True)
        jobs_path, results_path = os.path.join(base, "jobs.json"), os.path.join(base, "results.json")
        with open(jobs_path, "w") as f:
            json.dump(jobs, f)
        log_path = os.path.join(base, "output.log")
        with open(log_path, "w") as out:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", jobs_path, results_path],
                                    stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=base, pass_fds=pass_fds)
        return {"proc": proc, "jobs": jobs, "results_path": results_path, "log_path": log_path}

    @staticmethod
    def _worker_results(worker: dict[str, Any]) -> list[dict[str, Any]]:
        jobs, results = worker["jobs"], []
        if os.path.exists(worker["results_path"]):
            with open(worker["results_path"]) as f:
                results = json.load(f)
        if len(results) < len(jobs):
            with open(worker["log_path"]) as f:
                tail = f.read()[-3000:]
            message = f"worker exited with {worker['proc'].returncode} before finishing: {tail}"
            results += [{"error": message}] * (len(jobs) - len(results))
        return results

    def measure_in_turns(self, jobs: list[dict[str, Any]]) -> None:
        """Run training ``jobs`` at once, one process each, taking turns inside their timed windows (:mod:`turns`)."""
        from turns import Seat, take_turns

        if hasattr(os, "sync"):
            os.sync()
        seats = [Seat() for _ in jobs]
        workers = []
        try:
            for job, seat in zip(jobs, seats):
                workers.append(self._start_worker([{**job, "turn_fds": list(seat.worker_fds)}],
                                                  pass_fds=seat.worker_fds))
                seat.started()
            take_turns(seats, timeout=WORKER_TIMEOUT)
        finally:
            for seat in seats:
                seat.close()
            for worker in workers:
                try:
                    worker["proc"].wait(timeout=WORKER_TIMEOUT)
                except subprocess.TimeoutExpired:
                    worker["proc"].kill()
                    worker["proc"].wait()
        for job, worker in zip(jobs, workers):
            self._record(job, self._worker_results(worker)[0])
            shutil.rmtree(job["workdir"], ignore_errors=True)

    def measure(self, jobs: list[dict[str, Any]]) -> None:
        """Run ``jobs``, one fresh process each; with ``--quick`` they wait for :meth:`flush` (one process)."""
        if self.quick:
            self.pending += jobs
            return
        for job in jobs:
            if job["section"] == "checkpoint" and job.get("step") == "save":
                # A VM's disk may throttle after a burst of writes (this machine's does, about 200 MB): the save
                # that comes second in a repeat would pay for the first one's. Let the disk settle before each.
                os.sync()
                time.sleep(SAVE_SETTLE_SECONDS)
            self._record(job, self.run_worker([job])[0])
            if job["section"] in ("train", "eval"):
                # Checkpoints of finished runs are not needed; a full run would otherwise keep about 1 GB.
                shutil.rmtree(job["workdir"], ignore_errors=True)

    def flush(self) -> None:
        jobs, self.pending = self.pending, []
        if jobs:
            for job, result in zip(jobs, self.run_worker(jobs)):
                self._record(job, result)

    def _record(self, job: dict[str, Any], result: dict[str, Any]) -> None:
        record = {k: v for k, v in job.items() if k not in ("quick", "workdir")}
        record["result"] = result
        self.records.append(record)
        self.log(_describe(record))

    def warm_up(self) -> None:
        """Import everything once so the byte-code cache exists before anything is timed."""
        code = "import torchmetrics, hf_lightning, transformers; from transformers import Trainer, GPT2LMHeadModel"
        subprocess.run([sys.executable, "-c", code], env=self.env, cwd=self.workdir, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # ---------------------------------------------------------------- sections
    def training(self, workload: str, repeats: int) -> None:
        from training import CONTENDERS

        for rep in range(repeats):
            order = _rotate(CONTENDERS, rep)
            for flow in ("on", "off"):
                # The four contenders of a setting run at once and take turns (also with --quick: the path is
                # tested); the one that goes first rotates with the repeat.
                self.measure_in_turns([dict(section="train", workload=workload, flow=flow, contender=c, rep=rep,
                                            quick=self.quick, workdir=self._next_dir(f"train-{workload}-{flow}-{c}"))
                                       for c in order])

    def evaluation(self, repeats: int, rows: int) -> None:
        from eval_memory import CONTENDERS

        for rep in range(repeats):
            jobs = [dict(section="eval", workload="tiny", size=size, rows=rows * factor, contender=c, rep=rep,
                         quick=self.quick, workdir=self._next_dir(f"eval-{size}-{c}"))
                    for size, factor in (("1x", 1), ("10x", 10)) for c in _rotate(CONTENDERS, rep)]
            self.measure(jobs)

    def checkpoint(self, workload: str, repeats: int, saves: int) -> None:
        from checkpoints import SAVE_EVERY

        contenders = ("hf", "hf_lightning")
        for rep in range(repeats):
            order = _rotate(contenders, rep)
            dirs = {c: self._next_dir(f"checkpoint-{c}") for c in order}
            jobs = [dict(section="checkpoint", step="save", workload=workload, contender=c, saves=saves, rep=rep,
                         quick=self.quick, workdir=dirs[c]) for c in order]
            for c in order:
                # Each trainer resumes from the last checkpoint it wrote in the save job above.
                jobs.append(dict(section="checkpoint", step="resume", workload=workload, contender=c, rep=rep,
                                 checkpoint=os.path.join(dirs[c], f"checkpoint-{saves * SAVE_EVERY}"),
                                 quick=self.quick, workdir=dirs[c]))
                jobs.append(dict(section="checkpoint", step="start", workload=workload, contender=c, rep=rep,
                                 quick=self.quick, workdir=self._next_dir(f"start-{c}")))
            self.measure(jobs)
            if not self.quick:
                for path in dirs.values():
                    shutil.rmtree(path, ignore_errors=True)

    def imports(self, repeats: int) -> None:
        contenders = ("hf", "hf_lightning") if self.quick else tuple(IMPORT_STATEMENTS)
        for rep in range(repeats):
            order = _rotate(contenders, rep)
            # One at a time, so they do not compete for the cores; --quick only checks that the path works.
            batches = [order] if self.quick else [(c,) for c in order]
            for batch in batches:
                procs = {c: subprocess.Popen([sys.executable, "-c", _import_timer(c)], env=self.env,
                                             cwd=self.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True) for c in batch}
                for contender, proc in procs.items():
                    stdout, stderr = proc.communicate()
                    if proc.returncode == 0:
                        result: dict[str, Any] = {"seconds": float(stdout.strip().splitlines()[-1])}
                    else:
                        result = {"error": stderr[-2000:]}
                    record = dict(section="import", contender=contender, rep=rep, result=result)
                    self.records.append(record)
                    self.log(_describe(record))


def _import_timer(contender: str) -> str:
    return ("import time; _t = time.perf_counter(); " + IMPORT_STATEMENTS[contender]
            + "; print(time.perf_counter() - _t)")


def _rotate(items: tuple, shift: int) -> tuple:
    shift %= len(items)
    return items[shift:] + items[:shift]


def _describe(record: dict[str, Any]) -> str:
    key = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("result", "checkpoint"))
    result = record["result"]
    if "error" in result:
        return f"  {key}: ERROR {result['error'].splitlines()[0] if result['error'] else ''}"
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()
             if k not in ("saves", "checkpoint", "traceback")}
    return f"  {key}: {shown}"


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "lightning", "transformers", "torchmetrics", "hf_lightning"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # a missing package is reported as such, not fatal
            out[name] = "not installed"
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def reprint(path: str) -> dict[str, Any]:
    """Recompute the summary of a saved run from its raw measurements, print it and write it back."""
    from report import markdown, summarize

    with open(path) as f:
        output = json.load(f)
    output.update(summarize(output["raw"]))
    with open(path, "w") as f:
        json.dump(output, f, indent=2)
    print(markdown(output))
    return {}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every code path once with a few steps (for tests)")
    parser.add_argument("--out", default="benchmark_results.json", help="where to write the JSON results")
    parser.add_argument("--sections", default="train,eval,checkpoint,import",
                        help="comma-separated subset of train,eval,checkpoint,import")
    parser.add_argument("--repeats", type=int, default=None, help="override every section's repeat count")
    parser.add_argument("--report", metavar="JSON", help="print the tables of an earlier run's JSON and exit "
                        "(recomputes medians and ratios from its raw measurements)")
    parser.add_argument("--worker", nargs=2, metavar=("JOBS", "RESULTS"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        worker_main(*options.worker)
        return {}

    sys.path.insert(0, HERE)
    if options.report:
        return reprint(options.report)
    sections = [s.strip() for s in options.sections.split(",") if s.strip()]
    unknown = set(sections) - {"train", "eval", "checkpoint", "import"}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; choose from train, eval, checkpoint, import")
    repeats = {k: (1 if options.quick else options.repeats or v) for k, v in REPEATS.items()}

    def log(message: str) -> None:
        print(message, flush=True)

    workdir = tempfile.mkdtemp(prefix="hf_lightning-bench-")
    started = time.time()
    load_before = os.getloadavg()
    driver = Driver(options.quick, workdir, log)
    try:
        if not options.quick:
            log("warming the byte-code cache ...")
            driver.warm_up()
        if "train" in sections:
            log("training throughput, tiny GPT-2 ...")
            driver.training("tiny", repeats["train_tiny"])
            if not options.quick:
                log("training throughput, small GPT-2 ...")
                driver.training("small", repeats["train_small"])
        if "eval" in sections:
            log("evaluation time and peak RSS ...")
            driver.evaluation(repeats["eval"], 8 if options.quick else EVAL_ROWS)
        if "checkpoint" in sections:
            log("checkpoint save and resume ...")
            driver.checkpoint("tiny" if options.quick else "small", repeats["checkpoint"], 1 if options.quick
                              else SAVES)
        importer = None
        if "import" in sections:
            log("import time ...")
            if options.quick:
                # --quick: the import processes overlap the single worker (nothing is timed for real).
                importer = threading.Thread(target=driver.imports, args=(repeats["import"],))
                importer.start()
            else:
                driver.imports(repeats["import"])
        driver.flush()
        if importer is not None:
            importer.join()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    from report import markdown, summarize
    from workloads import QUICK_WORKLOADS, WORKLOADS

    summary = summarize(driver.records)
    output = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "quick": options.quick,
            "command": " ".join([os.path.basename(sys.executable), "benchmarks/run.py", *(argv or sys.argv[1:])]),
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "threads": 1,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "wall_seconds": time.time() - started,
            "versions": _versions(),
            "repeats": repeats,
            "workloads": {k: asdict(v) for k, v in (QUICK_WORKLOADS if options.quick else WORKLOADS).items()},
            "eval_rows_1x": 8 if options.quick else EVAL_ROWS,
        },
        **summary,
        "errors": [r for r in driver.records if "error" in r["result"]],
        "skipped": [r for r in driver.records if "skipped" in r["result"]],
        "raw": driver.records,
    }
    with open(options.out, "w") as f:
        json.dump(output, f, indent=2)
    print()
    print(markdown(summary))
    print(f"load average before/after: {load_before} / {output['meta']['load_average_after']}; "
          f"{output['meta']['wall_seconds']:.0f} s; JSON written to {options.out}")
    if output["errors"]:
        print(f"{len(output['errors'])} measurement(s) failed; see 'errors' in the JSON.")
    return output


if __name__ == "__main__":
    result = main()
    sys.exit(1 if result.get("errors") else 0)
