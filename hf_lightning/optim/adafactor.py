"""Adafactor (Shazeer & Stern, 2018) with the update rule, defaults and state layout of
``transformers.optimization.Adafactor`` (5.23), so runs and ``optimizer.pt`` files match HF's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["Adafactor", "AdafactorSchedule", "get_adafactor_schedule"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.norm(2) / (tensor.numel() ** 0.5)


def _factored_inverse_sqrt(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """Rank-1 estimate of ``1/sqrt(E[g^2])`` from the row and column second-moment averages."""
    row_term = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    col_term = col.unsqueeze(-2).rsqrt()
    return torch.mul(row_term, col_term)


class Adafactor(Optimizer):
    """Adafactor: Adam-like updates with factored second moments for matrices.

    Matches ``transformers.optimization.Adafactor`` step for step (same state keys: ``step``, ``RMS``,
    ``exp_avg``, ``exp_avg_sq`` or ``exp_avg_sq_row``/``exp_avg_sq_col``). HF's Trainer builds it for
    ``optim="adafactor"`` with ``scale_parameter=False, relative_step=False, lr=args.learning_rate``; to drive
    the learning rate from an external scheduler use those two settings too.

    Args:
        params: Parameters or parameter-group dicts.
        lr: External learning rate; must be None when ``relative_step`` is True.
        eps: ``(eps1, eps2)``: added to the squared gradient, and the floor of the parameter scale.
        clip_threshold: Updates whose RMS exceeds this are scaled down to it.
        decay_rate: Exponent ``c`` of the second-moment decay ``beta2_t = 1 - t**c``.
        beta1: Momentum coefficient; None keeps no first moment (the memory-saving default).
        weight_decay: Decoupled decay, scaled by the step size.
        scale_parameter: Multiply the step size by ``max(eps2, RMS(param))``.
        relative_step: Use the time-dependent step size ``min(1e-2, 1/sqrt(t))`` instead of ``lr``.
        warmup_init: With ``relative_step``, start the step size at ``1e-6 * t`` instead of ``1e-2``.

    Raises:
        ValueError: ``lr`` given together with ``relative_step=True``, or ``warmup_init`` without
            ``relative_step``.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(3, 2)
        >>> opt = Adafactor(layer.parameters(), lr=1e-3, scale_parameter=False, relative_step=False)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError(
                f"Adafactor got lr={lr} together with relative_step=True; pass relative_step=False to use a "
                "manual lr, or lr=None to let Adafactor compute its own step size."
            )
        if warmup_init and not relative_step:
            raise ValueError(
                "Adafactor got warmup_init=True with relative_step=False; warmup_init needs relative_step=True."
            )
        defaults = {
            "lr": lr,
            "eps": eps,
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def step_size(group: dict[str, Any], state: dict[str, Any]) -> float | torch.Tensor:
        """The step size Adafactor used for a parameter at its latest step.

        Args:
            group: The parameter's group (options above).
            state: The parameter's optimizer state (needs ``step`` and ``RMS``).

        Returns:
            ``lr`` (or the relative step size), times ``max(eps2, RMS(param))`` when ``scale_parameter``.
        """
        base = group["lr"]
        if group["relative_step"]:
            floor = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            base = min(floor, 1.0 / math.sqrt(state["step"]))
        scale = max(group["eps"][1], state["RMS"]) if group["scale_parameter"] else 1.0
        return scale * base

    # HF's AdafactorSchedule asks its optimizer for `_get_lr`; the alias lets it drive this class too.
    _get_lr = step_size

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient.

        Args:
            closure: Optional callable that re-evaluates the model and returns the loss.

        Returns:
            The closure's loss, or None.

        Raises:
            RuntimeError: A parameter has a sparse gradient.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        if grad.dtype in _LOW_PRECISION:
            grad = grad.float()
        if grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients; use a dense gradient.")

        factored = grad.dim() >= 2
        has_momentum = group["beta1"] is not None
        state = self.state[param]
        self._init_or_align_state(state, grad, factored, has_momentum)

        # Low-precision weights are updated in fp32 and copied back once, so rounding happens a single time.
        work = param.float() if param.dtype in _LOW_PRECISION else param

        state["step"] += 1
        state["RMS"] = _rms(work)
        lr = self.step_size(group, state)

        beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
        sq = grad**2 + group["eps"][0]
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2t).add_(sq.mean(dim=-1), alpha=1.0 - beta2t)
            col.mul_(beta2t).add_(sq.mean(dim=-2), alpha=1.0 - beta2t)
            update = _factored_inverse_sqrt(row, col).mul_(grad)
        else:
            second = state["exp_avg_sq"]
            second.mul_(beta2t).add_(sq, alpha=1.0 - beta2t)
            update = second.rsqrt().mul_(grad)

        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(lr)

        if has_momentum:
            momentum = state["exp_avg"]
            momentum.mul_(group["beta1"]).add_(update, alpha=1 - group["beta1"])
            update = momentum

        if group["weight_decay"] != 0:
            work.add_(work, alpha=-group["weight_decay"] * lr)
        work.add_(-update)

        if param.dtype in _LOW_PRECISION:
            param.copy_(work)

    @staticmethod
    def _init_or_align_state(state: dict[str, Any], grad: torch.Tensor, factored: bool, has_momentum: bool) -> None:
        if not state:
            state["step"] = 0
            if has_momentum:
                state["exp_avg"] = torch.zeros_like(grad)
            if factored:
                state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
                state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
            else:
                state["exp_avg_sq"] = torch.zeros_like(grad)
            state["RMS"] = 0
            return
        # A loaded state dict may sit on another device or dtype than the gradient.
        keys = (["exp_avg"] if has_momentum else []) + (
            ["exp_avg_sq_row", "exp_avg_sq_col"] if factored else ["exp_avg_sq"]
        )
        for key in keys:
            state[key] = state[key].to(grad)


