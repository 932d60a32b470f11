"""FSDP2 on 2 CPU processes (gloo) through torchrun, against transformers' own FSDP2 run with the same arguments.

Out of the box accelerate turns FSDP on only for GPU-family devices, so transformers' Trainer trains
``fsdp=True`` + ``fsdp_config={"version": 2, ...}`` on CPU processes with DDP. The reference here is HF's real FSDP2
run instead (``fsdp_script.py hf_fsdp``: ``tests/helpers/hf_fsdp.py`` lifts that one gate, and transformers and
accelerate run the code they run on GPUs: ``fully_shard``, DTensor clipping, ``save_fsdp_model`` / ``load_fsdp_model``
and the optimizer's). Its numbers, its ``checkpoint-N`` folders (FULL and SHARDED state dicts) and its resumes are
compared with ours, also for HSDP (``parallelism_config``, 4 processes). HF's plain run remains the reference where
HF's FSDP run cannot be one (one process, ``dp_replicate_size`` alone: DDP).
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


def _resume_from(source, out):
    """``out`` holding a copy of the ``checkpoint-2`` folder ``source`` (the run resumes its last checkpoint)."""
    out.mkdir()
    shutil.copytree(source, out / "checkpoint-2")
    return out


def _assert_resumed_at_step_2(resumed, uninterrupted):
    # The same steps 1-4 in the log (steps 1-2 come from the checkpoint's trainer_state.json); train_loss averages
    # the steps this run trained, so it proves the run started at step 2 and did not train from scratch.
    assert_log_history_equal(uninterrupted["log_history"], resumed["log_history"], ordered=False,
                             skip_keys=("eval_loss", "train_loss"))
    losses = [row["loss"] for row in uninterrupted["log_history"] if "loss" in row]
    assert len(losses) == 4
    assert resumed["log_history"][-1]["train_loss"] == pytest.approx(sum(losses[2:]) / 2, rel=1e-5)
    _assert_weights_close(_weights(resumed), _weights(uninterrupted))


def _dcp_contents(folder):
    """A ``torch.distributed.checkpoint`` folder read whole in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = folder.parent / f"{folder.name}.pt"
    dcp_to_torch_save(folder, target)
    return torch.load(target, weights_only=True)


@pytest.fixture(scope="module")
def sharded(runs):
    """HF's FSDP2 run and ours with ``state_dict_type=SHARDED_STATE_DICT`` (slow tests only)."""
    tmp = runs["tmp"]
    hf, ours = _launch_all(("hf_fsdp", tmp / "hf-sharded", tmp / "hf-sharded.json", 2, "sdt=SHARDED"),
                           ("ours", tmp / "ours-sharded", tmp / "ours-sharded.json", 2, "sdt=SHARDED"))
    return {"hf": hf, "ours": ours, "hf_out": tmp / "hf-sharded", "ours_out": tmp / "ours-sharded"}


