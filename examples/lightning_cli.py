#!/usr/bin/env python
"""Launch an HF-semantics run the way Lightning users do: ``LightningCLI`` and a YAML config.

``HFLightningCLI`` is Lightning's ``LightningCLI`` with ``HFLightningModule`` as the model, ``HFDataModule`` as the
data, and one extra ``training_args:`` section (HF's ``TrainingArguments``) shared by both. The config
``examples/configs/gpt2_clm.yaml`` builds a small GPT-2 from a config dict and trains it on the bundled story corpus
(``examples/data/clm``), fully offline; the run writes HF's ``checkpoint-N`` folders and ``trainer_state.json``.

Run (needs ``transformers`` and ``jsonargparse``: ``pip install -e ".[examples]"``)::

    python examples/lightning_cli.py fit --config examples/configs/gpt2_clm.yaml
    python examples/lightning_cli.py fit --config examples/configs/gpt2_clm.yaml --training_args.max_steps 60 \\
        --ckpt_path out/cli_clm/checkpoint-40          # resume from an HF checkpoint folder
    python examples/lightning_cli.py fit --help        # every setting, with its documentation
    python examples/lightning_cli.py fit --print_config --config examples/configs/gpt2_clm.yaml

Relative paths in the config (the data files) are read from the working directory: run from the repository root.
"""

import logging
import os
import warnings

from hf_lightning.cli import HFLightningCLI

# Nothing here needs the Hub; without this a mistyped local path would wait on the network before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Lightning's start-up banners (devices found, tips) lowered to WARNING, as the HF-style examples do; drop this line
# to see them.
for name in ("lightning.pytorch", "lightning.fabric"):
    logging.getLogger(name).setLevel(logging.WARNING)
# Lightning 2.6's CLI calls jsonargparse APIs that jsonargparse 4.49+ deprecates: nothing a user can act on.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
# Lightning 2.6 on torch >= 2.10 warns about its own pytree use on every fit; nothing a user can act on.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


def main(args=None) -> HFLightningCLI:
    """Parse the command line (or ``args``) and run the subcommand (``fit``, ``validate``, ...)."""
    import transformers

    # save_pretrained's per-file progress bars at every checkpoint; HF's Trainer output has none of them.
    transformers.utils.logging.disable_progress_bar()
    return HFLightningCLI(args=args)


if __name__ == "__main__":
    main()
