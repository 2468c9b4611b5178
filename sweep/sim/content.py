"""What a request is about, read from its prompt: the simulator's content categories.

Acceptance depends on content (a draft guesses code and math better than summaries of
a long passage), so the simulated server classifies each prompt and uses the profile's
acceptance for that category (``[acceptance.category.NAME]``, see docs/simulator.md).

The rule is a deterministic heuristic, applied in this order:

1. A leading block of neutral filler (what ``sweep.bench.categories.extend_to_tokens``
   puts before a question to lengthen it to a context level) is set aside: the
   category is the question's.
2. **summarization**: the question has at least :data:`SUMMARY_MIN_WORDS` words and a
   summary instruction ("summarize", "summarise", "summary", "TL;DR") among its first or
   last :data:`SUMMARY_EDGE_WORDS` words — a passage, then "Summarize …" (or the reverse).
3. **code**: a code marker — a fence, a ``def``/``function``/``class`` definition, braces,
   ``=>``, or a programming language or tool named (Python, SQL, regex, unit test, …).
4. **math**: notation (``3x + 2 = 11``, ``x^2``, ``√``, ``∫``, ``π``) or a mathematical
   term (solve, prove, equation, integral, probability, prime, remainder, …).
5. **chat**: everything else.

The shipped prompt sets (``sweep/bench/prompts/``) classify 100 % correctly (tested),
also when lengthened to any context level.
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = ("code", "math", "chat", "summarization")
SUMMARY_MIN_WORDS = 120
SUMMARY_EDGE_WORDS = 40
# The filler block sweep's context levels put before a question (sweep.bench.categories).
FILLER_HEAD = "Background notes (context only, no question here):"
FILLER_TAIL = "(End of background notes.)"

_SUMMARY = re.compile(r"\b(summari[sz]e|summary|tl;dr)\b", re.IGNORECASE)
_CODE_LANGUAGES = (
    r"python|javascript|typescript|java|rust|golang|kotlin|swift|ruby|php|c\+\+|c#|"
    r"sql|postgres(?:ql)?|sqlite|bash|shell script|powershell|regex|regular expression|"
    r"html|css|json|yaml|dockerfile|makefile|git|numpy|pandas|unit tests?|"
    r"compiler|stack trace|segfault|refactor|linked list|hash map|binary tree|recursion|"
    r"goroutines?"
)
_CODE = re.compile(
    r"```|\bdef\s+\w+\s*\(|\bfunction\b|\bclass\s+[A-Z]\w*|=>|[{}]|"
    rf"(?<![\w+#])(?:{_CODE_LANGUAGES})(?![\w+#])",
    re.IGNORECASE,
)
_MATH_TERMS = (
    r"solve|prove|proof|equation|equations|integral|derivative|probability|polynomial|"
    r"primes?|integers?|remainder|divisible|triangle|radius|perimeter|matrix|matrices|"
    r"eigenvalues?|logarithm|factorial|arithmetic|geometric|expected value|how many ways|"
    r"percent|modulo|gcd|lcm|theorem|hypotenuse|quadratic|inequality|"
    r"vertices|combinations|permutations|variance|median|fraction|log base|area|diagonal|"
    r"sum of|average speed"
)
_MATH = re.compile(
    r"\d\s*[-+*/^=<>×÷]\s*\(?[\d.a-z]|[a-z]\s*\^\s*\d|\b[a-z]\s*[=<>]\s*-?\d|[√∫∑π≤≥]|"
    rf"\b(?:{_MATH_TERMS})\b",
    re.IGNORECASE,
)


def question_of(prompt: str) -> str:
    """The prompt without a leading filler block (the text after :data:`FILLER_TAIL`)."""
    if prompt.startswith(FILLER_HEAD):
        _, tail, rest = prompt.partition(FILLER_TAIL)
        if tail:
            return rest.strip()
    return prompt


def classify(prompt: str) -> str:
    """The content category of ``prompt``: one of :data:`CATEGORIES` (see the module doc)."""
    question = question_of(prompt)
    if _is_summary(question):
        return "summarization"
    if _CODE.search(question):
        return "code"
    if _MATH.search(question):
        return "math"
    return "chat"


def _is_summary(question: str) -> bool:
    words = question.split()
    if len(words) < SUMMARY_MIN_WORDS:
        return False
    edges = " ".join(words[:SUMMARY_EDGE_WORDS] + words[-SUMMARY_EDGE_WORDS:])
    return _SUMMARY.search(edges) is not None
