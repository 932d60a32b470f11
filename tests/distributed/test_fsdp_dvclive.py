"""DVCLive's model logging (``HF_DVCLIVE_LOG_MODEL=true``) under FSDP2 on 2 CPU processes.

HF's ``DVCLiveCallback`` saves the model at the end of training on the main process only (through a throwaway
Trainer's ``save_model``); with the model sharded, that save is a collective the other process never joins, so the
run fails or hangs at its end (without the fix here: the main process's gather fails once the other has left).
hf_lightning gathers the full weights on every process and writes them on the main one.
"""

import subprocess
from pathlib import Path

import torch
import yaml

from tests.helpers.dvc import dvc_workspace
from tests.helpers.torchrun import launch_env, python_command

SCRIPT = Path(__file__).with_name("dvclive_fsdp_script.py")


def test_dvclive_logs_the_full_model_of_an_fsdp2_run(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    root = dvc_workspace(tmp_path / "repo", monkeypatch)
    result = tmp_path / "weights.pt"
    proc = subprocess.run(python_command(2) + [str(SCRIPT), str(result)], cwd=root, env=launch_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trained = torch.load(result, weights_only=True)
    saved = root / "out" / "last"
    logged = load_file(saved / "model.safetensors")
    # The full weights, as HF's FSDP save writes them: the tied lm_head (gathered as a copy of wte) stored too.
    assert sorted(logged) == sorted(trained)
    for key, value in logged.items():
        torch.testing.assert_close(value, trained[key], rtol=0, atol=0, msg=key)
    model = GPT2LMHeadModel.from_pretrained(saved)
    torch.testing.assert_close(model.lm_head.weight, trained["transformer.wte.weight"], rtol=0, atol=0)
    # DVCLive copied it into its artifacts and recorded it in dvc.yaml.
    assert (root / "dvclive" / "artifacts" / "last" / "model.safetensors").is_file()
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())
    assert dvc_yaml["artifacts"] == {"last": {"path": "dvclive/artifacts/last", "type": "model"}}
