"""Secrets out of everything `sweep` stores, prints, reports or sends: pure functions.

What is secret is decided by *name*, so it works on values `sweep` has never seen:

- an environment variable, flag or key whose name has a word ending in ``TOKEN`` or
  ``KEY`` (``HF_TOKEN``, ``--api-key``, ``--admin-api-key``, ``apiKey``) or containing
  ``SECRET``, ``PASSWORD``, ``PASSWD``, ``PASSPHRASE``, ``CREDENTIAL`` or ``WEBHOOK``
  (``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``, ``[notify] webhook``), except the few known
  harmless names in :data:`NOT_SECRET_NAMES` (``--speculative-token-map`` is a file path);
- the password of a URL with ``user:password@`` (``postgresql://sweep:pw@db/sweep``), and
  the value of a secret-named query parameter;
- the credential after ``Bearer``.

A secret value that is a URL keeps its scheme and host (``https://hooks.slack.com/<redacted>``),
so a redacted study file still parses and says where things went.

**By value, too.** Every value found under a secret name is remembered for this process
(:func:`remember_secret`; the study's are learnt when it is parsed), and every structured
redaction also hides it wherever it appears, whatever the name it sits under
(``NCCL_IB_HCA = <the token>``).

**Structured places only.** The name rules apply to structured text: environments,
command lines, study files, log lines, stored attributes. `sweep`'s own message text
(an error, a console line: paths, study names) goes through :func:`redact_message` instead,
which hides known secret values, URL passwords and ``Bearer`` credentials but never guesses
from a name — `sweep status turkey.toml` must not print ``<redacted>``.

Redaction is only for what is kept or shown: the server still gets the real values
(the runner launches with the study's environment and flags, never with these copies).
Every function returns a new value and never raises on odd input.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
"""What a secret value is replaced with (a valid TOML string once quoted)."""

NOT_SECRET_NAMES = frozenset({"KEY", "SWEEP_KEY", "SPECULATIVE_TOKEN_MAP", "STRICT_HOST_KEY"})
"""Names that match the rule but hold no secret (``sweep.key`` is a configuration's identity,
``[host] strict_host_key`` a switch)."""

_SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "WEBHOOK")
_SECRET_WORD_ENDS = ("TOKEN", "KEY")
_KEY_WORDS_NOT_SECRET = ("TURKEY", "MONKEY", "DONKEY", "WHISKEY", "JOCKEY", "HOCKEY", "HOTKEY")
"""Words ending in KEY that name no key (a study called ``turkey``)."""
MIN_SECRET_LENGTH = 6
"""Shorter values are not remembered for redaction by value (they would hide common words)."""
_KNOWN: set[str] = set()
_EMPTY_VALUES = frozenset(
    {"", "None", "null", "none", "''", '""', REDACTED, "true", "false", "True", "False"}
)
"""Values that hide nothing: empty, or a switch (``use_key = true``)."""

_QUOTED = r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'"
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*):(?P<password>[^\s@'\"]*)@"
)
_URL_HOST = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^/\s?#]+")
_URL_QUERY = re.compile(r"(?P<head>[?&](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#\s'\"]*)")
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<value>[A-Za-z0-9\-._~+/=]+)", re.IGNORECASE)
_ASSIGNMENT = re.compile(
    rf"(?P<key>{_QUOTED}|--?[A-Za-z0-9][\w.\-]*|[A-Za-z_][\w.\-]*)"
    rf"(?P<sep>[ \t]*[=:][ \t]*)"
    rf"(?P<value>{_QUOTED}|[^\s,;)}}\]'\"]+)"
)
_FLAG_VALUE = re.compile(
    rf"(?P<key>--[A-Za-z0-9][\w.\-]*)(?P<sep>[ \t]+)(?P<value>{_QUOTED}|(?!--)[^\s'\"]+)"
)
_ENV_WORD = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.DOTALL)
_SHELL_PUNCTUATION = frozenset("0123456789();<>|&")


@functools.lru_cache(maxsize=4096)  # pure; a report asks about the same few names 24,000 times
def is_secret_name(name: str) -> bool:
    """True when a variable, flag or key called ``name`` holds a secret (see module docs).

    >>> [is_secret_name(n) for n in ("HF_TOKEN", "--api-key", "--max-total-tokens", "port")]
    [True, True, False, False]
    """
    normal = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip("'\"").lstrip("-"))
    normal = re.sub(r"[^A-Za-z0-9]+", "_", normal).strip("_").upper()
    if not normal or normal in NOT_SECRET_NAMES:
        return False
    if any(part in normal for part in _SECRET_PARTS):
        return True
    return any(
        word.endswith(_SECRET_WORD_ENDS) and word not in _KEY_WORDS_NOT_SECRET
        for word in normal.split("_")
    )


def remember_secret(value: str) -> None:
    """Hide ``value`` by value from now on, wherever structured redaction meets it.

    A URL is remembered without its scheme and host (those stay readable).
    """
    value = value.strip().strip("'\"")
    url = _URL_HOST.match(value)
    if url:
        value = value[len(url[0]) :]
    if len(value) >= MIN_SECRET_LENGTH and value not in _EMPTY_VALUES and value not in _KNOWN:
        _KNOWN.add(value)


def learn_secrets(text: str) -> None:
    """Remember every value ``text`` (a study file) holds under a secret name."""
    redact_text(text)


def forget_secrets() -> None:
    """Forget the values remembered so far (tests)."""
    _KNOWN.clear()
    _redact_text.cache_clear()
    _redact_command.cache_clear()


def redact_known(text: str) -> str:
    """``text`` with every remembered secret value hidden (longest first)."""
    if not text or not _KNOWN:
        return text
    for value in sorted(_KNOWN, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_message(text: str) -> str:
    """One of `sweep`'s own messages: known secret values, URL passwords and ``Bearer``
    credentials hidden; nothing guessed from a name (paths and study names stay whole)."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(_hide_password, text)
    text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    return redact_known(text)


