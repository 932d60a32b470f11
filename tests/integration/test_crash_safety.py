"""Crash safety: SIGKILL while a checkpoint is being written, then resume, ends where a clean run ends.

The child process is really killed (SIGKILL, no cleanup runs); the kill point is made deterministic by
patching a step inside the checkpoint writer to kill the process when it reaches the chosen checkpoint.
"""

import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import os, signal, sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    import hf_lightning
    from hf_lightning.checkpointing import writer as fmt
    from tests.helpers.models import lm_data, tiny_gpt2

    out, kill_at, where, result = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if kill_at:
        if where == "publish":
            original = fmt._publish
            def publish(temporary, final, **kwargs):
                if final.endswith(f"checkpoint-{{kill_at}}"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(temporary, final, **kwargs)
            fmt._publish = publish
        else:  # in the middle of writing the folder's files
            original = torch.save
            def save(obj, f, *a, **k):
                if str(f).endswith("optimizer.pt") and f"checkpoint-{{kill_at}}" in str(f):
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(obj, f, *a, **k)
            torch.save = save
    train, _ = lm_data(n_train=32)
    args = hf_lightning.TrainingArguments(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=8, logging_steps=1, save_steps=2, save_total_limit=2, learning_rate=3e-3, report_to="none",
        use_cpu=True, disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=train)
    last = hf_lightning.get_last_checkpoint(out) if os.path.isdir(out) else None
    trainer.train(resume_from_checkpoint=last)
    from safetensors.torch import save_file
    save_file({{k: v.contiguous() for k, v in trainer.model.state_dict().items() if k != "lm_head.weight"}}, result)
''')


def _child(tmp_path, *argv):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT)))
    return subprocess.run([sys.executable, str(script), *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def clean_weights(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    proc = _child(tmp, tmp / "out", 0, "none", tmp / "w.safetensors")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(str(tmp / "w.safetensors"))


# Slow mode: both points are also among the kill fuzz's deterministic kill points, and the default suite's fuzz trial
# and kill-before-rotation case kill real saves too.
@pytest.mark.slow
@pytest.mark.parametrize("where", ["publish", "files"])
def test_sigkill_while_saving_then_resume(tmp_path, clean_weights, where):
    out = tmp_path / "out"
    killed = _child(tmp_path, out, 6, where, tmp_path / "unused.safetensors")
    assert killed.returncode == -signal.SIGKILL
    # The interrupted checkpoint-6 is not there; the last complete one is.
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert names == ["checkpoint-2", "checkpoint-4"]
    assert Path(str(__import__("hf_lightning").get_last_checkpoint(str(out)))).name == "checkpoint-4"
    resumed = _child(tmp_path, out, 0, "none", tmp_path / "w.safetensors")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    weights = load_file(str(tmp_path / "w.safetensors"))
    for key, value in clean_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6)
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-checkpoint")]


class _Payload:
    def __reduce__(self):
        return (os.mkdir, (os.environ["HFL_MARKER"],))


@pytest.mark.parametrize("victim", ["optimizer.pt", "rng_state.pth", "scheduler.pt"])
def test_tampered_checkpoint_is_refused_without_running_code(tmp_path, victim, monkeypatch):
    import hf_lightning
    from tests.helpers.models import lm_data, tiny_gpt2

    train, _ = lm_data(n_train=16)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                          max_steps=2, save_steps=2, report_to="none", use_cpu=True,
                                          disable_tqdm=True)
    hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=train).train()
    ckpt = tmp_path / "out" / "checkpoint-2"
    marker = tmp_path / "pwned"
    monkeypatch.setenv("HFL_MARKER", str(marker))
    with open(ckpt / victim, "wb") as f:
        pickle.dump({"state": _Payload()}, f)
    args2 = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                           max_steps=4, save_steps=2, report_to="none", use_cpu=True,
                                           disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args2, train_dataset=train)
    with pytest.raises(ValueError, match=victim.replace(".", r"\.")) as err:
        trainer.train(resume_from_checkpoint=str(ckpt))
    assert "weights_only=False" not in str(err.value)
    assert not marker.exists()
