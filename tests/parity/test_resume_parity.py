"""Resume: a checkpoint written by either library resumes in either and ends where an uninterrupted run ends."""

import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.models import gpt2_dropout, lm_data, tiny_gpt2
from tests.helpers.parity import assert_log_history_equal, assert_weights_close

ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
            save_steps=4, learning_rate=3e-3, report_to="none", use_cpu=True, disable_tqdm=True, seed=42)


# train_loss and the speed metrics cover only the steps of one train() call (HF 5.x), so a resumed run's final
# entry differs from an uninterrupted run's by design; everything else must match.
RUN_SCOPED = ("train_loss",)

MODELS = {"no_dropout": lambda: tiny_gpt2(), "dropout": gpt2_dropout}


def _train(lib_name, make_model, output_dir, resume=None, **extra):
    import transformers

    import hf_lightning

    lib = transformers if lib_name == "hf" else hf_lightning
    torch.set_num_threads(1)
    train, evald = lm_data(n_train=64, n_eval=8)
    args = lib.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **extra})
    model = make_model()
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evald)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module", params=["no_dropout", "dropout"])
def reference(request, tmp_path_factory):
    """An uninterrupted HF run that leaves checkpoint-4 (mid-epoch), -8 (epoch end), -12 and -16."""
    out = tmp_path_factory.mktemp(f"hf_full_{request.param}")
    trainer = _train("hf", MODELS[request.param], out)
    return request.param, out, trainer.state.log_history, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("step", [4, 8, 12])
@pytest.mark.parametrize("writer", ["hf", "ours"])
def test_ours_resumes_to_the_uninterrupted_run(tmp_path, reference, step, writer):
    model_name, hf_out, hf_log, hf_weights = reference
    if writer == "hf":
        source = hf_out / f"checkpoint-{step}"
    else:
        ours_full = _train("ours", MODELS[model_name], tmp_path / "ours_full")
        assert_log_history_equal(hf_log, ours_full.state.log_history)
        source = tmp_path / "ours_full" / f"checkpoint-{step}"
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(source, out / f"checkpoint-{step}")
    resumed = _train("ours", MODELS[model_name], out, resume=True)
    assert resumed.state.global_step == 16
    assert_log_history_equal(hf_log, resumed.state.log_history, ordered=False, skip_keys=RUN_SCOPED)
    assert_weights_close(hf_weights, resumed.model.state_dict())


@pytest.mark.parametrize("step", [4, 8])
def test_hf_resumes_from_our_checkpoint(tmp_path, reference, step):
    model_name, hf_out, hf_log, hf_weights = reference
    _train("ours", MODELS[model_name], tmp_path / "ours_full")
    out = tmp_path / "hf_resumed"
    out.mkdir()
    shutil.copytree(tmp_path / "ours_full" / f"checkpoint-{step}", out / f"checkpoint-{step}")
    resumed = _train("hf", MODELS[model_name], out, resume=True)
    assert_log_history_equal(hf_log, resumed.state.log_history, ordered=False, skip_keys=RUN_SCOPED)
    assert_weights_close(hf_weights, resumed.model.state_dict())


def test_resume_true_without_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="No valid checkpoint found in output directory"):
        _train("ours", MODELS["no_dropout"], tmp_path / "empty", resume=True)


def test_resume_from_folder_without_weights_errors(tmp_path):
    bad = tmp_path / "checkpoint-3"
    bad.mkdir()
    (bad / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match="Can't find a valid checkpoint at"):
        _train("ours", MODELS["no_dropout"], tmp_path / "out", resume=str(bad))


def test_lightning_native_ckpt_path(tmp_path, reference):
    """fit(ckpt_path=<HF checkpoint folder>) on the Lightning-native path resumes like the facade."""
    from hf_lightning import HFDataModule, HFLightningModule, TrainingArguments, build_lightning_trainer

    model_name, hf_out, hf_log, hf_weights = reference
    torch.set_num_threads(1)
    train, evald = lm_data(n_train=64, n_eval=8)
    args = TrainingArguments(output_dir=str(tmp_path / "native"), **ARGS)
    model = MODELS[model_name]()
    trainer = build_lightning_trainer(args, enable_progress_bar=False)
    trainer.fit(HFLightningModule(model, args), datamodule=HFDataModule(args, train_dataset=train),
                ckpt_path=str(hf_out / "checkpoint-4"))
    assert trainer.global_step == 16
    flow = next(cb for cb in trainer.callbacks if type(cb).__name__ == "HFFlowCallback")
    assert_log_history_equal(hf_log, flow.state.log_history, ordered=False, skip_keys=RUN_SCOPED)
    assert_weights_close(hf_weights, model.state_dict())
