"""What `sweep status --trial` shows: one stored trial in full — why it did not measure,
its command and its server logs."""

from __future__ import annotations

from sweep.core.labels import launch_name, log_stem, parse_trial_label, trial_label
from sweep.core.records import TrialRecord
from sweep.exceptions import SweepError
from sweep.store import baseline_study_name, read_records, stored_study
from sweep.study.model import Study


def load_trial(study: Study, storage_url: str, label: str) -> TrialRecord:
    """The stored trial ``label`` names as `sweep status` numbers it (``7``, ``b0``).

    Raises:
        SweepError: the label is not a trial number, or no such trial is stored.
    """
    parsed = parse_trial_label(label)
    if parsed is None:
        raise SweepError(f"--trial {label!r}: expected a trial number as `sweep status` shows "
                         "it (7, or b0 for a baseline)")  # fmt: skip
    companion, number = parsed
    name = baseline_study_name(study.name) if companion else study.name
    try:
        records = read_records(stored_study(storage_url, name))
    except KeyError:
        records = []
    found = [r for r in records if r.number == number]
    if not found:
        shown = ", ".join(trial_label(r.kind, r.number) for r in records) or "none"
        raise SweepError(f"no trial {label} in study {name!r} (stored: {shown})")
    return found[0]


def trial_detail(record: TrialRecord) -> list[str]:
    """Everything stored about why ``record`` did not measure (or what it measured): phase,
    kind, transient or not, the message, the launch command, the log and its stored tail."""
    lines = [
        f"{launch_name(record.kind, record.number)}: {record.state.value}"
        + (f" ({record.config.label()})" if record.config else ""),
        *_field("host", record.host),
        *_field("attempt", record.attempt),
    ]
    failure = record.failure
    objective = None if record.objective is None else f"{record.objective:.2f}"
    if failure is None:
        lines += [*_field("objective", objective), *_field("command", record.command)]
        return [*lines, *_field("server log", record.log)]
    nature = (
        "deterministic: this configuration cannot work (infeasible, never retried)"
        if failure.deterministic
        else "transient: another launch may work"
    )
    message = failure.message.splitlines() or [""]
    lines += [
        f"failure: {failure.kind}, {nature}",
        *_field("phase reached", failure.phase),
        *_field("exit code", failure.exit_code),
        f"message: {message[0]}",
        *_field("command", failure.command or record.command),
        *_field("server log", record.log and f"{record.log} (on {failure.host or record.host})"),
        *_field("earlier attempts' logs", ", ".join(earlier_logs(record))),
    ]
    if failure.log_tail:
        lines.append(f"last {len(failure.log_tail)} log lines (stored with the trial):")
        lines += [f"  {line}" for line in failure.log_tail]
    else:  # a failure without a server log (benchmark, interrupt): its whole message
        lines += [f"  {line}" for line in message[1:]]
    return lines


def earlier_logs(record: TrialRecord) -> list[str]:
    """The server logs of a retried launch's earlier attempts, beside its last one's."""
    attempts = record.attempt or 1
    suffix = f"{log_stem(record.kind, record.number, attempts)}.log"
    if attempts < 2 or not record.log or not record.log.endswith(suffix):
        return []
    folder = record.log[: -len(suffix)]
    return [f"{folder}{log_stem(record.kind, record.number, n)}.log" for n in range(1, attempts)]


def _field(name: str, value: object) -> list[str]:
    return [] if value is None or value == "" else [f"{name}: {value}"]
