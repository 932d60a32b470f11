"""Training parity: the same run through transformers.Trainer and hf_lightning.Trainer (CPU, dropout 0)."""

import numpy as np
import pytest
import torch

from tests.helpers.models import (
    classification_data,
    lm_data,
    pad_collator,
    padded_lm_data,
    regression_data,
    RegressionModel,
    tiny_bert_classifier,
    tiny_gpt2,
    tiny_llama,
)
from tests.helpers.parity import assert_log_history_equal, assert_parity, run, run_pair


def _gpt2_96():
    return tiny_gpt2(vocab=96, n_positions=32)


CAUSAL_MODELS = {"gpt2": _gpt2_96, "llama": tiny_llama}


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
def test_padded_batches_partial_window_mid_epoch_stop(tmp_path, model_name):
    """37 variable-length rows, B=4, GA=3: windows 3,3,3,1 per epoch; max_steps=7 stops mid-epoch 2."""
    hf, ours = run_pair(
        CAUSAL_MODELS[model_name], tmp_path, train_dataset=padded_lm_data(),
        args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, max_steps=7, logging_steps=1,
                  learning_rate=3e-3, lr_scheduler_type="constant_with_warmup", warmup_steps=2,
                  save_strategy="no"),
        trainer_kwargs=dict(data_collator=pad_collator),
    )
    assert_parity(hf, ours)
    assert [e["epoch"] for e in ours.log_history[:5]] == [e["epoch"] for e in hf.log_history[:5]]


@pytest.mark.parametrize("epochs,ga,logging_steps", [(1.5, 2, 3), (2, 3, 1), (1, 5, 2)])
def test_fractional_epochs_and_accumulation(tmp_path, epochs, ga, logging_steps):
    train, _ = lm_data(n_train=40)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train,
        args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=ga, num_train_epochs=epochs,
                  logging_steps=logging_steps, learning_rate=3e-3, save_strategy="no"),
    )
    assert_parity(hf, ours)


def test_ratio_logging_and_eval_steps_with_weight_decay(tmp_path):
    train, evald = lm_data(n_train=64, n_eval=12)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2,
                  logging_steps=0.1, eval_strategy="steps", eval_steps=0.25, weight_decay=0.1,
                  learning_rate=3e-3, save_strategy="no", per_device_eval_batch_size=5),
    )
    assert_parity(hf, ours)
    assert any("eval_loss" in e for e in ours.log_history)


@pytest.mark.parametrize("model_name", ["gpt2", "bert"])
def test_label_smoothing(tmp_path, model_name):
    if model_name == "gpt2":
        make, train = (lambda: tiny_gpt2()), lm_data(n_train=24)[0]
    else:
        make, train = (lambda: tiny_bert_classifier()), classification_data()
    hf, ours = run_pair(
        make, tmp_path, train_dataset=train,
        args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1,
                  logging_steps=1, label_smoothing_factor=0.1, learning_rate=1e-3, save_strategy="no"),
    )
    assert_parity(hf, ours)


SCHEDULERS = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine_with_restarts", {"num_cycles": 2}),
    ("polynomial", {"power": 2.0}),
    ("constant", {}),
    ("constant_with_warmup", {}),
    ("inverse_sqrt", {}),
    ("cosine_with_min_lr", {"min_lr": 1e-5}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("warmup_stable_decay", {"num_decay_steps": 4}),
]


@pytest.mark.parametrize("name,kwargs", SCHEDULERS)
def test_every_scheduler_lr_sequence(tmp_path, name, kwargs):
    train = regression_data(n=48)
    hf, ours = run_pair(
        RegressionModel, tmp_path, train_dataset=train,
        args=dict(per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1, warmup_steps=3,
                  learning_rate=1e-2, lr_scheduler_type=name, lr_scheduler_kwargs=kwargs, save_strategy="no"),
    )
    hf_lrs = [e["learning_rate"] for e in hf.log_history if "learning_rate" in e]
    ours_lrs = [e["learning_rate"] for e in ours.log_history if "learning_rate" in e]
    assert len(hf_lrs) == 12
    assert ours_lrs == hf_lrs
    assert_parity(hf, ours)


def test_reduce_lr_on_plateau(tmp_path):
    train, evald = regression_data(n=32), regression_data(n=8, seed=9)
    hf, ours = run_pair(
        RegressionModel, tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(per_device_train_batch_size=4, num_train_epochs=3, logging_steps=2, eval_strategy="steps",
                  eval_steps=2, learning_rate=5e-2, lr_scheduler_type="reduce_lr_on_plateau",
                  lr_scheduler_kwargs={"patience": 0, "factor": 0.5}, save_strategy="no"),
    )
    assert_parity(hf, ours)


