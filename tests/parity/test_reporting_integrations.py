"""``report_to`` integrations served by transformers' own callbacks record the same thing under both trainers.

The same script (tiny BERT with dropout, evaluation and checkpoints during training, a later ``evaluate()``) runs
with ``transformers.Trainer`` and with ``hf_lightning.Trainer``, each in its own interpreter (ClearML keeps one
task per process), with ``report_to=["trackio", "clearml"]`` offline: trackio writes a local SQLite database,
ClearML an offline session folder. What each integration recorded is read back and compared.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMED = ("runtime", "per_second")

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    from tests.helpers.models import classification_data, tiny_bert_classifier

    kind, out = sys.argv[1], sys.argv[2]
    if kind == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    torch.set_num_threads(1)
    # The script opens the ClearML task itself (HF's callback connects to it), without repository detection:
    # from HF's callback, ClearML analyses the transformers package and waits up to 300 s for it at exit.
    from clearml import Task

    task = Task.init(project_name="HuggingFace Transformers", task_name="Trainer",
                     auto_connect_frameworks={"tensorboard": False, "pytorch": False, "detect_repository": False})
    args = lib.TrainingArguments(
        output_dir=out, use_cpu=True, seed=42, report_to=["trackio", "clearml"], per_device_train_batch_size=4,
        per_device_eval_batch_size=4, num_train_epochs=2, logging_steps=2, eval_strategy="steps", eval_steps=3,
        save_strategy="steps", save_steps=4, save_total_limit=1, disable_tqdm=True, run_name="run", project=kind,
        trackio_static_space_id=False)
    trainer = lib.Trainer(model=tiny_bert_classifier(), args=args, train_dataset=classification_data(n=24),
                          eval_dataset=classification_data(n=8, seed=5))
    trainer.train()
    trainer.evaluate()
    task.close()

    # What trackio stored (read here: trackio fixes its folder from TRACKIO_DIR when imported).
    import json

    from trackio.sqlite_storage import SQLiteStorage

    with open(out + "_trackio.json", "w") as fh:
        json.dump({"logs": SQLiteStorage.get_logs(kind, "run"), "config": SQLiteStorage.get_run_config(kind, "run")},
                  fh, default=str)
    """
)


def _run(kind: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TRACKIO_DIR=str(tmp_path / "trackio"),
        CLEARML_OFFLINE_MODE="1",
        # HF's checkpoint upload (on_save) fails in ClearML's offline mode under transformers.Trainer too.
        CLEARML_LOG_MODEL="FALSE",
        CLEARML_TASK_NO_REUSE="1",
        CLEARML_CACHE_DIR=str(tmp_path / f"clearml_{kind}"),
        CLEARML_CONFIG_FILE=str(tmp_path / "clearml.conf"),  # none: ClearML's defaults, no ~/clearml.conf
        HF_HUB_OFFLINE="1",
    )
    completed = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(tmp_path / kind)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, f"{kind}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(t in k for t in TIMED)}


def _trackio(tmp_path: Path, kind: str) -> tuple[list[dict], dict]:
    with open(tmp_path / f"{kind}_trackio.json") as fh:
        stored = json.load(fh)
    logs = [_untimed({k: v for k, v in row.items() if k != "timestamp" and not k.startswith("system/")})
            for row in stored["logs"]]
    return logs, stored["config"] or {}


def _clearml(tmp_path: Path, kind: str) -> tuple[list[tuple], dict]:
    (session,) = [d for d in glob.glob(str(tmp_path / f"clearml_{kind}" / "offline" / "*")) if os.path.isdir(d)]
    scalars = []
    with open(os.path.join(session, "metrics.jsonl")) as fh:
        for line in fh:
            for event in json.loads(line):
                if event.get("type") == "training_stats_scalar" and not any(t in event["variant"] for t in TIMED):
                    scalars.append((event["metric"], event["variant"], event["iter"], event["value"]))
    with open(os.path.join(session, "task.json")) as fh:
        task = json.load(fh)
    return scalars, task


@pytest.mark.slow
def test_trackio_and_clearml_record_what_hf_records(tmp_path):
    pytest.importorskip("trackio")
    pytest.importorskip("clearml")
    for kind in ("hf", "ours"):
        _run(kind, tmp_path)

    hf_logs, hf_config = _trackio(tmp_path, "hf")
    ours_logs, ours_config = _trackio(tmp_path, "ours")
    assert len(hf_logs) == 12  # 6 training logs, 4 evaluations in training, the summary, the later evaluate()
    assert [sorted(r) for r in ours_logs] == [sorted(r) for r in hf_logs]
    for hf_row, ours_row in zip(hf_logs, ours_logs):
        assert ours_row == pytest.approx(hf_row, rel=1e-5)
    # The run's config: HF's TrainingArguments.to_dict() over the model's config, plus the parameter count.
    differing = {k for k in set(hf_config) | set(ours_config)
                 if str(hf_config.get(k)) != str(ours_config.get(k))}
    assert differing <= {"output_dir", "project", "logging_dir", "_Created", "_Username", "_Group"}, differing
    assert ours_config["model/num_parameters"] == hf_config["model/num_parameters"]

    hf_scalars, hf_task = _clearml(tmp_path, "hf")
    ours_scalars, ours_task = _clearml(tmp_path, "ours")
    assert len(hf_scalars) > 20
    assert [s[:3] for s in ours_scalars] == [s[:3] for s in hf_scalars]
    assert [s[3] for s in ours_scalars] == pytest.approx([s[3] for s in hf_scalars], rel=1e-5)
    # The training arguments as ClearML hyperparameters: HF's, with the same values (the output folder aside).
    # ClearML copies every dataclass field, so ours adds the 4.x names and accelerator_config's keys (a dict here;
    # HF's AcceleratorConfig object is skipped by ClearML as not a builtin type).
    from dataclasses import fields

    import hf_lightning

    hf_params = hf_task["hyperparams"]["Transformers"]
    ours_params = ours_task["hyperparams"]["Transformers"]
    kw_only = {f.name for f in fields(hf_lightning.TrainingArguments) if f.kw_only}
    extra = {k for k in set(ours_params) - set(hf_params) if k.split("/")[0] not in ("accelerator_config",)}
    assert extra and extra <= kw_only, extra - kw_only
    assert set(hf_params) <= set(ours_params)
    assert {k for k in hf_params if hf_params[k]["value"] != ours_params[k]["value"]} == {"output_dir", "project"}
