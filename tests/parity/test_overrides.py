"""Subclass override points: the same subclass body on ``transformers.Trainer`` and ``hf_lightning.Trainer``.

Each override is written once as a mixin and mixed into both trainers, so the only difference between the two
runs is the loop underneath. Every mixin also counts its calls, which proves our facade reached the override
(parity alone could hide a silently ignored override when it happens to match the default).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from tests.helpers.models import RegressionModel, lm_data, regression_data, tiny_gpt2
from tests.helpers.parity import assert_parity, run_pair

BASE_ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2,
                 logging_steps=1, learning_rate=1e-2, save_strategy="no")


class _Counted:
    """Counts calls per override name on the trainer instance (set up lazily: HF's __init__ may call hooks)."""

    def _count(self, name: str) -> None:
        calls = self.__dict__.setdefault("override_calls", {})
        calls[name] = calls.get(name, 0) + 1


class _L2PenaltyLoss(_Counted):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._count("compute_loss")
        loss, preds = model(**inputs)
        penalty = sum((p ** 2).sum() for p in model.parameters())
        loss = loss + 1e-2 * penalty
        return (loss, (preds,)) if return_outputs else loss


class _ScaledTrainingStep(_Counted):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self._count("training_step")
        # Only the reported loss is scaled: gradients (hence weights) stay those of the default step.
        return super().training_step(model, inputs, num_items_in_batch) * 3.0


class _OwnBackwardTrainingStep(_Counted):
    # A training_step written from scratch (no super()): its own loss and backward. The trainer must hand it
    # zeroed gradients at every step, whatever it does with the previous step's.
    def training_step(self, model, inputs, num_items_in_batch=None):
        self._count("training_step")
        model.train()
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        loss = loss / self.args.gradient_accumulation_steps
        loss.backward()
        return loss.detach()


class _SGDOptimizer(_Counted):
    def create_optimizer(self, model=None):
        self._count("create_optimizer")
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        return self.optimizer


class _StepLRScheduler(_Counted):
    def create_scheduler(self, num_training_steps, optimizer=None):
        self._count("create_scheduler")
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return self.lr_scheduler


class _StepLRSchedulerNoOptimizerParam(_Counted):
    # HF calls create_scheduler(num_training_steps=...) only, so an override without `optimizer` is valid there.
    def create_scheduler(self, num_training_steps):
        self._count("create_scheduler")
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        return self.lr_scheduler


class _SequentialLoader(_Counted):
    def get_train_dataloader(self):
        self._count("get_train_dataloader")
        dataset = self.train_dataset
        return DataLoader(dataset, batch_size=self.args.train_batch_size, sampler=SequentialSampler(dataset),
                          collate_fn=self.data_collator)


class _LogExtraKey(_Counted):
    def log(self, logs, start_time=None):
        self._count("log")
        if "loss" in logs:
            logs["loss_x10"] = logs["loss"] * 10
        logs["custom_marker"] = 1.0
        super().log(logs, start_time)


def _classes(mixin: type) -> dict:
    import transformers

    import hf_lightning

    return dict(hf_trainer_cls=type(f"HF{mixin.__name__}", (mixin, transformers.Trainer), {}),
                ours_trainer_cls=type(f"Ours{mixin.__name__}", (mixin, hf_lightning.Trainer), {}))


def _regression_pair(tmp_path, mixin: type, **args):
    return run_pair(RegressionModel, tmp_path, train_dataset=regression_data(n=20),
                    args={**BASE_ARGS, **args}, **_classes(mixin))


# (mixin, override name, extra args): the run must match HF's and our override must have been called.
OVERRIDES = [
    (_L2PenaltyLoss, "compute_loss", {}),
    (_ScaledTrainingStep, "training_step", {}),
    (_OwnBackwardTrainingStep, "training_step", {}),
    (_SGDOptimizer, "create_optimizer", {"lr_scheduler_type": "cosine"}),
    (_StepLRScheduler, "create_scheduler", {}),
    (_SequentialLoader, "get_train_dataloader", {}),
    (_LogExtraKey, "log", {}),
]


@pytest.mark.parametrize("mixin,name,args", OVERRIDES, ids=[f"{o[1]}-{o[0].__name__}" for o in OVERRIDES])
def test_override_matches_hf(tmp_path, mixin, name, args):
    hf, ours = _regression_pair(tmp_path, mixin, **args)
    assert_parity(hf, ours)
    assert ours.trainer.override_calls.get(name, 0) > 0, f"our Trainer never called the overridden {name}"
    assert ours.trainer.override_calls == hf.trainer.override_calls


def test_training_step_scaling_reaches_logs_not_weights(tmp_path):
    """The scaled return value is what HF averages into ``loss``; the backward inside is the default one."""
    hf, ours = _regression_pair(tmp_path, _ScaledTrainingStep)
    _, plain = run_pair(RegressionModel, tmp_path / "plain", train_dataset=regression_data(n=20), args=BASE_ARGS)
    scaled_losses = [e["loss"] for e in ours.log_history if "loss" in e]
    plain_losses = [e["loss"] for e in plain.log_history if "loss" in e]
    assert scaled_losses == pytest.approx([3 * x for x in plain_losses], rel=1e-6)
    for key in plain.state_dict:
        torch.testing.assert_close(ours.state_dict[key], plain.state_dict[key])
    assert ours.train_output.training_loss == pytest.approx(hf.train_output.training_loss, rel=1e-5)


def test_create_optimizer_and_scheduler_overrides_together(tmp_path):
    """SGD from ``create_optimizer`` stepped by StepLR from ``create_scheduler``: HF's LR sequence."""
    mixin = type("SGDStepLR", (_SGDOptimizer, _StepLRScheduler), {})
    hf, ours = _regression_pair(tmp_path, mixin)
    assert_parity(hf, ours)
    assert isinstance(ours.trainer.lr_scheduler, torch.optim.lr_scheduler.StepLR)
    lrs = [e["learning_rate"] for e in ours.log_history if "learning_rate" in e]
    assert lrs[:4] == pytest.approx([0.05, 0.05, 0.025, 0.025])
    assert ours.trainer.override_calls == {"create_optimizer": 1, "create_scheduler": 1}


def test_create_scheduler_override_without_optimizer_param(tmp_path):
    hf, ours = _regression_pair(tmp_path, _StepLRSchedulerNoOptimizerParam)
    assert_parity(hf, ours)


def test_sequential_train_loader_changes_the_order(tmp_path):
    """The override is really used: HF's default random order gives other numbers than the sequential one."""
    hf, ours = _regression_pair(tmp_path, _SequentialLoader)
    _, default = run_pair(RegressionModel, tmp_path / "default", train_dataset=regression_data(n=20),
                          args=BASE_ARGS)
    assert [e["loss"] for e in ours.log_history[:3]] != [e["loss"] for e in default.log_history[:3]]
    assert ours.trainer.override_calls == hf.trainer.override_calls == {"get_train_dataloader": 1}


def test_data_collator_attribute_defaults_like_hf(tmp_path):
    """A subclass body that reads ``self.data_collator`` gets HF's default collator, not ``None``."""
    import transformers

    import hf_lightning

    collators = []
    for lib in (transformers, hf_lightning):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True)
        collators.append(lib.Trainer(model=RegressionModel(), args=args).data_collator)
    assert collators[0] is transformers.default_data_collator
    assert callable(collators[1])


