"""Run the same training through ``transformers.Trainer`` and ``hf_lightning.Trainer`` and compare."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tests.helpers.recorder import EventRecorder

NON_DETERMINISTIC = ("_runtime", "_per_second", "model_preparation_time")


@dataclass
class RunResult:
    trainer: Any
    log_history: list[dict]
    events: list[str]
    state_dict: dict[str, torch.Tensor]
    train_output: Any
    output_dir: str
    lrs: list[float] = field(default_factory=list)

    def checkpoints(self) -> list[str]:
        if not os.path.isdir(self.output_dir):
            return []
        names = [d for d in os.listdir(self.output_dir) if d.startswith("checkpoint-")]
        return sorted(names, key=lambda d: int(d.split("-")[1]))


def run(kind: str, make_model: Callable, tmp_path, *, train_dataset, eval_dataset=None, args: dict | None = None,
        trainer_cls: Any = None, trainer_kwargs: dict | None = None, native: bool | str = False,
        resume: Any = None) -> RunResult:
    """Train with ``kind`` in {"hf", "ours"}; ``native`` runs ours through the Lightning-native path
    (``build_lightning_trainer``; ``native="user"``: a plain ``lightning.Trainer``); ``resume`` is passed to
    ``train(resume_from_checkpoint=...)``."""
    torch.set_num_threads(1)
    suffix = f"_{native}" if isinstance(native, str) else "_native" if native else ""
    output_dir = str(tmp_path / f"{kind}{suffix}")
    base = dict(output_dir=output_dir, report_to="none", use_cpu=True, disable_tqdm=True, seed=42)
    base.update(args or {})
    if kind == "hf":
        import transformers

        targs = transformers.TrainingArguments(**base)
        cls = trainer_cls or transformers.Trainer
    else:
        import hf_lightning

        targs = hf_lightning.TrainingArguments(**base)
        cls = trainer_cls or hf_lightning.Trainer
    model = make_model()
    recorder = EventRecorder()
    kwargs = dict(trainer_kwargs or {})
    if native:
        from hf_lightning import HFDataModule, HFLightningModule, build_lightning_trainer

        if native == "user":
            import lightning.pytorch as pl

            pl_trainer = pl.Trainer(accelerator="cpu", devices=1, enable_checkpointing=False, logger=False,
                                    enable_progress_bar=False, enable_model_summary=False)
        else:
            pl_trainer = build_lightning_trainer(targs, callbacks=[recorder], enable_progress_bar=False)
        module = HFLightningModule(model, targs, compute_metrics=kwargs.get("compute_metrics"),
                                   compute_loss_func=kwargs.get("compute_loss_func"),
                                   callbacks=[recorder] if native == "user" else None)
        dm = HFDataModule(targs, train_dataset=train_dataset, eval_dataset=eval_dataset,
                          data_collator=kwargs.get("data_collator"))
        pl_trainer.fit(module, datamodule=dm)
        flow = next(cb for cb in pl_trainer.callbacks if type(cb).__name__ == "HFFlowCallback")
        return RunResult(pl_trainer, flow.state.log_history, recorder.events,
                         {k: v.detach().clone() for k, v in model.state_dict().items()}, flow.train_output,
                         output_dir)
    trainer = cls(model=model, args=targs, train_dataset=train_dataset, eval_dataset=eval_dataset,
                  callbacks=[recorder], **kwargs)
    out = trainer.train(resume_from_checkpoint=resume)
    return RunResult(trainer, trainer.state.log_history, recorder.events,
                     {k: v.detach().clone() for k, v in model.state_dict().items()}, out, output_dir)


def run_pair(make_model: Callable, tmp_path, **kwargs) -> tuple[RunResult, RunResult]:
    hf_cls = kwargs.pop("hf_trainer_cls", None)
    ours_cls = kwargs.pop("ours_trainer_cls", None)
    hf = run("hf", make_model, tmp_path, trainer_cls=hf_cls, **kwargs)
    ours = run("ours", make_model, tmp_path, trainer_cls=ours_cls, **kwargs)
    return hf, ours


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)
    return a == b


def assert_log_history_equal(hf: list[dict], ours: list[dict], rtol: float = 1e-5, ordered: bool = True,
                             skip_keys: tuple[str, ...] = ()) -> None:
    """Same entries at the same steps with the same keys (in order unless ``ordered=False``: entries restored
    from ``trainer_state.json`` have sorted keys); numbers within ``rtol``."""
    assert [e["step"] for e in hf] == [e["step"] for e in ours], (hf, ours)
    for a, b in zip(hf, ours):
        if ordered:
            assert list(a.keys()) == list(b.keys()), (a, b)
        else:
            assert sorted(a.keys()) == sorted(b.keys()), (a, b)
        for key in a:
            if any(key.endswith(s) for s in NON_DETERMINISTIC) or key in skip_keys:
                continue
            assert _close(a[key], b[key], rtol), f"step {a['step']} {key}: HF {a[key]!r} vs ours {b[key]!r}"


def assert_weights_close(hf: dict, ours: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert hf.keys() == ours.keys()
    for key in hf:
        torch.testing.assert_close(ours[key], hf[key], rtol=rtol, atol=atol, msg=f"weight {key}")


def assert_parity(hf: RunResult, ours: RunResult, *, events: bool = True, rtol: float = 1e-5) -> None:
    assert ours.train_output.global_step == hf.train_output.global_step
    assert_log_history_equal(hf.log_history, ours.log_history, rtol)
    assert_weights_close(hf.state_dict, ours.state_dict)
    assert math.isclose(ours.train_output.training_loss, hf.train_output.training_loss, rel_tol=rtol)
    if events:
        assert ours.events == hf.events
