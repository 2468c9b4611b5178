"""Neutral filler text: background notes that lengthen a prompt to a context level.

The notes are plain sentences about an imaginary town, built from fixed word banks by
a seeded random generator: the same seed gives the same words. They hold no digits,
no code, no mathematical terms and no request to summarise, so they change neither
what a request asks for nor the category the simulator reads from it
(:mod:`sweep.sim.content` sets the block aside).
"""

from __future__ import annotations

import random

_SUBJECTS = (
    "The garden path",
    "A quiet street near the school",
    "The morning market",
    "The old stone bridge",
    "The village green",
    "A narrow lane behind the chapel",
    "The hillside orchard",
    "The harbour wall",
    "A wooden gate by the meadow",
    "The reading room upstairs",
    "The bakery on the corner",
    "The footpath along the river",
    "A row of cottages facing the hill",
    "The station platform",
    "The covered walkway by the hall",
    "The allotments beyond the church",
)
_PREDICATES = (
    "was swept early in the day",
    "looked calm under a grey sky",
    "was busy with neighbours and visitors",
    "stayed quiet until late in the afternoon",
    "had been painted a pale shade of blue",
    "caught the light after the rain",
    "smelled of cut grass and fresh bread",
    "was lined with pots of herbs and late flowers",
    "echoed with the sound of children playing",
    "was covered in fallen leaves",
    "felt colder than it had the week before",
    "was repaired by volunteers from the parish",
    "drew a small crowd of walkers and their dogs",
    "was lit by lanterns in the evening",
)
_ENDINGS = (
    "as it does most weeks",
    "according to the caretaker",
    "and nobody remarked on it",
    "while bells rang somewhere in the distance",
    "before the weather turned",
    "as the notes from the previous season describe",
    "which pleased the people who live nearby",
    "though few visitors noticed",
    "in the usual way",
    "until the light began to fade",
)


def filler_words(count: int, seed: int) -> list[str]:
    """Exactly ``count`` whitespace-separated words of neutral notes (sentences end with a
    full stop; the last one may be cut short and then also ends with one)."""
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < count:
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)}, {rng.choice(_ENDINGS)}."
        words.extend(sentence.split())
    words = words[:count]
    if words and not words[-1].endswith("."):
        words[-1] = words[-1].rstrip(",") + "."
    return words