def test_log_override_sees_every_entry(tmp_path):
    """Training logs, the final summary and mid-training evaluations all pass through the overridden ``log``."""
    hf, ours = run_pair(RegressionModel, tmp_path, train_dataset=regression_data(n=20),
                        eval_dataset=regression_data(n=8, seed=9),
                        args={**BASE_ARGS, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 3},
                        **_classes(_LogExtraKey))
    assert_parity(hf, ours)
    assert all(e["custom_marker"] == 1.0 for e in ours.log_history)
    assert any("eval_loss" in e for e in ours.log_history)
    assert ours.trainer.override_calls == hf.trainer.override_calls


def test_compute_loss_override_on_causal_lm(tmp_path):
    """A loss override on a real HF model with ``num_items_in_batch`` passed through (GPT-2, GA=2)."""

    class TokenMeanLoss(_Counted):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self._count("compute_loss")
            self.__dict__.setdefault("seen_num_items", []).append(
                None if num_items_in_batch is None else int(num_items_in_batch))
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.logits[:, :-1].reshape(-1, outputs.logits.size(-1))
            loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), reduction="sum")
            loss = loss / num_items_in_batch
            return (loss, outputs) if return_outputs else loss

    hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=lm_data(n_train=24)[0],
                        args={**BASE_ARGS, "learning_rate": 3e-3, "num_train_epochs": 1},
                        **_classes(TokenMeanLoss))
    assert_parity(hf, ours)
    assert ours.trainer.seen_num_items == hf.trainer.seen_num_items