@pytest.mark.slow
def test_sharded_checkpoints_match_hf_fsdp2_folders(runs, sharded):
    hf_out, ours_out = sharded["hf_out"], sharded["ours_out"]
    assert _checkpoints(ours_out) == _checkpoints(hf_out) == ["checkpoint-2", "checkpoint-4"]
    for name in _checkpoints(hf_out):
        # Ours adds config.json and training_args.bin/json (HF's save_model writes no model files under
        # SHARDED_STATE_DICT, so its folder has neither; docs/migration.md).
        theirs = sorted(p.name for p in (hf_out / name).iterdir())
        assert theirs == ["optimizer_0", "pytorch_model_fsdp_0", "rng_state_0.pth", "rng_state_1.pth",
                          "scheduler.pt", "trainer_state.json"]
        extra = {"config.json", "training_args.bin", "training_args.json"}
        assert sorted(p.name for p in (ours_out / name).iterdir() if p.name not in extra) == theirs
        for folder in ("optimizer_0", "pytorch_model_fsdp_0"):
            listings = [sorted(p.name for p in (out / name / folder).iterdir()) for out in (ours_out, hf_out)]
            assert listings[0] == listings[1] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    _assert_weights_close(_weights(sharded["ours"]), _weights(sharded["hf"]))
    mine = _dcp_contents(ours_out / "checkpoint-4" / "pytorch_model_fsdp_0")["model"]
    _assert_weights_close(mine, _dcp_contents(hf_out / "checkpoint-4" / "pytorch_model_fsdp_0")["model"])
    mine = _dcp_contents(ours_out / "checkpoint-4" / "optimizer_0")["optimizer"]
    theirs = _dcp_contents(hf_out / "checkpoint-4" / "optimizer_0")["optimizer"]
    assert mine["param_groups"] == theirs["param_groups"] and sorted(mine["state"]) == sorted(theirs["state"])
    for name, state in theirs["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(mine["state"][name][key], value, rtol=1e-5, atol=1e-8, msg=(name, key))


@pytest.mark.slow
def test_checkpoints_resume_both_ways_with_hf_fsdp2(runs, sharded, tmp_path):
    # HF's real FSDP2 run and ours each resume the other's checkpoint-2, SHARDED_STATE_DICT and FULL_STATE_DICT, and
    # end at the uninterrupted run's weights.
    tmp = runs["tmp"]
    starts = {
        "sharded hf->ours": ("ours", _resume_from(sharded["hf_out"] / "checkpoint-2", tmp_path / "a"), "sdt=SHARDED"),
        "sharded ours->hf": ("hf_fsdp", _resume_from(sharded["ours_out"] / "checkpoint-2", tmp_path / "b"),
                             "sdt=SHARDED"),
        "full hf->ours": ("ours", _resume_from(tmp / "hf" / "checkpoint-2", tmp_path / "c")),
        "full ours->hf": ("hf_fsdp", _resume_from(tmp / "ours" / "checkpoint-2", tmp_path / "d")),
    }
    results = _launch_all(*[(lib, out, out / "result.json", 2, "resume", *opts)
                            for lib, out, *opts in starts.values()])
    for name, resumed in zip(starts, results):
        assert resumed["model_class"].startswith("FSDP"), name
        _assert_resumed_at_step_2(resumed, sharded["hf"] if name.startswith("sharded") else runs["hf"])


@pytest.mark.slow
def test_checkpoint_of_the_other_state_dict_type_resumes(runs, sharded, tmp_path):
    # HF's FSDP2 run fails on a checkpoint of the other layout (accelerate's load_fsdp_model reads the files of the
    # configured state_dict_type only: FileNotFoundError for pytorch_model_fsdp_0/.metadata or
    # pytorch_model_fsdp.bin). Ours reads whichever layout the folder has and ends at the uninterrupted weights.
    tmp = runs["tmp"]
    full, shards = tmp / "hf" / "checkpoint-2", sharded["hf_out"] / "checkpoint-2"
    ours = [("ours", _resume_from(full, tmp_path / "full-as-sharded"), "sdt=SHARDED"),
            ("ours", _resume_from(shards, tmp_path / "sharded-as-full"), "sdt=FULL")]
    hf = [("hf_fsdp", _resume_from(full, tmp_path / "hf-full-as-sharded"), "sdt=SHARDED"),
          ("hf_fsdp", _resume_from(shards, tmp_path / "hf-sharded-as-full"), "sdt=FULL")]
    procs = [subprocess.Popen(_command(lib, out, out / "result.json", 2, "resume", *opts), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(ROOT))
             for lib, out, *opts in ours + hf]
    outcomes = [(proc.returncode, err) for proc in procs for _, err in [proc.communicate(timeout=600)]]
    for (returncode, err), (_, out, opts) in zip(outcomes[:2], ours):
        assert returncode == 0, err[-4000:]
        _assert_resumed_at_step_2(json.loads((out / "result.json").read_text()), runs["hf"])
    (full_rc, full_err), (sharded_rc, sharded_err) = outcomes[2:]
    assert full_rc != 0 and "No such file or directory" in full_err and "pytorch_model_fsdp_0" in full_err
    assert sharded_rc != 0 and "No such file or directory" in sharded_err and "pytorch_model_fsdp.bin" in sharded_err


@pytest.mark.slow
def test_load_best_model_at_end_under_sharded_state_dict_matches_hf_fsdp2(tmp_path):
    # eval_loss is best at step 2 of 6 (lr 3e-2), so the best is not the last checkpoint; both runs keep it through
    # save_total_limit=2 and load it at the end from its pytorch_model_fsdp_0/.
    opts = ("sdt=SHARDED", "best", "lr=3e-2", "max_steps=6")
    hf, ours = _launch_all(("hf_fsdp", tmp_path / "hf", tmp_path / "hf.json", 2, *opts),
                           ("ours", tmp_path / "ours", tmp_path / "ours.json", 2, *opts))
    for run, out in ((hf, tmp_path / "hf"), (ours, tmp_path / "ours")):
        evals = [row["eval_loss"] for row in run["log_history"] if "eval_loss" in row]
        assert len(evals) == 3 and min(evals) == evals[0]
        assert run["best_model_checkpoint"] == str(out / "checkpoint-2")
        assert _checkpoints(out) == ["checkpoint-2", "checkpoint-6"]
    assert_log_history_equal(hf["log_history"], ours["log_history"], skip_keys=("eval_loss",))
    _assert_weights_close(_weights(ours), _weights(hf))
    best = _dcp_contents(tmp_path / "ours" / "checkpoint-2" / "pytorch_model_fsdp_0")["model"]
    last = _dcp_contents(tmp_path / "ours" / "checkpoint-6" / "pytorch_model_fsdp_0")["model"]
    _assert_weights_close(_weights(ours), best)
    assert not torch.allclose(_weights(ours)["transformer.wte.weight"], last["transformer.wte.weight"])


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
    # Out of the box HF's Trainer refuses any ParallelismConfig on CPU processes (accelerate's MULTI_CPU); with the
    # gate lifted its dp_shard_size=2 run is FSDP2 over both processes, bit-identical to its fsdp=True run (the
    # reference here; measured once, not launched again to save a run).
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
    # HF's real 4-process HSDP run with the same arguments (accepted on CPU processes once the gate is lifted).
    hf, pc = _launch_all(("hf_fsdp", tmp_path / "hf", tmp_path / "hf.json", 4, "batch=2", "pc=2,2"),
                         ("ours", tmp_path / "pc", tmp_path / "pc.json", 4, "batch=2", "pc=2,2"))
    assert pc["strategy"] == "HFFSDP2Strategy" and pc["meshes"] == hf["meshes"] == [[2, 2]]
    assert_log_history_equal(hf["log_history"], pc["log_history"], skip_keys=("eval_loss",))
    _assert_weights_close(_weights(pc), _weights(hf))
