"""An encoder-decoder model (T5: ``shared`` / ``encoder.embed_tokens`` / ``decoder.embed_tokens`` / ``lm_head`` tied)
trained and evaluated with ``predict_with_generate`` under FSDP2 on 2 CPU processes (gloo, torchrun).

The default test launches our 2-process run once, then runs the one-process reference here, on the weights that run
saved (read with ``from_pretrained``). The slow test adds transformers' own FSDP2 run with the same arguments.

The eval set (13 rows, eval batch 4) gives process 0 two batches and process 1 three, and the generations end after
different numbers of tokens, so the processes need HF's synced generation (``synced_gpus``: a process whose rows
have all ended keeps running forwards while another still generates) and a process with no batch left must run the
others' whole evaluation step (generate, then the loss forward) to keep every FSDP all-gather matched.
"""

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from tests.distributed import seq2seq_fsdp_script as script
from tests.helpers.parity import assert_log_history_equal
from tests.helpers.torchrun import ROOT, launch_env, python_command, wait_or_fail

SCRIPT = Path(script.__file__)
N_EVAL = 13
# Timings differ between runs; `epoch` is 0 in the reference (it did not train).
UNTIMED = ("runtime", "per_second", "preparation_time", "epoch")


def _launch(lib, out, prefix, *opts):
    cmd = python_command(2) + [str(SCRIPT), lib, str(out), str(prefix), *opts]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_env(),
                            cwd=str(ROOT))


def _results(proc, prefix, name):
    wait_or_fail(proc, name)
    return [json.loads(Path(f"{prefix}.{rank}.json").read_text()) for rank in (0, 1)]