# ---------------------------------------------------------------------------------------------- protected members
class _HalvedInputs(_Counted):
    # HF's default training_step and prediction_step both pass every batch through _prepare_inputs.
    def _prepare_inputs(self, inputs):
        self._count("_prepare_inputs")
        inputs = super()._prepare_inputs(inputs)
        return {**inputs, "x": inputs["x"] * 0.5}


def _detach(tensors):
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(_detach(t) for t in tensors)
    return tensors.detach() if isinstance(tensors, torch.Tensor) else tensors


class _HFShapedSteps(_Counted):
    """``training_step`` / ``prediction_step`` written the way HF 5.23's own bodies are (what subclasses copy):
    ``_prepare_inputs``, ``compute_loss_context_manager``, ``model_accepts_loss_kwargs``,
    ``current_gradient_accumulation_steps``, ``_get_num_items_in_batch`` and ``accelerator.backward``."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._count("training_step")
        cp_context, inputs = self._prepare_context_parallel_inputs(model, inputs)
        with cp_context():
            model.train()
            inputs = self._prepare_inputs(inputs)
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            if self.args.n_gpu > 1:
                loss = loss.mean()
            scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) \
                or self.compute_loss_func is not None
            if not scaled:
                loss = loss / self.current_gradient_accumulation_steps
            if self.accelerator.distributed_type == "DEEPSPEED":
                raise AssertionError("not a DeepSpeed run")
            self.accelerator.backward(loss)
            return loss.detach()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self._count("prediction_step")
        has_labels = len(self.label_names) > 0 and all(inputs.get(k) is not None for k in self.label_names)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            ignore_keys = getattr(self.model.config, "keys_to_ignore_at_inference", ["past_key_values"])
        labels = _detach(tuple(inputs.get(name) for name in self.label_names)) if has_labels else None
        if labels is not None and len(labels) == 1:
            labels = labels[0]
        with torch.no_grad():
            num_items_in_batch = self._get_num_items_in_batch([inputs], self.args.device)
            with self.compute_loss_context_manager():
                loss, outputs = self.compute_loss(model, inputs, return_outputs=True,
                                                  num_items_in_batch=num_items_in_batch)
            loss = loss.detach().mean()
            logits = tuple(v for k, v in outputs.items() if k not in ignore_keys + ["loss"])
        if prediction_loss_only:
            return loss, None, None
        logits = _detach(logits)
        return loss, logits[0] if len(logits) == 1 else logits, labels


def test_prepare_inputs_override_reaches_training_and_evaluation(tmp_path):
    hf, ours = run_pair(RegressionModel, tmp_path, train_dataset=regression_data(n=20),
                        eval_dataset=regression_data(n=8, seed=9),
                        args={**BASE_ARGS, "eval_strategy": "epoch"}, **_classes(_HalvedInputs))
    assert_parity(hf, ours)
    assert ours.trainer.override_calls == hf.trainer.override_calls
    # 2 epochs x 20 samples / 4 per micro-batch for training, 2 evaluations x 8 / 8 per eval batch.
    assert ours.trainer.override_calls == {"_prepare_inputs": 12}


def test_subclass_with_hf_shaped_step_bodies_matches_hf(tmp_path):
    """GPT-2 (loss kwargs, so ``num_items_in_batch`` scaling) with dropout, GA=2, evaluation every epoch."""
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    def gpt2_with_dropout():
        set_seed(42)
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))

    train, evald = lm_data(n_train=24, n_eval=8)
    hf, ours = run_pair(gpt2_with_dropout, tmp_path, train_dataset=train, eval_dataset=evald,
                        args={**BASE_ARGS, "learning_rate": 3e-3, "eval_strategy": "epoch",
                              "per_device_eval_batch_size": 4, "prediction_loss_only": False},
                        **_classes(_HFShapedSteps))
    assert_parity(hf, ours)
    assert ours.trainer.override_calls == hf.trainer.override_calls
    assert set(ours.trainer.override_calls) == {"training_step", "prediction_step"}


class _Reversed(torch.utils.data.Sampler):
    def __init__(self, dataset):
        self.n = len(dataset)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


class _ReversedSamplers(_Counted):
    def _get_train_sampler(self, train_dataset=None):
        self._count("_get_train_sampler")
        return _Reversed(train_dataset if train_dataset is not None else self.train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        self._count("_get_eval_sampler")
        return _Reversed(eval_dataset)


class _PlainRandomSampler(_Counted):
    # accelerate swaps a RandomSampler for its seeded one in HF, so this trains in HF's default order.
    def _get_train_sampler(self, train_dataset=None):
        self._count("_get_train_sampler")
        return torch.utils.data.RandomSampler(train_dataset if train_dataset is not None else self.train_dataset)


def _first_prediction(eval_pred):
    # Depends on the evaluation order, so a sampler override that is ignored shows.
    return {"first": float(eval_pred.predictions.reshape(-1)[0])}


@pytest.mark.parametrize("mixin", [_ReversedSamplers, _PlainRandomSampler])
def test_sampler_overrides_build_the_loaders(tmp_path, mixin):
    hf, ours = run_pair(RegressionModel, tmp_path, train_dataset=regression_data(n=20),
                        eval_dataset=regression_data(n=8, seed=9),
                        args={**BASE_ARGS, "eval_strategy": "epoch", "per_device_eval_batch_size": 3},
                        trainer_kwargs=dict(compute_metrics=_first_prediction), **_classes(mixin))
    assert_parity(hf, ours)
    calls = ours.trainer.override_calls
    assert calls["_get_train_sampler"] == hf.trainer.override_calls["_get_train_sampler"] == 1
    # HF builds the eval loader at every evaluation; Lightning builds it once per fit.
    assert (calls.get("_get_eval_sampler", 0) > 0) == ("_get_eval_sampler" in hf.trainer.override_calls)


class _SaveLinearOnly(_Counted):
    # A common _save override: filter the weights, add a file of one's own, let HF's _save write the rest.
    def _save(self, output_dir=None, state_dict=None):
        self._count("_save")
        state_dict = {k: v for k, v in self.model.state_dict().items() if k.startswith("lin.")}
        super()._save(output_dir, state_dict=state_dict)
        with open(f"{output_dir}/extra.txt", "w") as f:
            f.write("mine")


def test_save_override_is_what_save_model_writes(tmp_path):
    import os

    from safetensors.torch import load_file

    import transformers

    import hf_lightning

    written = {}
    for lib in (transformers, hf_lightning):
        cls = _classes(_SaveLinearOnly)["hf_trainer_cls" if lib is transformers else "ours_trainer_cls"]
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True)
        trainer = cls(model=RegressionModel(), args=args)
        out = tmp_path / lib.__name__ / "saved"
        trainer.save_model(str(out))
        weights = load_file(str(out / "model.safetensors"))
        # training_args.json is hf_lightning's readable copy of training_args.bin (an addition of ours).
        files = sorted(name for name in os.listdir(out) if name != "training_args.json")
        written[lib.__name__] = (files, {k: v.tolist() for k, v in weights.items()},
                                 trainer.override_calls)
    assert written["hf_lightning"] == written["transformers"]
    assert sorted(written["hf_lightning"][1]) == ["lin.bias", "lin.weight"]
