"""FSDP2 on 2 CPU processes (gloo) through torchrun, against transformers' own FSDP2 run with the same arguments.

Out of the box accelerate turns FSDP on only for GPU-family devices, so transformers' Trainer trains
``fsdp=True`` + ``fsdp_config={"version": 2, ...}`` on CPU processes with DDP. The reference here is HF's real FSDP2
run instead (``fsdp_script.py hf_fsdp``: ``tests/helpers/hf_fsdp.py`` lifts that one gate, and transformers and
accelerate run the code they run on GPUs: ``fully_shard``, DTensor clipping, ``save_fsdp_model`` / ``load_fsdp_model``
and the optimizer's). Its numbers, its ``checkpoint-N`` folders (FULL and SHARDED state dicts) and its resumes are
compared with ours. HF's plain (DDP) run remains the reference where HF's FSDP run cannot be one (one process, HSDP).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers.parity import assert_log_history_equal
from tests.helpers.torchrun import launch_env, python_command

SCRIPT = Path(__file__).with_name("fsdp_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _command(lib, out, result, nproc, *opts):
    cmd = python_command(nproc)
    return cmd + [str(SCRIPT), lib, str(out), str(result), *opts]


def _env():
    return launch_env()


def _launch_all(*runs):
    """Start every ``(lib, out, result, nproc, *opts)`` run at once; wait for all; return their results."""
    procs = [subprocess.Popen(_command(*run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(), cwd=str(ROOT)) for run in runs]
    results = []
    for run, proc in zip(runs, procs):
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        results.append(json.loads(Path(run[2]).read_text()))
    return results


def _weights(result):
    return {k: torch.tensor(v) for k, v in result["weights"].items()}


def _assert_weights_close(actual, expected):
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=1e-5, atol=1e-6, msg=key)


def _checkpoints(out):
    return sorted(p.name for p in Path(out).iterdir() if p.name.startswith("checkpoint-"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """transformers' FSDP2 run and ours, same arguments (GA 2, evaluation and saving every 2 steps), in parallel;
    also ours with the same arguments plus ``parallelism_config=ParallelismConfig(dp_shard_size=2)``."""
    tmp = tmp_path_factory.mktemp("fsdp")
    hf, ours, pc = _launch_all(
        ("hf_fsdp", tmp / "hf", tmp / "hf.json", 2),
        ("ours", tmp / "ours", tmp / "ours.json", 2, f"save_model={tmp / 'final'}", "evaluate"),
        ("ours", tmp / "pc", tmp / "pc.json", 2, "pc=1,2"),
    )
    return {"hf": hf, "ours": ours, "pc": pc, "tmp": tmp}


def test_fsdp2_training_matches_hf(runs):
    hf, ours = runs["hf"], runs["ours"]
    assert ours["world"] == 2 and ours["model_class"].startswith("FSDP")  # really sharded by fully_shard
    # Rows of different lengths: the windows' token counts differ per process, so the losses below only match
    # when num_items_in_batch is summed over both processes; grad_norm is the full (DTensor-reduced) norm and
    # clipping (max_grad_norm=0.5, below every norm here) scales by it.
    # HF's eval_loss differs on purpose: its evaluation on several processes (FSDP as DDP) pads the last round with
    # repeated rows and counts them (4.098 against the one-process 4.116 here).
    history, evaluated = ours["log_history"][:-1], ours["log_history"][-1]  # the last row: evaluate() below
    assert_log_history_equal(hf["log_history"], history, skip_keys=("eval_loss",))
    assert all(row["grad_norm"] > 0.5 for row in history if "grad_norm" in row)
    _assert_weights_close(_weights(ours), _weights(hf))
    # evaluate() after training runs on the sharded model (a new Lightning trainer, the same strategy).
    last_eval = [row for row in history if "eval_loss" in row][-1]
    assert evaluated["eval_loss"] == ours["eval"]["eval_loss"]
    assert ours["eval"]["eval_loss"] == pytest.approx(last_eval["eval_loss"], rel=1e-6)


def test_fsdp2_checkpoints_match_hf_folders(runs):
    import safetensors.torch

    hf_out, ours_out = runs["tmp"] / "hf", runs["tmp"] / "ours"
    assert _checkpoints(ours_out) == _checkpoints(hf_out) == ["checkpoint-2", "checkpoint-4"]
    assert not [p for p in ours_out.iterdir() if p.name.startswith(".tmp-checkpoint")]
    for name in _checkpoints(hf_out):
        # HF's FSDP layout (FULL_STATE_DICT) as HF's own FSDP2 run wrote it: the full weights also as
        # pytorch_model_fsdp.bin, the optimizer as optimizer.bin (keyed by parameter name), no optimizer.pt; ours
        # adds only its readable training_args.json.
        ours_files = sorted(p.name for p in (ours_out / name).iterdir() if p.name != "training_args.json")
        assert ours_files == sorted(p.name for p in (hf_out / name).iterdir())
        assert "pytorch_model_fsdp.bin" in ours_files and "optimizer.pt" not in ours_files
    # The full weights and the full optimizer state, gathered from the shards, equal to HF's.
    hf_weights = safetensors.torch.load_file(hf_out / "checkpoint-4" / "model.safetensors")
    _assert_weights_close(safetensors.torch.load_file(ours_out / "checkpoint-4" / "model.safetensors"), hf_weights)
    fsdp_weights = torch.load(ours_out / "checkpoint-4" / "pytorch_model_fsdp.bin", weights_only=True)
    hf_fsdp_weights = torch.load(hf_out / "checkpoint-4" / "pytorch_model_fsdp.bin", weights_only=True)
    assert torch.equal(fsdp_weights["lm_head.weight"], fsdp_weights["transformer.wte.weight"])  # tied
    _assert_weights_close(fsdp_weights, hf_fsdp_weights)
    theirs = torch.load(hf_out / "checkpoint-4" / "optimizer.bin", weights_only=True)
    mine = torch.load(ours_out / "checkpoint-4" / "optimizer.bin", weights_only=True)
    assert mine["param_groups"] == theirs["param_groups"]  # the same groups, hyperparameters and names in order
    assert sorted(mine["state"]) == sorted(theirs["state"])
    for name, state in theirs["state"].items():
        assert sorted(mine["state"][name]) == sorted(state)
        for key, value in state.items():
            torch.testing.assert_close(mine["state"][name][key], value, rtol=1e-5, atol=1e-8, msg=(name, key))


def test_save_model_output_loads_with_from_pretrained(runs):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(runs["tmp"] / "final")
    weights = _weights(runs["ours"])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_resume_hf_checkpoint_under_fsdp2(runs, tmp_path):
    # HF's (DDP) checkpoint-2 resumed by our FSDP2 run ends at the uninterrupted weights. The other way, HF's
    # one-process/DDP run refuses a folder holding FSDP files ("only supported when using PyTorch FSDP"); the
    # FSDP layout is resumed by accelerate's own FSDP functions in test_fsdp_layout.py.
    out = tmp_path / "hf-to-ours"
    out.mkdir()
    shutil.copytree(runs["tmp"] / "hf" / "checkpoint-2", out / "checkpoint-2")
    (resumed,) = _launch_all(("ours", out, tmp_path / "ours.json", 2, "resume"))
    _assert_weights_close(_weights(resumed), _weights(runs["hf"]))
    assert_log_history_equal(runs["hf"]["log_history"], resumed["log_history"], ordered=False,
                             skip_keys=("eval_loss", "train_loss"))


def _unsharded_copy(source, target):
    """``source`` (FULL_STATE_DICT layout) in the layout a one-process run writes: ``optimizer.pt``, no FSDP files."""
    shutil.copytree(source, target)
    os.remove(target / "pytorch_model_fsdp.bin")
    full = torch.load(target / "optimizer.bin", weights_only=True)
    os.remove(target / "optimizer.bin")
    names = [name for group in full["param_groups"] for name in group["params"]]
    torch.save({"state": {names.index(name): value for name, value in full["state"].items()},
                "param_groups": [{**g, "params": [names.index(n) for n in g["params"]]} for g in full["param_groups"]]},
               target / "optimizer.pt")


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_in_one_process_as_hf_does(runs, tmp_path):
    # Our FSDP2 checkpoints, FULL_STATE_DICT and SHARDED_STATE_DICT (torch.distributed.checkpoint folders read into
    # the unsharded model), resumed by one plain process, end as HF's one-process run resuming the same state (HF
    # refuses FSDP files without FSDP, so it gets the FULL folder in the unsharded layout).
    sharded = tmp_path / "sharded"
    _launch_all(("ours", sharded, tmp_path / "sharded.json", 2, "sdt=SHARDED"))
    assert (sharded / "checkpoint-2" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    starts = []
    for name, source in (("full", runs["tmp"] / "ours" / "checkpoint-2"), ("sharded", sharded / "checkpoint-2")):
        out = tmp_path / f"one-{name}"
        out.mkdir()
        shutil.copytree(source, out / "checkpoint-2")
        starts.append(("ours", out, tmp_path / f"one-{name}.json", 1, "resume", "fsdp=0"))
    (tmp_path / "hf").mkdir()
    _unsharded_copy(runs["tmp"] / "ours" / "checkpoint-2", tmp_path / "hf" / "checkpoint-2")
    starts.append(("hf", tmp_path / "hf", tmp_path / "hf.json", 1, "resume", "fsdp=0"))
    *ours_runs, hf = _launch_all(*starts)
    for ours in ours_runs:
        _assert_weights_close(_weights(ours), _weights(hf))
        assert_log_history_equal(hf["log_history"], ours["log_history"])


def _global_relative_difference(actual, expected):
    num = sum(float(((actual[k] - v) ** 2).sum()) for k, v in expected.items())
    return (num / sum(float((v ** 2).sum()) for v in expected.values())) ** 0.5


@pytest.mark.slow
def test_fsdp2_options_train_as_without_them(tmp_path):
    # Dropout off, so two processes can be compared with one: activation checkpointing and cpu_offload (it runs on
    # CPU processes: the shards stay in CPU memory) change nothing in the numbers; bf16 mixed precision (parameters
    # gathered and gradients reduced in bf16) trains as one bf16 process does, within bf16's precision.
    variants = {"plain": (2,), "ac": (2, "ac"), "offload": (2, "offload"), "bf16": (2, "bf16"),
                "one": (1, "fsdp=0"), "one_bf16": (1, "fsdp=0", "bf16")}
    results = _launch_all(*[("ours", tmp_path / name, tmp_path / f"{name}.json", nproc, "dropout=0", *opts)
                            for name, (nproc, *opts) in variants.items()])
    runs = dict(zip(variants, results))
    for name in ("plain", "ac", "offload", "bf16"):
        assert runs[name]["world"] == 2 and runs[name]["model_class"].startswith("FSDP"), name
    for name in ("ac", "offload"):
        assert_log_history_equal(runs["plain"]["log_history"], runs[name]["log_history"])
        _assert_weights_close(_weights(runs[name]), _weights(runs["plain"]))
    # Two processes against one: the same training log; the weights as close as the summation order allows
    # (AdamW's first steps move a parameter whose gradient is nearly 0 by a whole learning rate either way). The
    # eval_loss differs on purpose: a batch split between the processes averages its tokens per part
    # (docs/distributed.md, "Evaluation and prediction").
    def training_rows(run):
        return [{k: row[k] for k in ("loss", "grad_norm", "learning_rate", "step")}
                for row in run["log_history"] if "loss" in row]

    for two, one, rel in (("plain", "one", 1e-5), ("bf16", "one_bf16", 5e-3)):
        expected, actual = training_rows(runs[one]), training_rows(runs[two])
        assert [row["step"] for row in actual] == [row["step"] for row in expected] == [1, 2, 3, 4]
        for e, a in zip(expected, actual):
            for key in ("loss", "grad_norm", "learning_rate"):
                assert a[key] == pytest.approx(e[key], rel=rel), (two, key, a["step"])
    assert _global_relative_difference(_weights(runs["plain"]), _weights(runs["one"])) < 1e-4
    assert _global_relative_difference(_weights(runs["bf16"]), _weights(runs["one_bf16"])) < 2e-2
    # bf16 really changed the arithmetic.
    assert _global_relative_difference(_weights(runs["bf16"]), _weights(runs["plain"])) > 1e-4


def test_parallelism_config_dp_shard_runs_fsdp2_with_hf_numbers(runs):
    # HF's Trainer refuses any ParallelismConfig on CPU processes (accelerate's MULTI_CPU); dp_shard_size=2 on GPUs
    # is FSDP2 over both processes, which is what HF's FSDP2 run does with fsdp=True here.
    pc, hf = runs["pc"], runs["hf"]
    assert pc["strategy"] == "HFFSDP2Strategy" and pc["model_class"].startswith("FSDP")
    assert pc["meshes"] == [[2]]  # every parameter sharded over the one dp_shard dimension of 2 processes
    assert_log_history_equal(hf["log_history"], pc["log_history"], skip_keys=("eval_loss",))
    _assert_weights_close(_weights(pc), _weights(hf))
    assert _checkpoints(runs["tmp"] / "pc") == _checkpoints(runs["tmp"] / "hf")


@pytest.mark.slow
def test_parallelism_config_dp_replicate_runs_ddp_with_hf_numbers(runs, tmp_path):
    # dp_replicate_size alone: plain data parallelism (accelerate runs DDP: nothing to shard across).
    (pc,) = _launch_all(("ours", tmp_path / "pc", tmp_path / "pc.json", 2, "pc=2,1", "fsdp=0"))
    assert pc["strategy"] == "DDPStrategy" and pc["meshes"] == []
    assert_log_history_equal(runs["hf"]["log_history"], pc["log_history"], skip_keys=("eval_loss",))
    _assert_weights_close(_weights(pc), _weights(runs["hf"]))


@pytest.mark.slow
def test_parallelism_config_hsdp_on_four_processes_matches_hf(tmp_path):
    # dp_replicate_size=2 x dp_shard_size=2: HSDP, each pair of processes shards one copy (a 2-D mesh), against
    # HF's 4-process run with the same arguments (DDP on CPU processes, the same numbers).
    hf, pc = _launch_all(("hf", tmp_path / "hf", tmp_path / "hf.json", 4, "batch=2"),
                         ("ours", tmp_path / "pc", tmp_path / "pc.json", 4, "batch=2", "pc=2,2"))
    assert pc["strategy"] == "HFFSDP2Strategy" and pc["meshes"] == [[2, 2]]
    assert_log_history_equal(hf["log_history"], pc["log_history"], skip_keys=("eval_loss",))
    _assert_weights_close(_weights(pc), _weights(hf))
