"""Sharded evaluation on 2 CPU processes (gloo, torchrun), under DDP and under FSDP2: each process evaluates its own
share, and every result equals a one-process run (run here, in this process, by the same script).

Under FSDP2 every forward is a collective (the parameters are gathered from both processes), so a process with one
eval batch fewer than the other must still run a forward while the other runs its extra batch; the ``fixed`` set
gives the processes different batch counts.
"""

import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.distributed import eval_shard_script
from tests.helpers.torchrun import launch_env, wait_or_fail

SCRIPT = Path(eval_shard_script.__file__)
ROOT = Path(__file__).resolve().parents[2]
SIZES = {"var": 11, "fixed": 10}
# Timings and the model-preparation time differ between runs; `epoch` is compared by the training tests.
UNTIMED = ("runtime", "per_second", "preparation_time")
PHASES = ("train", "evaluate", "predict", "evaluate_lists", "predict_lists", "batch_metrics", "best")
STRATEGIES = ("ddp", "fsdp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The one-process reference and both 2-process runs (DDP, FSDP2), launched together."""
    tmp = tmp_path_factory.mktemp("eval_shards")
    env = launch_env()
    procs = {}
    for strategy in STRATEGIES:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               str(tmp / f"out-{strategy}"), str(tmp / strategy)] + (["fsdp"] if strategy == "fsdp" else [])
        procs[strategy] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                           cwd=str(ROOT))
    # The one-process reference runs here while the two processes run.
    one, _ = eval_shard_script.run(str(tmp / "one"))
    two = {}
    for strategy, proc in procs.items():
        wait_or_fail(proc, strategy)
        two[strategy] = []
        for rank in (0, 1):
            data = pickle.loads((tmp / f"{strategy}.{rank}.pkl").read_bytes())
            assert data["world"] == 2
            # FSDP2's fully_shard gives the model a new class (FSDPGPT2LMHeadModel): really sharded.
            assert data["model_class"].startswith("FSDP") == (strategy == "fsdp"), data["model_class"]
            two[strategy].append(data["results"])
    return one, two


def assert_same(expected, actual, path=""):
    if isinstance(expected, dict):
        assert set(expected) == set(actual), path
        for key in expected:
            if not any(part in key for part in UNTIMED):
                assert_same(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(expected) is type(actual) and len(expected) == len(actual), path
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray):
        assert expected.shape == actual.shape and expected.dtype == actual.dtype, path
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=path)
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-5), path
    else:
        assert actual == expected, path


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_process_evaluates_its_share_and_gets_the_one_process_results(runs, strategy, phase):
    one, two = runs[0], runs[1][strategy]
    if phase == "train":
        assert len(one["train"]["value"]) == 2  # the evaluation during training, one entry per eval set
    if phase == "best":
        # Two evaluations during training, then evaluate() on the best (first) checkpoint's weights, loaded.
        best = one["best"]["value"]
        assert best["best"] == "checkpoint-1" and best["evals"][0] < best["evals"][1]
        assert best["after"]["eval_loss"] == pytest.approx(best["evals"][0], rel=1e-6)
    # Each example is read once per pass, by one process, and no process reads more than ceil(n / 2) per pass.
    for name, reads in one[phase]["reads"].items():
        passes = len(reads) // SIZES[name]
        assert passes >= 1 and sorted(reads) == sorted(list(range(SIZES[name])) * passes)
        shares = [two[rank][phase]["reads"][name] for rank in (0, 1)]
        assert all(len(share) <= passes * math.ceil(SIZES[name] / 2) for share in shares), (name, shares)
        assert sorted(shares[0] + shares[1]) == sorted(reads), (name, shares)
    # Metrics (eval_loss, compute_metrics, streaming torchmetrics, batch-wise compute_metrics), what
    # compute_metrics received (predictions, labels, inputs, losses in dataset order, padded with -100), and
    # predict()'s outputs, concatenated or as lists of batches, on every process.
    for rank in (0, 1):
        assert_same(one[phase]["value"], two[rank][phase]["value"], f"{phase}/rank{rank}/value")
        assert_same(one[phase]["calls"], two[rank][phase]["calls"], f"{phase}/rank{rank}/calls")
