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

_FIND_SPEC = (
    "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 6)"
)
"""Python: exit 6 when a top-level package cannot be found (it is located, never imported)."""

_SCRIPT = (
    'w="$1"; s="$2"; m="$3"; f="$4"; '
    'case "$w" in */*) [ -e "$w" ] || exit 3; { [ -x "$w" ] && [ ! -d "$w" ]; } || exit 4;; '
    '*) command -v "$w" >/dev/null 2>&1 || exit 3;; esac; '
    'if [ -n "$s" ]; then [ -r "$s" ] && [ ! -d "$s" ] || exit 5; fi; '
    'if [ -n "$m" ]; then "$w" -c "$f" "$m" >/dev/null 2>&1; [ $? -ne 6 ] || exit 6; fi'
)
"""Shell: exit 3 (not found), 4 (not executable), 5 (the script it runs cannot be read),
6 (the package ``python -m`` runs is not installed for that interpreter)."""

_PROBLEMS = {
    3: "{word!r} is not found (no such file, or not on PATH)",
    4: "{word!r} is not executable",
    5: "{script!r}, the script it runs, cannot be opened",
    6: "{word!r} cannot find the package {module!r} (`python -m {module}`: not installed "
    "for that interpreter?)",
}


def launcher_problem(
    executor: Executor, launcher: Sequence[str], env: Mapping[str, str] | None = None
) -> str | None:
    """What stops ``launcher`` from running on the executor's host, or ``None`` if nothing.

    Checks the first word (found on ``PATH``, or an executable file); for
    ``python SCRIPT``, that the script can be read; for ``python -m PACKAGE.MODULE``,
    that the interpreter finds ``PACKAGE`` (located, not imported: importing SGLang
    takes seconds and may touch the GPUs). ``env`` is the server's
    environment (its ``PATH`` is the one the launch uses).

    Raises:
        ExecutorError: the host cannot be reached (the caller decides what that means).
    """
    if not launcher:
        return "the launcher is empty"
    word = launcher[0]
    script = _script_of(launcher)
    module = _package_of(launcher)
    argv = ("/bin/sh", "-c", _SCRIPT, "sweep-launcher-check", word, script, module, _FIND_SPEC)
    # the environment's PATH (and PYTHONPATH) are the ones the launch uses
    result = executor.run(argv, timeout=CHECK_TIMEOUT_S, env=dict(env or {}))
    template = _PROBLEMS.get(result.exit_code)
    if template is None:
        return None
    return f"{template.format(word=word, script=script, module=module)} on {executor.host}"


def _script_of(launcher: Sequence[str]) -> str:
    """The script a ``python SCRIPT ...`` launcher runs; ``""`` for ``python -m`` or others."""
    name = launcher[0].rsplit("/", 1)[-1]
    if len(launcher) < 2 or not name.startswith("python") or launcher[1].startswith("-"):
        return ""
    return launcher[1]


def _package_of(launcher: Sequence[str]) -> str:
    """The top-level package a ``python -m PACKAGE.MODULE ...`` launcher runs; ``""`` else."""
    name = launcher[0].rsplit("/", 1)[-1]
    if len(launcher) < 3 or not name.startswith("python") or launcher[1] != "-m":
        return ""
    return launcher[2].split(".", 1)[0]
