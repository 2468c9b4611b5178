"""Is the launcher there? One command on the host, before the first launch.

A launcher that does not exist or cannot be executed fails every launch the
same way (the shell's exit 126/127, Python's "can't open file"), so it is a
deployment failure: found here, by `sweep plan` and before `sweep run`
launches anything, locally and over SSH, rather than once per configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sweep.server.executor.base import Executor

CHECK_TIMEOUT_S = 30.0

_SCRIPT = (
    'w="$1"; s="$2"; '
    'case "$w" in */*) [ -e "$w" ] || exit 3; { [ -x "$w" ] && [ ! -d "$w" ]; } || exit 4;; '
    '*) command -v "$w" >/dev/null 2>&1 || exit 3;; esac; '
    'if [ -n "$s" ]; then [ -r "$s" ] && [ ! -d "$s" ] || exit 5; fi'
)
"""Shell: exit 3 (not found), 4 (not executable), 5 (the script it runs cannot be read)."""

_PROBLEMS = {
    3: "{word!r} is not found (no such file, or not on PATH)",
    4: "{word!r} is not executable",
    5: "{script!r}, the script it runs, cannot be opened",
}


def launcher_problem(
    executor: Executor, launcher: Sequence[str], env: Mapping[str, str] | None = None
) -> str | None:
    """What stops ``launcher`` from running on the executor's host, or ``None`` if nothing.

    Checks the first word (found on ``PATH``, or an executable file) and, for
    ``python SCRIPT``, that the script can be read. ``env`` is the server's
    environment (its ``PATH`` is the one the launch uses).

    Raises:
        ExecutorError: the host cannot be reached (the caller decides what that means).
    """
    if not launcher:
        return "the launcher is empty"
    word = launcher[0]
    script = _script_of(launcher)
    argv = ("/bin/sh", "-c", _SCRIPT, "sweep-launcher-check", word, script)  # PATH may be the env's
    result = executor.run(argv, timeout=CHECK_TIMEOUT_S, env=dict(env or {}))
    template = _PROBLEMS.get(result.exit_code)
    if template is None:
        return None
    return f"{template.format(word=word, script=script)} on {executor.host}"


def _script_of(launcher: Sequence[str]) -> str:
    """The script a ``python SCRIPT ...`` launcher runs; ``""`` for ``python -m`` or others."""
    name = launcher[0].rsplit("/", 1)[-1]
    if len(launcher) < 2 or not name.startswith("python") or launcher[1].startswith("-"):
        return ""
    return launcher[1]
