"""Sharded evaluation on 2 CPU processes (gloo, torchrun): each process evaluates its own share, and every result
equals a one-process run (run here, in this process, by the same script)."""

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.distributed import eval_shard_script

SCRIPT = Path(eval_shard_script.__file__)
ROOT = Path(__file__).resolve().parents[2]
SIZES = {"var": 11, "fixed": 10}
# Timings and the model-preparation time differ between runs; `epoch` is compared by the training tests.
UNTIMED = ("runtime", "per_second", "preparation_time")
PHASES = ("train", "evaluate", "predict", "evaluate_lists", "predict_lists", "batch_metrics")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval_shards")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           str(tmp / "out"), str(tmp / "two")]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    # The one-process reference runs here while the two processes run.
    one, _ = eval_shard_script.run(str(tmp / "one"))
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-4000:]
    two = []
    for rank in (0, 1):
        data = pickle.loads((tmp / f"two.{rank}.pkl").read_bytes())
        assert data["world"] == 2
        two.append(data["results"])
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
def test_each_process_evaluates_its_share_and_gets_the_one_process_results(runs, phase):
    one, two = runs
    if phase == "train":
        assert len(one["train"]["value"]) == 2  # the evaluation during training, one entry per eval set
    # Each example is read once, by one process, and no process reads more than ceil(n / 2).
    for name, reads in one[phase]["reads"].items():
        assert sorted(reads) == list(range(SIZES[name]))
        shares = [two[rank][phase]["reads"][name] for rank in (0, 1)]
        assert all(len(share) <= math.ceil(SIZES[name] / 2) for share in shares), (name, shares)
        assert sorted(shares[0] + shares[1]) == list(range(SIZES[name])), (name, shares)
    # Metrics (eval_loss, compute_metrics, streaming torchmetrics, batch-wise compute_metrics), what
    # compute_metrics received (predictions, labels, inputs, losses in dataset order, padded with -100), and
    # predict()'s outputs, concatenated or as lists of batches, on every process.
    for rank in (0, 1):
        assert_same(one[phase]["value"], two[rank][phase]["value"], f"{phase}/rank{rank}/value")
        assert_same(one[phase]["calls"], two[rank][phase]["calls"], f"{phase}/rank{rank}/calls")
