"""A small rule-based sentence splitter for paragraphs of English-like text: the core of the Moses
`split-sentences.perl` heuristic (Koehn et al., 2007). A sentence ends at `.`, `!` or `?` (and closing quotes or
brackets) followed by whitespace and an uppercase letter, digit or opening quote, unless the word before the period is
a single capital ("J. R. R.") or a common abbreviation ("Dr."). It errs toward fewer splits: BERT's segment pairs
need plausible sentence boundaries, not perfect ones.
"""

from __future__ import annotations

import re

# Words that are usually followed by a capitalised word inside a sentence: the frequent entries of Moses'
# nonbreaking_prefix.en. Compared case-sensitively, as Moses does.
NONBREAKING = frozenset((
    "Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Mt", "Ft", "Gen", "Col", "Lt", "Sgt", "Capt", "Adm",
    "Rev", "Gov", "Sen", "Rep", "Hon", "vs", "etc", "No", "Nos", "Vol", "pp", "Fig", "Inc", "Ltd", "Co",
    "Corp", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec", "i.e", "e.g",
    "cf", "ca", "c", "approx", "U.S", "U.K", "U.N", "a.m", "p.m",
))
# One regex pass finds candidate ends; only those few are checked in Python, which keeps the splitter fast
# (a lookbehind per abbreviation inside the regex is ~10x slower).
_CANDIDATE = re.compile(r"([.!?])[\"'”’)\]]*(\s+)(?=[\"'“‘(\[]?[A-Z0-9])")
_WORD_START = "\"'“‘(["


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of one paragraph, in order, without surrounding whitespace; [] for a blank one."""
    sentences, start = [], 0
    for match in _CANDIDATE.finditer(paragraph):
        if match.group(1) == "." and _before_period_is_nonbreaking(paragraph, match.start(1)):
            continue
        sentences.append(paragraph[start:match.start(2)])
        start = match.end(2)
    sentences.append(paragraph[start:])
    return [s.strip() for s in sentences if s.strip()]


def _before_period_is_nonbreaking(text: str, period: int) -> bool:
    """True when the word ending at `period` is an initial ("J") or a known abbreviation ("Dr", "e.g")."""
    word = text[max(0, period - 12):period].rsplit(None, 1)[-1:]
    word = word[0].lstrip(_WORD_START) if word else ""
    return (len(word) == 1 and word.isupper()) or word in NONBREAKING
