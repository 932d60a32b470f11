"""``hf_lightning.cli``: the factories a LightningCLI config names, and how ``HFLightningCLI`` builds the pieces."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("jsonargparse")
transformers = pytest.importorskip("transformers")

from hf_lightning import EarlyStoppingCallback, HFDataModule, HFLightningModule, TrainingArguments  # noqa: E402
from hf_lightning.precision import HFMixedPrecision  # noqa: E402
from hf_lightning.cli import HFLightningCLI, TextFileDataset, model_from_config, model_from_pretrained  # noqa: E402

# Lightning's CLI calls jsonargparse APIs that jsonargparse 4.49+ deprecates, and warns about `args=` next to
# pytest's own command line: neither is this package's to fix.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")]

TINY_GPT2 = {"vocab_size": 256, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 2}


def test_model_from_config_builds_the_task_head_with_the_given_config():
    model = model_from_config("gpt2", "causal-lm", TINY_GPT2)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert (model.config.n_embd, model.config.vocab_size) == (8, 256)
    classifier = model_from_config("bert", "sequence-classification", {
        "vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "num_labels": 3})
    assert type(classifier).__name__ == "BertForSequenceClassification" and classifier.config.num_labels == 3


@pytest.mark.parametrize(("call", "message"), [
    (lambda: model_from_config("gpt2", "causal_lm"), r"Unknown task 'causal_lm' for the model: use one of \["),
    (lambda: model_from_config("gpt-9"), r"unknown model_type 'gpt-9'"),
    (lambda: model_from_pretrained("gpt2"), r"'gpt2' is not a folder with a config.json"),
])
def test_factories_name_the_bad_setting(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_model_from_pretrained_loads_a_saved_folder(tmp_path):
    model = model_from_config("gpt2", config=TINY_GPT2)
    model.save_pretrained(tmp_path / "saved")
    loaded = model_from_pretrained(str(tmp_path / "saved"))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_text_file_dataset_cuts_the_bytes_into_blocks(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefghij\n")  # 11 bytes: two blocks of 5, the last byte dropped
    dataset = TextFileDataset(str(path), block_size=5)
    assert len(dataset) == 2
    assert dataset[1]["input_ids"].tolist() == list(b"fghij")
    assert torch.equal(dataset[1]["labels"], dataset[1]["input_ids"])
    with pytest.raises(ValueError, match=r"has 11 tokens, fewer than one block of 64; lower block_size"):
        TextFileDataset(str(path), block_size=64)
    with pytest.raises(ValueError, match=r"TextFileDataset: no file at"):
        TextFileDataset(str(tmp_path / "missing.txt"))


def _config(tmp_path, **extra) -> dict:
    data = {"class_path": "hf_lightning.cli.TextFileDataset", "init_args": {"path": str(tmp_path / "corpus.txt"),
                                                                           "block_size": 8}}
    return {
        "training_args": {"output_dir": str(tmp_path / "out"), "max_steps": 3, "seed": 7, "report_to": "none"},
        "model": {"model": {"class_path": "hf_lightning.cli.model_from_config",
                            "init_args": {"model_type": "gpt2", "config": TINY_GPT2}}},
        "data": {"train_dataset": data},
        **extra,
    }


def test_the_cli_shares_one_training_arguments_and_seeds_the_model_from_it(tmp_path):
    (tmp_path / "corpus.txt").write_text("a small corpus for the cli test\n" * 4)
    config = _config(tmp_path)
    config["training_args"].update(bf16=True, use_cpu=True)
    config["model"]["callbacks"] = [{"class_path": "hf_lightning.EarlyStoppingCallback",
                                     "init_args": {"early_stopping_patience": 2}}]
    cli = HFLightningCLI(args=config, run=False)
    assert isinstance(cli.model, HFLightningModule) and isinstance(cli.datamodule, HFDataModule)
    [callback] = cli.model.hf_callbacks  # built from its class_path, for the flow callback to drive
    assert isinstance(callback, EarlyStoppingCallback) and callback.early_stopping_patience == 2
    assert isinstance(cli.model.args, TrainingArguments) and cli.model.args is cli.datamodule.args
    assert (cli.model.args.max_steps, cli.model.args.output_dir) == (3, str(tmp_path / "out"))
    assert cli.trainer.default_root_dir == str(tmp_path / "out")
    assert not any(type(cb).__name__ == "ModelCheckpoint" for cb in cli.trainer.callbacks)
    assert cli.trainer.logger is None  # report_to="none"
    # bf16=True: HF's autocast scope (the model's forward only), which the module requires of a user-built trainer.
    assert isinstance(cli.trainer.precision_plugin, HFMixedPrecision) and cli.trainer.precision == "bf16-mixed"
    # HF's seed (training_args.seed) initialised the model, as set_seed + from_config would.
    from hf_lightning import set_seed

    set_seed(7)
    expected = model_from_config("gpt2", config=TINY_GPT2)
    assert torch.equal(cli.model.model.transformer.wte.weight, expected.transformer.wte.weight)


def test_the_cli_refuses_lightnings_seed_everything(tmp_path):
    (tmp_path / "corpus.txt").write_text("a small corpus for the cli test\n" * 4)
    with pytest.raises(ValueError, match=r"remove seed_everything and set training_args.seed instead"):
        HFLightningCLI(args=_config(tmp_path, seed_everything=3), run=False)


def test_a_trainer_setting_that_training_args_decide_fails_before_anything_is_written(tmp_path):
    (tmp_path / "corpus.txt").write_text("a small corpus for the cli test\n" * 4)
    config = _config(tmp_path, trainer={"accumulate_grad_batches": 2, "enable_progress_bar": False})
    cli = HFLightningCLI(args=config, run=False)  # what `fit` runs, without building every subcommand's parser
    with pytest.raises(ValueError, match=r"Remove accumulate_grad_batches from the lightning.Trainer and set "
                                         r"gradient_accumulation_steps in TrainingArguments"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert not (tmp_path / "out").exists(), "neither checkpoints nor the CLI's config.yaml"


def test_subclass_mode_is_refused_with_the_way_to_pass_a_subclass():
    with pytest.raises(ValueError, match=r"does not support subclass_mode_model=True.*HFLightningCLI\(model_class="):
        HFLightningCLI(subclass_mode_model=True, args={}, run=False)