class AdafactorSchedule(LambdaLR):
    """A read-only scheduler that reports the step size :class:`Adafactor` computes for itself.

    Adafactor with ``relative_step=True`` picks its own learning rate; this proxy lets a loop that logs
    ``scheduler.get_last_lr()`` show it. Before the first optimizer step it reports ``initial_lr``.

    Args:
        optimizer: An :class:`Adafactor` (or any optimizer with HF's ``_get_lr(group, state)``).
        initial_lr: What to report before any parameter has a gradient.
    """

    def __init__(self, optimizer: Optimizer, initial_lr: float = 0.0) -> None:
        # LambdaLR reads `initial_lr` from each group to set `base_lrs`; the key is removed again so the
        # optimizer's param groups stay as the user made them.
        for group in optimizer.param_groups:
            group["initial_lr"] = initial_lr
        # A plain local function, as in HF, so `state_dict()["lr_lambdas"]` holds None like HF's file does.
        def constant(_step: int) -> float:
            return initial_lr

        super().__init__(optimizer, constant)
        for group in optimizer.param_groups:
            del group["initial_lr"]

    def get_lr(self) -> list[float]:
        """Step sizes of the groups whose first parameter has a gradient, else ``base_lrs``."""
        opt = self.optimizer
        lrs = [
            opt._get_lr(group, opt.state[group["params"][0]])
            for group in opt.param_groups
            if group["params"][0].grad is not None
        ]
        return lrs or self.base_lrs


def get_adafactor_schedule(optimizer: Optimizer, initial_lr: float = 0.0) -> AdafactorSchedule:
    """Return an :class:`AdafactorSchedule` for ``optimizer`` (HF's ``get_adafactor_schedule``).

    Args:
        optimizer: The Adafactor optimizer.
        initial_lr: Learning rate reported before the first step.

    Returns:
        The proxy scheduler.
    """
    return AdafactorSchedule(optimizer, initial_lr)
