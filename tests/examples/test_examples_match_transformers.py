"""The migrated scripts run unchanged on ``transformers``' own classes, with the same numbers.

Each example imports ``Trainer``, ``TrainingArguments``, ``HfArgumentParser``, the collators, ... from
hf_lightning. Swapping those names back to ``transformers``' gives the script before migration; both sides run the
same command line and must write the same ``log_history`` and report the same metrics.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.examples.conftest import load_example, quick_args
from tests.examples.test_task_examples import FEW_ROWS, FEW_STEPS, SMALL_BERT, SMALL_T5, _generation_supported
from tests.helpers.parity import assert_log_history_equal

SMALL_GPT2 = ["--config_overrides", "n_embd=32,n_layer=1,n_head=2", "--vocab_size", "400", "--block_size", "32",
              "--max_eval_samples", "8"]
TASKS = ["--do_train", "--do_eval", "--do_predict"]


def _as_transformers_script(module):
    """Point every name the script imported from hf_lightning at ``transformers``' object of that name."""
    import transformers

    swapped = []
    for name, value in list(vars(module).items()):
        if getattr(value, "__module__", "").startswith("hf_lightning") and hasattr(transformers, name):
            setattr(module, name, getattr(transformers, name))
            swapped.append(name)
    return swapped


def _translation_args() -> list[str]:
    generate = [] if _generation_supported() else ["--predict_with_generate", "--val_max_target_length", "12"]
    return [*SMALL_T5, *FEW_STEPS, *FEW_ROWS, *TASKS, *generate]


CASES = {
    "run_clm": lambda: [*SMALL_GPT2, *FEW_STEPS, "--do_train", "--do_eval", "--per_device_train_batch_size", "4"],
    "run_glue": lambda: [*SMALL_BERT, *FEW_STEPS, *FEW_ROWS, *TASKS],
    "run_ner": lambda: [*SMALL_BERT, *FEW_STEPS, *FEW_ROWS, *TASKS],
    "run_translation": _translation_args,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_its_transformers_original(tmp_path, name):
    argv = CASES[name]()
    results, states = {}, {}
    for side in ("hf", "ours"):
        module = load_example(name)
        if side == "hf":
            swapped = _as_transformers_script(module)
            assert {"Trainer", "TrainingArguments"} <= set(swapped) or {"Seq2SeqTrainer"} <= set(swapped)
        results[side] = module.main([*quick_args(tmp_path, output=side), *argv])
        states[side] = json.loads((tmp_path / side / "trainer_state.json").read_text())

    assert_log_history_equal(states["hf"]["log_history"], states["ours"]["log_history"])
    assert states["ours"]["global_step"] == states["hf"]["global_step"] == 4
    assert sorted(p.name for p in (tmp_path / "ours").glob("checkpoint-*")) == \
        sorted(p.name for p in (tmp_path / "hf").glob("checkpoint-*"))
    numeric = [key for key, value in results["hf"].items()
               if isinstance(value, float) and not any(part in key for part in ("runtime", "per_second", "flos"))]
    assert numeric
    for key in numeric:
        assert key in results["ours"], key
        assert math.isclose(results["ours"][key], results["hf"][key], rel_tol=1e-5, abs_tol=1e-7), key