def test_bert_classifier_with_metrics(tmp_path):
    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    hf, ours = run_pair(
        lambda: tiny_bert_classifier(), tmp_path, train_dataset=classification_data(n=40),
        eval_dataset=classification_data(n=14, seed=11),
        args=dict(per_device_train_batch_size=4, num_train_epochs=2, logging_steps=3, eval_strategy="epoch",
                  learning_rate=1e-3, save_strategy="no", per_device_eval_batch_size=4),
        trainer_kwargs=dict(compute_metrics=accuracy),
    )
    assert_parity(hf, ours)
    assert "eval_accuracy" in ours.log_history[-2]


class _CustomLossMixin:
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        loss = torch.nn.functional.cross_entropy(logits, labels) * 2.0
        return (loss, outputs) if return_outputs else loss


def test_custom_compute_loss_subclass(tmp_path):
    import transformers

    import hf_lightning

    hf_cls = type("HFCustom", (_CustomLossMixin, transformers.Trainer), {})
    ours_cls = type("OursCustom", (_CustomLossMixin, hf_lightning.Trainer), {})
    hf, ours = run_pair(
        lambda: tiny_bert_classifier(), tmp_path, train_dataset=classification_data(n=30),
        args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, num_train_epochs=1,
                  logging_steps=1, learning_rate=1e-3, save_strategy="no"),
        hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls,
    )
    assert_parity(hf, ours)


def test_custom_optimizer_cls_and_kwargs(tmp_path):
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=lm_data(n_train=24)[0],
        args=dict(per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1, save_strategy="no"),
        trainer_kwargs=dict(optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9})),
    )
    assert_parity(hf, ours)


def test_custom_optimizers_tuple(tmp_path):
    results = []
    for kind in ("hf", "ours"):
        model = RegressionModel()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        results.append(run(kind, lambda: model, tmp_path, train_dataset=regression_data(n=24),
                           args=dict(per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1,
                                     save_strategy="no"),
                           trainer_kwargs=dict(optimizers=(opt, sched))))
    assert_parity(*results)


@pytest.mark.parametrize("optim", ["adamw_torch", "sgd", "adagrad", "rmsprop", "adafactor"])
def test_optimizer_names(tmp_path, optim):
    hf, ours = run_pair(
        RegressionModel, tmp_path, train_dataset=regression_data(n=24),
        args=dict(per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1, optim=optim,
                  learning_rate=1e-2, weight_decay=0.01, save_strategy="no"),
    )
    assert_parity(hf, ours)


def test_model_init_and_logging_first_step(tmp_path):
    train, _ = lm_data(n_train=24)
    results = []
    for kind in ("hf", "ours"):
        import transformers

        import hf_lightning

        lib = transformers if kind == "hf" else hf_lightning
        args = lib.TrainingArguments(output_dir=str(tmp_path / kind), per_device_train_batch_size=4,
                                     num_train_epochs=2, logging_steps=4, logging_first_step=True,
                                     learning_rate=3e-3, save_strategy="no", report_to="none", use_cpu=True,
                                     disable_tqdm=True)
        trainer = lib.Trainer(model_init=lambda: tiny_gpt2(seed=0), args=args, train_dataset=train)
        trainer.train()
        results.append((trainer.state.log_history, trainer.model.state_dict()))
    assert results[1][0][0]["step"] == 1
    assert_log_history_equal(results[0][0], results[1][0])
    for k in results[0][1]:
        torch.testing.assert_close(results[1][1][k], results[0][1][k], rtol=1e-5, atol=1e-6)


def test_lightning_native_path_matches_facade(tmp_path):
    train, evald = lm_data(n_train=40, n_eval=8)
    args = dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, num_train_epochs=2, logging_steps=2,
                eval_strategy="steps", eval_steps=3, learning_rate=3e-3, save_strategy="no")
    facade = run("ours", lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald, args=args)
    native = run("ours", lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald, args=args,
                 native=True)
    assert_log_history_equal(facade.log_history, native.log_history, rtol=0)
    assert native.events == facade.events
    for k in facade.state_dict:
        assert torch.equal(facade.state_dict[k], native.state_dict[k])


@pytest.mark.parametrize("extra", [
    {"neftune_noise_alpha": 5.0},
    {"activation_checkpointing": True},
    {"gradient_checkpointing": True},
    {"torch_compile": True, "torch_compile_backend": "eager"},
])
def test_model_features(tmp_path, extra):
    """NEFTune noise (global-RNG draws line up with HF's), activation checkpointing, torch.compile."""
    import warnings

    train, _ = lm_data(n_train=16)
    args = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1,
                learning_rate=3e-3, save_strategy="no", **extra)
    if "gradient_checkpointing" in extra:
        # HF 5.x dropped the 4.x name; ours maps it (with a warning) to activation_checkpointing.
        hf_args = dict(args, activation_checkpointing=args.pop("gradient_checkpointing"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = run("ours", lambda: tiny_gpt2(), tmp_path, train_dataset=train,
                       args=dict(args, gradient_checkpointing=True))
        hf = run("hf", lambda: tiny_gpt2(), tmp_path, train_dataset=train, args=hf_args)
    else:
        hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=train, args=args)
    assert_parity(hf, ours)
