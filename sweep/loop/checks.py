"""Checks before anything runs or is read: a night is never spent on a study that cannot work,
and looking at a study never creates one.

:func:`preflight` is what `sweep plan` shows and what `sweep run` (and every worker) checks
before its first launch: the space has valid configurations, the workload's prompt file
loads, every host can be reached and its launcher can run there, and the storage URL can be
used.
:func:`require_results` is what `sweep status`, `report` and `export` check first: the study
has run, and nothing is created to find out (nor is its folder required to be writable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweep.core.space import Plan, plan
from sweep.engines import rules_for
from sweep.exceptions import ConfigError, PromptFileError, StorageError, StudyFileError
from sweep.redact import redact_url
from sweep.store import check_storage_url, quiet_optuna, sqlite_file, stored_study_names
from sweep.study.model import HostSpec, Study

if TYPE_CHECKING:  # `sweep report` imports this module: not the benchmark's
    from sweep.bench.workload import Workload

EXCLUSIONS_SHOWN = 3  # reasons quoted when no configuration is valid


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the plan (valid and excluded configurations), the storage and
    the workload as built (its prompt files read once)."""

    plan: Plan
    storage: str
    workload: Workload


def preflight(
    study: Study, storage_url: str | None = None, *, hosts: Sequence[HostSpec] | None = None
) -> Preflight:
    """Check that ``study`` can run: valid configurations, prompts, hosts, storage. Creates
    nothing. ``hosts``: the hosts to check (default: all the study's).

    Raises:
        ConfigError: no valid configuration (the first exclusion reasons are quoted).
        StudyFileError: the workload's prompt file is missing or invalid (``[workload]
            prompts``, relative to the study file's folder).
        StudyFileError: also when ``[engine] launcher`` is missing or not executable on a host.
        ConfigError: an SSH host cannot be reached or logged into (one line per host).
        StorageError: the storage URL cannot be parsed, its driver is not installed, or an
            SQLite file's folder can neither be found nor created.
    """
    result = plan(study, rules_for(study))
    if not result.valid:
        raise _nothing_to_run(study, result)
    workload = _check_workload(study)
    from sweep.loop import wiring  # here: `sweep report` reads results without the launch stack

    # an unreachable host or a missing launcher would fail every launch the same way
    wiring.check_hosts(study, study.hosts if hosts is None else hosts)
    url = storage_url or study.storage
    check_storage_url(url)
    return Preflight(result, url, workload)


def _nothing_to_run(study: Study, result: Plan) -> ConfigError:
    reasons = sorted({e.reason for e in result.excluded})
    shown = "; ".join(reasons[:EXCLUSIONS_SHOWN])
    more = (
        f" (and {len(reasons) - EXCLUSIONS_SHOWN} more)" if len(reasons) > EXCLUSIONS_SHOWN else ""
    )
    return ConfigError(
        f"{study.path}: [space] has no valid configuration: all {len(result.excluded)} points "
        f"are excluded ({shown}{more}); see `sweep plan {study.path}`"
    )


def _check_workload(study: Study) -> Workload:
    """Load the prompt file and build the workload, as the first benchmark will."""
    from sweep.loop import wiring

    try:
        return wiring.workload_for(study)
    except PromptFileError as exc:
        missing = "no such file" in str(exc)
        hint = " (paths in a study file are relative to its folder)" if missing else ""
        raise StudyFileError(study.path, exc.key or "workload.prompts", f"{exc}{hint}") from exc


def setup_change(
    study: Study, storage_url: str | None = None, workload: Workload | None = None
) -> list[str]:
    """The keys whose change since the study's stored measurements ``sweep run`` would refuse
    (``[]``: never run, no fingerprint stored, or nothing changed). Reads only, creates
    nothing; storage that cannot be read counts as never run (the run says why).
    ``workload``: the study's, when already built (its prompts are fingerprinted)."""
    from sweep.loop import wiring
    from sweep.store import stored_fingerprint, stored_study
    from sweep.study.fingerprint import changed_keys, fingerprint

    url = storage_url or study.storage
    try:
        require_results(study, url)
        # sweep's reading storage: Optuna's own, from a bare URL, keeps its pooled
        # connections open after the call (two more per `sweep status` in one process)
        stored = stored_fingerprint(stored_study(url, study.name))
    except (StorageError, ConfigError, KeyError):
        return []
    if stored is None:
        return []
    built = workload or wiring.workload_for(study)
    return changed_keys(stored, fingerprint(study, built.prompts))


def setup_changed_error(study: Study, changed: list[str]) -> ConfigError:
    """What ``sweep run`` (and ``sweep plan``) say when the study file no longer matches."""
    from sweep.study.fingerprint import changed_text

    return ConfigError(
        f"{study.path}: study {study.name!r} was measured with another setup "
        f"(changed: {changed_text(changed)}); its results would mix — give the study a "
        "new name or another --storage, or run with --fresh-answer to keep the earlier "
        "trials out of the answer"
    )


def create_sqlite_folder(url: str) -> None:
    """Create an SQLite file's folder (``sweep run`` only; checked by :func:`preflight`)."""
    path = sqlite_file(url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"storage {redact_url(url)}: cannot create its folder: {exc}") from exc


def require_results(study: Study, storage_url: str | None = None) -> str:
    """Check that ``study`` has results to show, without creating a file, folder or table.

    Returns:
        The storage URL to read.

    Raises:
        StorageError: the study never ran there (no database file, or no such study), or
            the storage cannot be read.
    """
    url = storage_url or study.storage
    check_storage_url(url, writable=False)  # status, report and export only read
    hint = f"run `sweep run {study.path}` first"
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise StorageError(f"no results for study {study.name!r}: {path} does not exist; {hint}")
    quiet_optuna()
    names = stored_study_names(url)
    if study.name not in names:
        held = ", ".join(repr(n) for n in names) or "nothing"
        raise StorageError(
            f"no results for study {study.name!r} in {redact_url(url)} (it holds {held}); {hint}"
        )
    return url
