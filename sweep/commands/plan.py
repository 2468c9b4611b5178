"""What `sweep plan` shows: the valid configurations, the exclusions with reasons, the
launch commands, a time estimate and what no check here could refuse."""

from __future__ import annotations

from dataclasses import dataclass

from optuna.trial import TrialState

from sweep.bench.workload import Workload
from sweep.commands.plan_workload import workload_plan
from sweep.core.space import TrialConfig, plan
from sweep.engines import rules_for
from sweep.engines.flags import FlagTable
from sweep.engines.sglang_rules import BUILT_IN_ALGORITHMS, NO_ALGORITHM
from sweep.exceptions import StorageError
from sweep.loop import wiring
from sweep.server.engine_check import gate_study, stderr_progress
from sweep.store import read_records, sqlite_file, stored_study
from sweep.study.host_ports import clash_text, port_clashes
from sweep.study.model import Study

PLAN_GUESS_S = 300.0  # one trial, before anything was measured: load + capture + benchmark


@dataclass(frozen=True)
class PlanReport:
    valid: tuple[TrialConfig, ...]
    excluded: tuple[tuple[TrialConfig, str], ...]
    commands: tuple[str, ...]
    per_trial_s: float
    estimated_from: str
    engine_note: str = ""  # [engines] what the parser gate did (or why it could not run)
    guessed: bool = True  # per_trial_s is a guess: nothing of this study measured yet
    warnings: tuple[str, ...] = ()  # what may fail every launch, that nothing here could check
    workload: str = ""  # with workload axes: what each round sends
    workers: int = 1  # hosts (or Slurm pilots) measuring in parallel, each with its baseline
    workers_are: str = "hosts"  # or "pilots"

    @property
    def launches_each(self) -> int:
        """Launches per host: its baseline, then its share of the configurations."""
        return -(-len(self.valid) // self.workers) + 1

    @property
    def total_s(self) -> float:
        # each host's baseline comes first (and again every K trials); hosts run in parallel
        return self.per_trial_s * self.launches_each


def plan_report(
    study: Study, *, gate: bool = False, workload: Workload | None = None
) -> PlanReport:
    """The valid configurations, the exclusions with reasons, commands and a time estimate.

    Args:
        study: the study.
        gate: run the engine's own parser over every planned command on the study's
            (first) host, and exclude what it rejects (``sweep plan`` does).
    """
    rules = rules_for(study)
    result = plan(study, rules)
    adapter = wiring.adapter_for(study, study.host)
    note, validated = "", False
    if gate:  # [engines] the parser gate; rejected configurations become exclusions
        with wiring.open_host(study.host) as executor:
            valid = {c.key(): c for c in result.valid}
            check = gate_study(
                executor,
                study,
                adapter,
                valid,
                wiring.deployment_for(study),
                progress=stderr_progress,
            )
        result, note, validated = plan(study, check.gate(rules)), check.note, check.validated
    config = wiring.deployment_for(study)
    commands = tuple(adapter.command(config, c).shell() for c in result.valid)
    per_trial, source, guessed = _per_trial_estimate(study)
    excluded = tuple(
        (e.requested, e.reason + (f" (same as {e.same_as})" if e.same_as else "")
         + (f" [{e.rule}]" if e.rule else ""))
        for e in result.excluded
    )  # fmt: skip
    warnings = unchecked(study, adapter.known_flags(), validated=validated) if gate else ()
    mix, thin = workload_plan(study, workload)
    return PlanReport(
        result.valid, excluded, commands, per_trial, source, note, guessed,
        (*_shared_local_ports(study), *warnings, *thin), mix, workers=_workers(study),
        workers_are="pilots" if study.slurm is not None else "hosts",
    )  # fmt: skip


def _shared_local_ports(study: Study) -> tuple[str, ...]:
    """Local hosts with one server port: `sweep run` refuses them (it starts every worker on
    this machine); each host's `sweep worker` on its own machine is fine."""
    clashes = port_clashes(study.hosts, study.engine.port, local_here=True)
    return tuple(
        f"{clash_text(study.hosts, study.engine.port, pair)}. `sweep run` refuses this; "
        "started each on its own machine (`sweep worker --host NAME`), they are fine"
        for pair in clashes
    )


def _workers(study: Study) -> int:
    """How many hosts measure at once: the Slurm pilots, else the hosts."""
    return study.slurm.nodes if study.slurm is not None else len(study.hosts)


def unchecked(study: Study, known: FlagTable, *, validated: bool) -> tuple[str, ...]:
    """What would fail every launch that no check here could refuse: an SGLang algorithm
    that is not built in (its parser has no choices), and, where the engine's own parser
    could not be run, flags that are not in sweep's list of the engine's flags."""
    out = []
    algorithm = study.engine.algorithm
    if study.engine.name == "sglang" and algorithm not in BUILT_IN_ALGORITHMS:
        names = ", ".join(sorted(BUILT_IN_ALGORITHMS - {NO_ALGORITHM}))
        out.append(
            f"[engine] algorithm {algorithm!r} is not one of SGLang's built-in algorithms "
            f"({names}): unless a plugin registers it, every launch will fail "
            '("Unknown speculative algorithm name")'
        )
    if not validated:
        flags = {f for f, _ in study.engine.flags} | {f for f, _ in study.space.flags}
        unknown = sorted(f for f in flags if f not in known.kinds and "." not in f)
        if unknown:
            out.append(
                f"{', '.join(unknown)}: not in {known.source}, and the "
                "engine's own parser could not be run here: unless the build has them, every "
                "launch with them will fail (the first one will say)"
            )
    return tuple(out)


def _per_trial_estimate(study: Study) -> tuple[float, str, bool]:
    """Seconds per launch, where that comes from, and whether it is a guess."""
    guess = PLAN_GUESS_S, f"a guess of {PLAN_GUESS_S:.0f} s per trial: nothing measured yet", True
    url = study.storage
    path = sqlite_file(url) if url.startswith("sqlite:") else None  # x.db of x.db?timeout=5
    if path is not None and not path.exists():
        return guess  # do not create a database just to plan
    try:
        optuna_study = stored_study(url, study.name)
    except (KeyError, StorageError):  # no such study (yet), or no database
        return guess
    totals = [
        r.total_s
        for r in read_records(optuna_study, states=(TrialState.COMPLETE,))
        if r.total_s is not None
    ]
    if not totals:
        return guess
    mean = sum(totals) / len(totals)
    return mean, f"the mean of {len(totals)} measured trials", False
