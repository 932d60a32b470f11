"""What the example scripts share so they run with no network: bundled data paths, tokenizers trained on the
bundled data at start-up, metric functions, and HF-style logging set-up.

The HF originals download a tokenizer and a metric (``evaluate.load``) from the Hub. Here a tokenizer is trained
with the ``tokenizers`` library on the training file (a fraction of a second) and wrapped as a
``transformers.PreTrainedTokenizerFast``, and the metrics are small functions of numpy arrays. Everything else in
the scripts follows HF's examples.

``transformers`` (and ``datasets``) are needed by the examples, not by hf_lightning:
``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"

# Nothing here needs the Hub; without this a mistyped local path would wait on the network before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def require_transformers() -> None:
    """Fail early, with the install command, when ``transformers`` or ``datasets`` is missing.

    Raises:
        SystemExit: naming the missing package and the ``examples`` extra that brings it.
    """
    for name in ("transformers", "datasets"):
        try:
            __import__(name)
        except ImportError:
            raise SystemExit(
                f"The hf_lightning examples build their models with `{name}`, which is not installed. Install the "
                "examples extra: pip install -e \".[examples]\" (hf_lightning itself does not need it)."
            ) from None


def setup_logging(training_args, logger: logging.Logger) -> None:
    """HF's example logging: timestamped lines on stdout; INFO on the main process and WARNING elsewhere, unless
    ``--log_level`` / ``--log_level_replica`` say otherwise.

    Lightning's start-up banners (accelerator summary, tips) are lowered to WARNING: HF's Trainer prints none of
    them, and a migrated script should look like the original. ``transformers``' per-save progress bars are off
    for the same reason.
    """
    import datasets
    import transformers

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.log_level == "passive":
        level = logging.INFO if training_args.should_log else logging.WARNING
    else:
        level = training_args.get_process_log_level()
    logger.setLevel(level)
    logging.getLogger("hf_lightning").setLevel(level)
    datasets.utils.logging.set_verbosity(logging.WARNING)
    transformers.utils.logging.set_verbosity(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning 2.6 on torch >= 2.10 warns about its own pytree use on every fit; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    # Lightning suggests DataLoader workers; for these tiny batches the main process is faster.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")


def parse_arguments(parser, argv: list[str] | None) -> tuple:
    """HF's convention: a single ``.json`` / ``.yaml`` argument is a file of arguments, else the command line.

    Args:
        parser: an ``HfArgumentParser`` over the script's dataclasses.
        argv: the words after the script name (``sys.argv[1:]`` when ``None``).
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(os.path.abspath(argv[0]))
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(argv, look_for_args_file=False)


# --------------------------------------------------------------------------- tokenizers
def train_byte_level_bpe(texts: Iterable[str], vocab_size: int = 1000, eos_token: str = "<|endoftext|>"):
    """A GPT-2-style byte-level BPE tokenizer trained on ``texts``.

    Args:
        texts: the training text (lines).
        vocab_size: target vocabulary size, including the 256 byte symbols and ``eos_token``.
        eos_token: the one special token; also used as bos, unk and padding, as GPT-2 does.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=eos_token, eos_token=eos_token, unk_token=eos_token,
        pad_token=eos_token,
    )


def train_word_level(
    texts: Iterable[str],
    special_tokens: Sequence[str],
    *,
    unk_token: str,
    pad_token: str,
    cls_token: str | None = None,
    sep_token: str | None = None,
    eos_token: str | None = None,
    min_frequency: int = 1,
):
    """A whitespace/punctuation word-level tokenizer trained on ``texts``.

    The special tokens get the first ids, in the order given (``<pad>`` first for T5, ``[PAD]`` first for BERT).
    With ``cls_token`` and ``sep_token`` the encodings are ``[CLS] words [SEP]`` (BERT); with ``eos_token`` they
    are ``words </s>`` (T5). Word-level encodings keep ``word_ids()``, which token classification needs.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token=unk_token))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(
        special_tokens=list(special_tokens), min_frequency=min_frequency, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if cls_token is not None and sep_token is not None:
        ids = {token: tokenizer.token_to_id(token) for token in (cls_token, sep_token)}
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls_token} $A {sep_token}",
            pair=f"{cls_token} $A {sep_token} $B:1 {sep_token}:1",
            special_tokens=list(ids.items()),
        )
    elif eos_token is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos_token}", pair=f"$A {eos_token} $B:1 {eos_token}:1",
            special_tokens=[(eos_token, tokenizer.token_to_id(eos_token))],
        )
    named = {"unk_token": unk_token, "pad_token": pad_token, "cls_token": cls_token, "sep_token": sep_token,
             "eos_token": eos_token}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{k: v for k, v in named.items() if v is not None})


