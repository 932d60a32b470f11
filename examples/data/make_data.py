"""Regenerate the small bundled data sets: ``python examples/data/make_data.py``.

Every file under ``examples/data/`` is written by this script from a fixed seed, so the data is reproducible and
owes nothing to an outside source. The sentences come from small hand-written grammars: varied enough that a model
has something to learn, regular enough that a tiny model learns it in a minute on a CPU.

- ``clm/{train,validation}.txt``: short stories, one per line (causal language modelling, ``run_clm.py``).
- ``classification/{train,validation,test}.jsonl``: product reviews labelled ``positive`` / ``negative``
  (``run_glue.py``); some use negation ("is not sturdy"), so word counting alone is not enough.
- ``ner/{train,validation,test}.jsonl``: ``tokens`` and BIO ``ner_tags`` for people, places and organisations
  (``run_ner.py``); the test split mostly uses names the training split never shows.
- ``translation/{train,validation,test}.jsonl``: ``{"translation": {"en": ..., "fr": ...}}`` pairs from a tiny
  English-French grammar with gender agreement and adjectives placed after the noun (``run_translation.py``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

# --------------------------------------------------------------------------- stories (causal LM)
NAMES = ["anna", "ben", "clara", "david", "emma", "felix", "grace", "hugo", "iris", "jonas", "lena", "max"]
ANIMALS = ["cat", "dog", "fox", "owl", "rabbit", "horse", "duck", "mouse"]
THINGS = ["ball", "kite", "box", "hat", "book", "cake", "key", "lamp", "boat", "drum"]
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "little", "old", "shiny"]
PLACES = ["garden", "forest", "kitchen", "park", "river", "village", "barn", "market", "hill", "beach"]
FEELINGS = ["happy", "sad", "tired", "proud", "surprised", "hungry", "sleepy", "glad"]
TIMES = ["one morning", "one day", "after lunch", "in the evening", "at night", "on sunday", "in the spring"]
MOVES = ["walked", "ran", "went", "hurried", "wandered"]


def _story(rng: random.Random) -> str:
    name, animal, thing = rng.choice(NAMES), rng.choice(ANIMALS), rng.choice(THINGS)
    colour, place, other = rng.choice(COLOURS), rng.choice(PLACES), rng.choice(PLACES)
    feeling = rng.choice(FEELINGS)
    opening = rng.choice([
        f"{rng.choice(TIMES)} {name} {rng.choice(MOVES)} to the {place} .",
        f"{name} had a {colour} {animal} .",
        f"{rng.choice(TIMES)} the {animal} {rng.choice(MOVES)} to the {place} .",
    ])
    middle = rng.choice([
        f"there {name} found a {colour} {thing} .",
        f"the {animal} found a {colour} {thing} near the {place} .",
        f"{name} lost the {thing} in the {other} .",
        f"the {animal} took the {thing} and ran to the {other} .",
        f"{name} gave the {thing} to the {animal} .",
    ])
    ending = rng.choice([
        f"{name} was very {feeling} .",
        f"the {animal} was {feeling} .",
        f"then they went home to the {other} .",
        f"so {name} and the {animal} played until dinner .",
        f"it was a {rng.choice(['good', 'long', 'fun', 'quiet'])} day .",
    ])
    parts = [opening, middle, ending]
    if rng.random() < 0.3:
        parts.insert(2, f"the {thing} was {rng.choice(COLOURS)} .")
    return " ".join(parts)


# --------------------------------------------------------------------------- reviews (classification)
PRODUCTS = ["phone", "laptop", "kettle", "lamp", "chair", "backpack", "camera", "blender", "jacket", "speaker"]
ASPECTS = ["battery", "screen", "handle", "price", "sound", "design", "zipper", "motor", "fabric", "button"]
GOOD = ["great", "excellent", "sturdy", "reliable", "lovely", "comfortable", "perfect", "solid"]
BAD = ["terrible", "flimsy", "awful", "useless", "cheap", "noisy", "broken", "poor"]
PRAISE = ["i love this {p} .", "the {p} works well .", "i would buy this {p} again .", "highly recommended ."]
COMPLAINT = ["i regret buying this {p} .", "the {p} stopped working .", "i returned the {p} .", "do not buy it ."]
FILLER = ["it arrived on tuesday .", "i use it every day .", "my sister has one too .", "it came in a box ."]


def _review(rng: random.Random, positive: bool) -> str:
    product, aspect = rng.choice(PRODUCTS), rng.choice(ASPECTS)
    if rng.random() < 0.35:
        # Negation flips the word that carries the sentiment.
        core = f"the {aspect} is not {rng.choice(BAD if positive else GOOD)} ."
    else:
        core = f"the {aspect} is {rng.choice(GOOD if positive else BAD)} ."
    parts = [f"i bought this {product} .", core]
    if rng.random() < 0.4:
        parts.append(rng.choice(PRAISE if positive else COMPLAINT).format(p=product))
    if rng.random() < 0.5:
        parts.insert(rng.randrange(1, 3), rng.choice(FILLER))
    return " ".join(parts[1:] if rng.random() < 0.5 else parts)


# --------------------------------------------------------------------------- entities (token classification)
FIRST = ["Alice", "Bruno", "Chloe", "Daniel", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jakob", "Kofi", "Lucia"]
LAST = ["Martin", "Okafor", "Silva", "Novak", "Berg", "Tanaka", "Rossi", "Dubois"]
CITIES = ["Paris", "Lisbon", "Oslo", "Nairobi", "Lima", "Kyoto", "New York", "Cape Town", "Buenos Aires"]
ORGS = ["Acme Corp", "Globex", "Initech", "Umbrella Labs", "Northwind Bank", "Blue River Energy", "Vandelay"]
# Held out of the training split, so the test split measures use of context rather than memory.
FIRST_TEST = ["Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa"]
LAST_TEST = ["Haddad", "Kowalski", "Lindqvist"]
CITIES_TEST = ["Dakar", "Tallinn", "Rio de Janeiro"]
ORGS_TEST = ["Stark Systems", "Wayne Foods", "Hooli"]
NER_TEMPLATES = [
    "{PER} works for {ORG} in {LOC} .",
    "{PER} flew from {LOC} to {LOC} on Monday .",
    "{ORG} opened a new office in {LOC} .",
    "yesterday {PER} met {PER} at the {ORG} office .",
    "the mayor of {LOC} thanked {PER} .",
    "{PER} left {ORG} last year and moved to {LOC} .",
    "shares of {ORG} rose after {PER} spoke .",
    "in {LOC} , {PER} signed a deal with {ORG} .",
    "{PER} said the weather in {LOC} was cold .",
    "the team from {ORG} visited {LOC} in May .",
]


def _entity(rng: random.Random, kind: str, held_out: bool) -> list[str]:
    pool_first, pool_last = (FIRST_TEST, LAST_TEST) if held_out else (FIRST, LAST)
    if kind == "PER":
        first = rng.choice(pool_first)
        return [first] if rng.random() < 0.4 else [first, rng.choice(pool_last)]
    pool = {"LOC": CITIES_TEST if held_out else CITIES, "ORG": ORGS_TEST if held_out else ORGS}[kind]
    return rng.choice(pool).split()


def _ner_example(rng: random.Random, held_out_rate: float) -> dict:
    tokens, tags = [], []
    for word in rng.choice(NER_TEMPLATES).split():
        if word.startswith("{") and word.endswith("}"):
            kind = word[1:-1]
            span = _entity(rng, kind, rng.random() < held_out_rate)
            tokens.extend(span)
            tags.extend([f"B-{kind}"] + [f"I-{kind}"] * (len(span) - 1))
        else:
            tokens.append(word)
            tags.append("O")
    return {"tokens": tokens, "ner_tags": tags}


# --------------------------------------------------------------------------- English -> French
# noun: (french, gender); adjectives: (masculine, feminine) and are placed after the noun in French.
NOUNS = {
    "cat": ("chat", "m"), "dog": ("chien", "m"), "horse": ("cheval", "m"), "book": ("livre", "m"),
    "garden": ("jardin", "m"), "boy": ("garçon", "m"), "fish": ("poisson", "m"), "car": ("voiture", "f"),
    "house": ("maison", "f"), "apple": ("pomme", "f"), "girl": ("fille", "f"), "table": ("table", "f"),
    "door": ("porte", "f"), "flower": ("fleur", "f"), "mouse": ("souris", "f"), "window": ("fenêtre", "f"),
}
ADJECTIVES = {
    "red": ("rouge", "rouge"), "black": ("noir", "noire"), "green": ("vert", "verte"),
    "white": ("blanc", "blanche"), "blue": ("bleu", "bleue"), "yellow": ("jaune", "jaune"),
    "round": ("rond", "ronde"), "heavy": ("lourd", "lourde"),
}
TRANSITIVE = {"sees": "voit", "likes": "aime", "eats": "mange", "finds": "trouve", "watches": "regarde",
              "takes": "prend", "wants": "veut", "follows": "suit"}
INTRANSITIVE = {"sleeps": "dort", "runs": "court", "sings": "chante", "waits": "attend"}
PREPOSITIONS = {"in": "dans", "on": "sur", "under": "sous", "behind": "derrière"}


def _noun_phrase(rng: random.Random) -> tuple[str, str]:
    noun = rng.choice(list(NOUNS))
    french, gender = NOUNS[noun]
    definite = rng.random() < 0.6
    en_det = "the" if definite else "a"
    fr_det = {("m", True): "le", ("f", True): "la", ("m", False): "un", ("f", False): "une"}[(gender, definite)]
    if rng.random() < 0.5:
        adjective = rng.choice(list(ADJECTIVES))
        fr_adj = ADJECTIVES[adjective][0 if gender == "m" else 1]
        return f"{en_det} {adjective} {noun}", f"{fr_det} {french} {fr_adj}"
    return f"{en_det} {noun}", f"{fr_det} {french}"


def _clause(rng: random.Random) -> tuple[str, str]:
    subject_en, subject_fr = _noun_phrase(rng)
    roll = rng.random()
    if roll < 0.5:
        verb = rng.choice(list(TRANSITIVE))
        object_en, object_fr = _noun_phrase(rng)
        return f"{subject_en} {verb} {object_en}", f"{subject_fr} {TRANSITIVE[verb]} {object_fr}"
    if roll < 0.75:
        verb = rng.choice(list(INTRANSITIVE))
        return f"{subject_en} {verb}", f"{subject_fr} {INTRANSITIVE[verb]}"
    preposition = rng.choice(list(PREPOSITIONS))
    place_en, place_fr = _noun_phrase(rng)
    return f"{subject_en} is {preposition} {place_en}", f"{subject_fr} est {PREPOSITIONS[preposition]} {place_fr}"


def _pair(rng: random.Random) -> dict:
    en, fr = _clause(rng)
    if rng.random() < 0.25:
        en2, fr2 = _clause(rng)
        en, fr = f"{en} and {en2}", f"{fr} et {fr2}"
    return {"translation": {"en": f"{en} .", "fr": f"{fr} ."}}


# --------------------------------------------------------------------------- writing
def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    _write_lines(path, [json.dumps(row, ensure_ascii=False) for row in rows])


def main(out_dir: Path = HERE) -> None:
    """Write every bundled data file under ``out_dir`` (default: beside this script, overwriting them)."""
    rng = random.Random(20240607)
    _write_lines(out_dir / "clm" / "train.txt", [_story(rng) for _ in range(600)])
    _write_lines(out_dir / "clm" / "validation.txt", [_story(rng) for _ in range(60)])

    for split, size in (("train", 600), ("validation", 100), ("test", 100)):
        rows = []
        for index in range(size):
            positive = index % 2 == 0
            rows.append({"sentence": _review(rng, positive), "label": "positive" if positive else "negative"})
        rng.shuffle(rows)
        _write_jsonl(out_dir / "classification" / f"{split}.jsonl", rows)

    for split, size, held_out in (("train", 500, 0.0), ("validation", 80, 0.0), ("test", 80, 0.7)):
        _write_jsonl(out_dir / "ner" / f"{split}.jsonl", [_ner_example(rng, held_out) for _ in range(size)])

    for split, size in (("train", 800), ("validation", 80), ("test", 80)):
        _write_jsonl(out_dir / "translation" / f"{split}.jsonl", [_pair(rng) for _ in range(size)])


if __name__ == "__main__":
    main()