def _metrics(metrics):
    return {k: v for k, v in metrics.items() if not any(part in k for part in UNTIMED)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Our FSDP2 run (train, evaluate, predict, save_model) and the one-process reference on its saved weights."""
    tmp = tmp_path_factory.mktemp("seq2seq_fsdp")
    ours = _results(_launch("ours", tmp / "ours", tmp / "ours", f"save_model={tmp / 'final'}"), tmp / "ours", "ours")
    one, kept = script.run("ours", str(tmp / "one"), {"reference": str(tmp / "final")})
    return {"ours": ours, "one": one, "tmp": tmp, "kept": kept}


def _assert_like_one_process(results, one, sharded):
    """Each process's results equal the one-process run's; ``sharded``: the parameters are sharded (FSDP)."""
    # Generations end after different numbers of tokens (the last batch alone stops early).
    assert len({g["length"] for g in one["generated"]["predict"]}) > 1
    for rank, ours in enumerate(results):
        assert ours["world"] == 2 and ours["model_class"].startswith("FSDP") == sharded  # sharded by fully_shard
        # predict(): generated ids and labels in dataset order, and its metrics; evaluate() after training.
        assert ours["predictions"] == one["predictions"], rank
        assert ours["label_ids"] == one["label_ids"], rank
        for name in ("predict_metrics", "evaluate"):
            expected, actual = _metrics(one[name]), _metrics(ours[name])
            assert actual == pytest.approx(expected, rel=1e-5), (rank, name)
        # The last evaluation during training ran on the same (final) weights.
        last_eval = [row for row in ours["log_history"] if "eval_loss" in row][-2]
        assert last_eval["step"] == 4 and last_eval["eval_loss"] == pytest.approx(one["evaluate"]["eval_loss"],
                                                                                   rel=1e-5)
    # Each pass reads every row once over both processes, at most ceil(13 / 2) on each.
    for phase, passes in (("train", 2), ("evaluate", 1), ("predict", 1)):
        reads = [results[r]["reads"][phase] for r in (0, 1)]
        assert all(len(share) <= passes * math.ceil(N_EVAL / 2) for share in reads), (phase, reads)
        assert sorted(reads[0] + reads[1]) == sorted(list(range(N_EVAL)) * passes), phase
    # Synced generation when the parameters are sharded: every generate call is told to keep every process running
    # (synced_gpus); at some step the processes' outputs have different lengths; process 0 (two batches) runs a
    # third generate, the step it discards while process 1 evaluates its third batch. Under DDP none of that.
    gens = [ours["generated"] for ours in results]
    assert all(g["synced_gpus"] is sharded for rank in gens for phase in rank.values() for g in phase)
    for phase in ("evaluate", "predict"):
        assert [len(rank[phase]) for rank in gens] == ([3, 3] if sharded else [2, 3]), phase
        assert any(a["length"] != b["length"] for a, b in zip(gens[0][phase], gens[1][phase])), phase


def test_t5_under_fsdp2_evaluates_and_predicts_like_one_process(runs):
    _assert_like_one_process(runs["ours"], runs["one"], sharded=True)


@pytest.mark.slow
def test_t5_under_ddp_evaluates_and_predicts_like_one_process(tmp_path):
    """The same under DDP: no synced generation, no repeated step (the parameters are whole on each process)."""
    ours = _results(_launch("ours", tmp_path / "ours", tmp_path / "ours", "fsdp=0", f"save_model={tmp_path / 'final'}"),
                    tmp_path / "ours", "ddp")
    one, _ = script.run("ours", str(tmp_path / "one"), {"reference": str(tmp_path / "final")})
    _assert_like_one_process(ours, one, sharded=False)


def test_tied_weights_stay_tied_and_are_saved_as_hf_saves_them(runs):
    import safetensors.torch
    from transformers import T5ForConditionalGeneration

    final = runs["tmp"] / "final"
    ours = runs["ours"][0]
    # As HF's FSDP run writes it: the gathered tied weights are copies of their own, so save_pretrained stores
    # each of them (one process drops them: they share memory there).
    weights = {k: torch.tensor(v) for k, v in ours["weights"].items()}
    saved = safetensors.torch.load_file(final / "model.safetensors")
    assert sorted(saved) == sorted(weights)
    for key, value in saved.items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)
    # The gathered weights: the tied copies are one tensor after training.
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        if key in weights:
            assert torch.equal(weights[key], weights["shared.weight"]), key
    # checkpoint-4 (FULL_STATE_DICT) holds the same model.safetensors, and the full state dict with the tied copies.
    checkpoint = runs["tmp"] / "ours" / "checkpoint-4"
    in_checkpoint = safetensors.torch.load_file(checkpoint / "model.safetensors")
    assert sorted(in_checkpoint) == sorted(saved)
    assert all(torch.equal(in_checkpoint[k], saved[k]) for k in saved)
    full = torch.load(checkpoint / "pytorch_model_fsdp.bin", weights_only=True)
    tied_keys = [k for k in full if "embed_tokens" in k or k == "lm_head.weight"]
    assert all(torch.equal(full[k], full["shared.weight"]) for k in tied_keys)
    model = T5ForConditionalGeneration.from_pretrained(final)
    assert model.lm_head.weight is model.shared.weight is model.encoder.embed_tokens.weight
    assert model.decoder.embed_tokens.weight is model.shared.weight
    torch.testing.assert_close(model.shared.weight.detach(), weights["shared.weight"], rtol=0, atol=0)


@pytest.mark.slow
def test_t5_fsdp2_training_matches_hf_fsdp2(runs):
    """transformers' own FSDP2 Seq2SeqTrainer run, same arguments: the training log and the final weights."""
    tmp = runs["tmp"]
    hf = _results(_launch("hf", tmp / "hf", tmp / "hf", f"save_model={tmp / 'hf-final'}"), tmp / "hf", "hf")
    for rank in (0, 1):
        assert hf[rank]["model_class"].startswith("FSDP")  # HF's real FSDP2 path (accelerate_fsdp_on_cpu)
        assert all(g["synced_gpus"] is True for phase in hf[rank]["generated"].values() for g in phase)
    ours = runs["ours"][0]
    # HF's evaluation pads the last round with repeated rows (16 rows for 13), so its eval metrics differ on
    # purpose; ours equal the one-process run (test above).
    eval_keys = tuple(k for row in hf[0]["log_history"] for k in row if k.startswith("eval_"))
    assert_log_history_equal(hf[0]["log_history"], ours["log_history"], skip_keys=eval_keys)
    assert hf[0]["predict_metrics"]["test_rows"] == 16 and ours["predict_metrics"]["test_rows"] == N_EVAL
    # The checkpoint folders hold the same files (HF's real FSDP2 layout; ours adds its training_args.json).
    hf_files = sorted(p.name for p in (tmp / "hf" / "checkpoint-4").iterdir())
    assert sorted(p.name for p in (tmp / "ours" / "checkpoint-4").iterdir() if p.name != "training_args.json") \
        == hf_files
    hf_weights = {k: torch.tensor(v) for k, v in hf[0]["weights"].items()}
    weights = {k: torch.tensor(v) for k, v in ours["weights"].items()}
    assert sorted(weights) == sorted(hf_weights)
    for key, value in hf_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6, msg=key)
    import safetensors.torch

    theirs = safetensors.torch.load_file(tmp / "hf-final" / "model.safetensors")
    mine = safetensors.torch.load_file(tmp / "final" / "model.safetensors")
    # Both files hold every tied copy (gathered as tensors of their own, so save_pretrained keeps them).
    assert sorted(mine) == sorted(theirs)
    for key, value in mine.items():
        torch.testing.assert_close(value, theirs[key], rtol=1e-5, atol=1e-6, msg=key)
