"""One test per Lightning private that hf_lightning/_compat.py touches, against the installed Lightning."""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from hf_lightning import _compat


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.automatic_optimization = False
        self.seen = []
        self.val_batches = 0

    def training_step(self, batch, idx):
        opt = self.optimizers()
        loss = self.lin(batch[0]).pow(2).mean()
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()

    def validation_step(self, batch, idx):
        self.val_batches += 1
        self.seen.append(_compat.is_last_eval_batch(self.trainer))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n=8):
    return DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=2)


def _trainer(**kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kw)


def test_set_fit_limits_stops_at_the_new_max_steps():
    class Limit(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            _compat.set_fit_limits(trainer, max_steps=3, max_epochs=5)

    trainer = _trainer(max_epochs=1, callbacks=[Limit()])
    trainer.fit(_Tiny(), train_dataloaders=_loader(40))
    assert trainer.global_step == 3


def test_run_validation_in_fit_runs_the_val_loop_inside_a_batch_hook():
    class Validate(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step == 2:
                _compat.run_validation_in_fit(trainer)
                assert trainer.training

    module = _Tiny()
    trainer = _trainer(max_steps=4, num_sanity_val_steps=0, check_val_every_n_epoch=10**9,
                       callbacks=[Validate()])
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader(6))
    assert module.val_batches == 3
    assert module.seen == [False, False, True]
    assert trainer.global_step == 4


def test_fast_forward_sets_global_step_and_epoch():
    class Forward(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            _compat.fast_forward(trainer, global_step=8, epoch=2)

        def on_train_epoch_start(self, trainer, pl_module):
            self.epoch = trainer.current_epoch
            self.step = trainer.global_step

    cb = Forward()
    trainer = _trainer(max_steps=10, callbacks=[cb])
    trainer.fit(_Tiny(), train_dataloaders=_loader())
    assert (cb.epoch, cb.step) == (2, 8)
    assert trainer.global_step == 10


def test_publish_metrics_reaches_the_public_metric_properties_and_later_callbacks():
    """Published during training: visible at once through the trainer's properties (a later callback in the same
    hook sees them) and still there after the fit; Lightning's own ``self.log`` values merge over them."""
    seen = {}

    class Publish(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            _compat.publish_metrics(trainer, callback={"eval_x": torch.tensor(0.5, dtype=torch.float64)},
                                    logged={"eval/x": torch.tensor(0.5)}, progress_bar={"lr": "1e-05"})

    class Read(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen["callback"] = dict(trainer.callback_metrics)

    trainer = _trainer(max_steps=1, callbacks=[Publish(), Read()])
    trainer.fit(_Tiny(), train_dataloaders=_loader())
    assert seen["callback"]["eval_x"].item() == 0.5
    assert trainer.callback_metrics["eval_x"].dtype == torch.float64
    assert trainer.logged_metrics["eval/x"].item() == 0.5
    assert trainer.progress_bar_metrics["lr"] == "1e-05"


def test_grad_scale_is_none_without_fp16():
    trainer = _trainer(max_steps=1)
    trainer.fit(_Tiny(), train_dataloaders=_loader())
    assert _compat.grad_scale(trainer) is None


def test_attached_trainer_is_none_until_a_trainer_runs_the_module():
    module = _Tiny()
    assert _compat.attached_trainer(module) is None
    trainer = _trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=_loader())
    assert _compat.attached_trainer(module) is trainer


def test_lightning_sets_the_current_hook_name_attribute_around_hooks():
    class Recording(_Tiny):
        def __setattr__(self, name, value):
            if name == _compat.CURRENT_HOOK_NAME_ATTRIBUTE:
                object.__setattr__(self, "hooks_seen", [*getattr(self, "hooks_seen", []), value])
            super().__setattr__(name, value)

    module = Recording()
    _trainer(max_steps=1).fit(module, train_dataloaders=_loader())
    assert "training_step" in module.hooks_seen
    assert all(value is None or isinstance(value, str) for value in module.hooks_seen)


def test_registered_parameter_names_include_the_none_entries():
    layer = torch.nn.Linear(2, 1)
    layer.register_parameter("extra", None)
    assert _compat.registered_parameter_names(layer) == ["weight", "bias", "extra"]
    assert [name for name, _ in layer.named_parameters(recurse=False)] == ["weight", "bias"]


def test_route_checkpoint_loading_answers_ckpt_path_before_the_strategy(tmp_path):
    """Lightning reads fit(ckpt_path=...) through strategy.load_checkpoint after the setup hooks."""
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    read = []

    class Route(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            def answer(path):
                if path != str(folder):
                    return None
                read.append(path)
                return {"state_dict": pl_module.state_dict(), "optimizer_states": [], "lr_schedulers": [],
                        "pytorch-lightning_version": pl.__version__}

            _compat.route_checkpoint_loading(trainer, answer)

    trainer = _trainer(max_steps=1, callbacks=[Route()])
    trainer.fit(_Tiny(), train_dataloaders=_loader(), ckpt_path=str(folder))
    assert read == [str(folder)]
    assert trainer.global_step == 1


def test_route_checkpoint_loading_leaves_other_paths_to_the_strategy_and_replaces_itself(tmp_path):
    trainer = _trainer(max_steps=1)
    path = str(tmp_path / "plain.ckpt")
    torch.save({"plain": 1}, path)
    _compat.route_checkpoint_loading(trainer, lambda p: {"first": p} if p == "hf" else None)
    _compat.route_checkpoint_loading(trainer, lambda p: {"second": p} if p == "hf" else None)
    assert trainer.strategy.load_checkpoint("hf") == {"second": "hf"}
    assert trainer.strategy.load_checkpoint(path) == {"plain": 1}


def test_disable_distributed_sampler_stops_lightning_from_swapping_the_sampler():
    # A DDP trainer over two CPU processes (nothing launches until fit): Lightning would swap the loader's sampler.
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    loader = _loader()
    assert trainer._data_connector._requires_distributed_sampler(loader)
    _compat.disable_distributed_sampler(trainer)
    assert not trainer._data_connector._requires_distributed_sampler(loader)


def test_checkpoint_wrapper_recomputes_the_layer_and_exposes_it():
    layer = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    wrapped = _compat.checkpoint_wrapper(layer)
    assert wrapped is not layer and _compat.checkpoint_wrapped_inner(wrapped) is layer
    assert _compat.checkpoint_wrapped_inner(layer) is layer
    calls = []
    layer[0].register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, 3, requires_grad=True)
    wrapped(x).sum().backward()
    assert len(calls) == 2  # the forward, then its recomputation in the backward
    assert x.grad is not None


def test_take_lightning_sigterm_reads_and_clears_lightnings_flag():
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert _compat.take_lightning_sigterm(trainer) is False
    trainer._signal_connector.received_sigterm = True
    assert trainer.received_sigterm
    assert _compat.take_lightning_sigterm(trainer) is True
    assert not trainer.received_sigterm


def test_slurm_requeue_signal_is_lightnings_slurm_environments_own(monkeypatch):
    import signal

    from lightning.fabric.plugins.environments import SLURMEnvironment

    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    plain = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert _compat.slurm_requeue_signal(plain) is None
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(key, value)
    slurm = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert _compat.slurm_requeue_signal(slurm) == signal.SIGUSR1
    own = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     plugins=[SLURMEnvironment(requeue_signal=signal.SIGUSR2)])
    assert _compat.slurm_requeue_signal(own) == signal.SIGUSR2
    off = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     plugins=[SLURMEnvironment(auto_requeue=False)])
    assert _compat.slurm_requeue_signal(off) is None