def load_or_train_tokenizer(tokenizer_name: str | None, saved_folders: Sequence[str | None], train):
    """The tokenizer a script uses.

    ``--tokenizer_name`` (a local folder) when given; else the first of ``saved_folders`` that holds one (the
    checkpoint being resumed, then ``--model_name_or_path``: a freshly trained tokenizer could number the words
    differently from the weights); else ``train()``.

    Raises:
        ValueError: ``tokenizer_name`` is not a folder with a ``tokenizer.json``.
    """
    from transformers import AutoTokenizer

    if tokenizer_name:
        if not os.path.isfile(os.path.join(tokenizer_name, "tokenizer.json")):
            raise ValueError(
                f"--tokenizer_name {tokenizer_name!r} is not a folder with a tokenizer.json (the examples run "
                "offline, so a Hub name cannot be downloaded). Leave it unset to train one on the training data."
            )
        return AutoTokenizer.from_pretrained(tokenizer_name)
    for folder in saved_folders:
        if folder and os.path.isfile(os.path.join(folder, "tokenizer.json")):
            return AutoTokenizer.from_pretrained(folder)
    return train()


# --------------------------------------------------------------------------- metrics
def accuracy_and_f1(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-averaged F1 over the classes present in ``labels`` or ``predictions``."""
    predictions, labels = np.asarray(predictions).ravel(), np.asarray(labels).ravel()
    f1s = []
    for cls in np.union1d(labels, predictions):
        true_positive = np.sum((predictions == cls) & (labels == cls))
        predicted, actual = np.sum(predictions == cls), np.sum(labels == cls)
        f1s.append(0.0 if predicted + actual == 0 else 2 * true_positive / (predicted + actual))
    return {"accuracy": float(np.mean(predictions == labels)), "f1": float(np.mean(f1s)) if f1s else 0.0}


def _spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entity spans ``(type, start, end)`` of a BIO sequence; an ``I-`` that does not continue starts a span."""
    spans, kind, start = set(), None, 0
    for index, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and label == kind
        if kind is not None and not continues:
            spans.add((kind, start, index))
            kind = None
        if prefix in ("B", "I") and not continues:
            kind, start = label, index
    return spans


def entity_scores(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision / recall / F1 (an entity counts when type and span match exactly) and tag accuracy,
    the numbers HF's ``run_ner.py`` reports through ``seqeval``.
    """
    true_total = predicted_total = correct = 0
    tags_right = tags_total = 0
    for truth, predicted in zip(true_tags, predicted_tags):
        true_spans, predicted_spans = _spans(truth), _spans(predicted)
        true_total += len(true_spans)
        predicted_total += len(predicted_spans)
        correct += len(true_spans & predicted_spans)
        tags_right += sum(a == b for a, b in zip(truth, predicted))
        tags_total += len(truth)
    precision = correct / predicted_total if predicted_total else 0.0
    recall = correct / true_total if true_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": tags_right / max(tags_total, 1)}


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], max_order: int = 4) -> float:
    """Corpus BLEU (0-100) on whitespace tokens: clipped n-gram precisions up to ``max_order``, geometric mean,
    brevity penalty; no smoothing, so a corpus without a matching 4-gram scores 0 (as sacreBLEU's default).
    """
    matches, possible = [0] * max_order, [0] * max_order
    hypothesis_length = reference_length = 0
    for hypothesis, reference in zip(hypotheses, references):
        hyp, ref = hypothesis.split(), reference.split()
        hypothesis_length += len(hyp)
        reference_length += len(ref)
        for n in range(1, max_order + 1):
            hyp_ngrams = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            ref_ngrams = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum((hyp_ngrams & ref_ngrams).values())
            possible[n - 1] += max(len(hyp) - n + 1, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / p) for m, p in zip(matches, possible)) / max_order
    ratio = hypothesis_length / max(reference_length, 1)
    brevity = 1.0 if ratio > 1 else math.exp(1 - 1 / max(ratio, 1e-9))
    return 100 * brevity * math.exp(log_precision)