def redact_url(url: str) -> str:
    """``scheme://user:password@host/...`` with the password (and secret query values) hidden."""
    text = _URL_PASSWORD.sub(_hide_password, url)
    if "://" in text and "?" in text:
        text = _URL_QUERY.sub(_hide_query_value, text)
    return text


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with secret-named variables hidden, and URL passwords and known secret
    values (any variable's) hidden in the others."""
    for k, v in env.items():
        if is_secret_name(k):
            remember_secret(str(v))
    return {
        k: (_hide(str(v)) if is_secret_name(k) else redact_text(str(v))) for k, v in env.items()
    }


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command's words with secret values hidden.

    Handles ``--api-key VALUE``, ``--api-key=VALUE``, ``HF_TOKEN=VALUE`` words (an ``env``
    prefix) and, in any other word, URL passwords and secret keys inside JSON or
    ``key=value`` text.
    """
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next and not word.startswith("--"):
            out.append(_hide(word))
            hide_next = False
            continue
        hide_next = False
        out.append(_redact_word(word))
        hide_next = word.startswith("-") and "=" not in word and is_secret_name(word)
    return [redact_known(word) for word in out]  # a secret met later in the line, by value


def redact_command(command: str) -> str:
    """A shell command line with secret values hidden (see :func:`redact_argv`)."""
    return _redact_command(command, len(_KNOWN))


@functools.lru_cache(maxsize=4096)  # a report redacts thousands of similar records
def _redact_command(command: str, known: int) -> str:
    """A shell command line with secret values hidden (see :func:`redact_argv`).

    The line is kept as written when nothing in its words is secret; otherwise its words
    are re-quoted (shell operators such as ``&&`` stay as they are).
    """
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: not a command we can split
        return redact_text(command)
    redacted = redact_argv(words)
    if redacted == words:
        return redact_text(command)
    return " ".join(_quote(w) for w in redacted)


def redact_text(text: str) -> str:
    """Structured text (a study file, log lines, a stored attribute) with secrets hidden.

    Hides URL passwords, ``Bearer`` credentials, the value after a secret-named key in
    ``KEY = "v"`` (TOML), ``"key": "v"`` (JSON), ``key='v'`` (Python), ``NAME=v`` (shell) and
    ``--flag v`` / ``--flag=v`` (command lines), and then every known secret value wherever
    it is. Quoting is kept, so TOML stays TOML.
    """
    if not text:
        return text
    return redact_known(_redact_text(text, len(_KNOWN)))


@functools.lru_cache(maxsize=4096)
def _redact_text(text: str, known: int) -> str:
    """The name rules of :func:`redact_text` (cached; ``known`` keys the cache by the registry's
    size, so a cached result never misses a secret learnt since)."""
    text = _URL_PASSWORD.sub(_hide_password, text)
    if "://" in text and "?" in text:
        text = _URL_QUERY.sub(_hide_query_value, text)
    text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    text = _hide_values(_ASSIGNMENT, text)
    return _hide_values(_FLAG_VALUE, text)


def redact_data(value: Any) -> Any:
    """JSON-like data (dicts, lists, strings) with secrets hidden: values under secret-named
    keys become :data:`REDACTED`, every string goes through :func:`redact_text`."""
    _learn_data(value)
    return _redact_data(value)


def _learn_data(value: Any) -> None:
    """Remember the values under secret-named keys first, so every string is then searched
    for all of them (a non-secret key may come before the secret one)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_name(str(k)) and isinstance(v, str):
                remember_secret(v)
            else:
                _learn_data(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _learn_data(v)


def _redact_data(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _redact_item(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_data(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _redact_item(key: str, value: Any) -> Any:
    if is_secret_name(key) and isinstance(value, str | int | float) and not isinstance(value, bool):
        return value if str(value) in _EMPTY_VALUES else _hide(str(value))
    return _redact_data(value)


def _redact_word(word: str) -> str:
    if word.startswith("-") and "=" in word:
        flag, _, value = word.partition("=")
        if is_secret_name(flag):
            return f"{flag}={_hide(value)}"
        return f"{flag}={redact_text(value)}"
    env = _ENV_WORD.match(word)
    if env and is_secret_name(env["name"]):
        return f"{env['name']}={_hide(env['value'])}"
    return redact_text(word)


def _quote(word: str) -> str:
    """Shell-quote ``word``, but leave operators (``&&``, ``2>&1``) and the redaction marker
    bare, so a redacted command reads like the original."""
    if set(word) <= _SHELL_PUNCTUATION:
        return word
    plain = word.replace(REDACTED, "x")
    if shlex.quote(plain) == plain:
        return word
    return shlex.quote(word)


def _hide_password(match: re.Match[str]) -> str:
    if not match["password"] or match["password"] == REDACTED:
        return match[0]
    remember_secret(match["password"])
    return f"{match['head']}:{REDACTED}@"


def _hide_query_value(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]) or match["value"] in _EMPTY_VALUES:
        return match[0]
    return match["head"] + REDACTED


def _hide_values(pattern: re.Pattern[str], text: str) -> str:
    """Replace the value of every secret-named key; a key that is not secret gives up only
    itself, so its value is searched again (``args=Args(api_key='x')``)."""
    out: list[str] = []
    pos = 0
    while (match := pattern.search(text, pos)) is not None:
        if _is_secret_value(match):
            out.append(text[pos : match.start("value")] + _hidden(match["value"]))
            pos = match.end()
        else:
            out.append(text[pos : match.end("sep")])
            pos = match.end("sep")
    out.append(text[pos:])
    return "".join(out)


def _is_secret_value(match: re.Match[str]) -> bool:
    value = match["value"]
    inner = value[1:-1] if _quote_of(value) else value
    return is_secret_name(match["key"]) and inner not in _EMPTY_VALUES


def _quote_of(value: str) -> str:
    return value[0] if len(value) > 1 and value[0] in "\"'" and value[-1] == value[0] else ""


def _hidden(value: str) -> str:
    quote = _quote_of(value)
    return f"{quote}{_hide(value[len(quote) : len(value) - len(quote)])}{quote}"


def _hide(value: str) -> str:
    """A secret value's replacement: the marker, or for a URL its scheme and host + marker.
    The value is remembered, to be hidden by value wherever else it appears."""
    remember_secret(value)
    url = _URL_HOST.match(value)
    return f"{redact_url(url[0])}/{REDACTED}" if url else REDACTED
