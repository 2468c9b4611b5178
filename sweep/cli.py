"""The ``sweep`` command line: thin commands over library functions.

Every command parses its options, calls one library function and renders the
result. A :class:`~sweep.exceptions.SweepError` becomes a one-line message and
exit code 1 in :func:`main`; usage errors exit 2.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from sweep import __version__
from sweep.exceptions import Interrupted, SweepError
from sweep.study.model import DEFAULT_WORKDIR

if TYPE_CHECKING:
    from sweep.commands.launch import LaunchReport
    from sweep.commands.status import StatusReport
    from sweep.loop.context import RunOptions, RunSummary
    from sweep.server.readiness import Event
    from sweep.study.model import Study

app = typer.Typer(
    name="sweep",
    help="Find the fastest speculative-decoding settings for an LLM inference server.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True, soft_wrap=True)  # one line per message: a log grep gets it whole
out = Console(width=None if sys.stdout.isatty() else 160)


def _version(value: bool) -> None:
    if value:
        print(f"sweep {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """sweep: speculative-decoding sweeps for SGLang and vLLM."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def sim(ctx: typer.Context) -> None:
    """Run the simulated SGLang server; takes SGLang's launch flags (see `sweep sim --help`).

    Example: sweep sim --model-path kimi --tp-size 8 --port 30000
    --speculative-algorithm EAGLE3 --speculative-num-steps 2 --speculative-eagle-topk 1
    --speculative-num-draft-tokens 3
    """
    from sweep.sim.server import main as sim_main

    raise typer.Exit(sim_main(ctx.args))


@app.command()
def bench(
    url: str = typer.Option(..., help="The running server, e.g. http://127.0.0.1:30000."),
    concurrency: str = typer.Option("1", help="Comma-separated concurrency levels, e.g. 1,4,16."),
    output_len: int = typer.Option(500, help="Tokens generated per request (ignore_eos is on)."),
    prompts: str | None = typer.Option(
        None, help='JSONL prompt file ("prompt" or ShareGPT "conversations"); default: shipped.'
    ),
    target_ci: float = typer.Option(1.0, help="Stop when the 95 % CI is ± this % of the mean."),
    max_rounds: int = typer.Option(50, help="Most measured rounds per level (at least 2)."),
    max_time: float = typer.Option(600.0, help="Most seconds of measured rounds per level."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Benchmark a running SGLang server: throughput, accept length, latency, 95 % CIs.

    Example: sweep bench --url http://127.0.0.1:30000 --concurrency 1,4,16 --output-len 500
    """
    from sweep.bench import BenchmarkSettings, StopRule, make_workload, run_benchmark
    from sweep.bench.render import progress_line, show
    from sweep.bench.result import BenchmarkResult
    from sweep.exceptions import BenchmarkError

    if max_rounds < 2:
        raise typer.BadParameter(
            "need at least 2 for a confidence interval", param_hint="--max-rounds"
        )
    workload = make_workload(prompts, output_len=output_len, concurrency=_ints(concurrency))
    rule = StopRule(
        target_precision=target_ci / 100,
        min_rounds=min(5, max_rounds),
        max_rounds=max_rounds,
        max_time_s=max_time,
    )
    try:
        result = run_benchmark(
            url,
            workload,
            BenchmarkSettings(stop=rule),
            on_round=lambda p: err.print(progress_line(p)),
        )
    except BenchmarkError as exc:
        if isinstance(exc.partial, BenchmarkResult):
            show(exc.partial, as_json=as_json, out=Console(), err=err)
        raise
    show(result, as_json=as_json, out=Console(), err=err)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"expected integers like 1,4,16, got {text!r}") from exc


@app.command()
def launch(
    params: str = typer.Option(
        ..., help="num_steps=N,eagle_topk=K,num_draft_tokens=D[,draft_tp=T], or baseline."
    ),
    study_file: str = typer.Option(
        "", "--study", help="Take engine, model, host and flags from this study file."
    ),
    model_path: str = typer.Option("", help="Target model path or hub id (without --study)."),
    tp: int = typer.Option(0, help="Target tensor-parallel size (without --study)."),
    port: int = typer.Option(30000, help="HTTP port of the server."),
    engine: str = typer.Option("sglang", help="The engine (without --study), e.g. sglang or vllm."),
    launcher: str = typer.Option(
        "",
        help='How to start the engine: "sglang serve", "sweep sim"... '
        "(default: python -m sglang.launch_server, or vLLM's api_server)",
    ),
    host: str = typer.Option("", help="SSH host: ssh://user@host:port or a ~/.ssh/config alias."),
    extra_flag: Annotated[
        list[str] | None,
        typer.Option(help='More server flags, e.g. "--mem-fraction-static 0.85" (repeatable).'),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for the server's environment (repeatable)."),
    ] = None,
    algorithm: str = typer.Option("EAGLE3", help="Speculative algorithm."),
    draft_model_path: str = typer.Option("", help="Draft model, if the target needs one."),
    max_running_requests: int = typer.Option(48, help="Always passed to the server explicitly."),
    cuda_graph_max_bs: int = typer.Option(0, help="Largest CUDA-graph decode batch (0: default)."),
    bind_host: str = typer.Option("127.0.0.1", help="Server address (0.0.0.0 on a remote host)."),
    engine_version: str = typer.Option("", help="Pin the engine version (default: read it)."),
    draft_tp_flag: str = typer.Option("", help="A patched build's flag for the draft TP size."),
    python: str = typer.Option("", help="Interpreter that imports the engine on the host."),
    timeout: float = typer.Option(900.0, help="Start-up timeout, seconds."),
    workdir: str = typer.Option(DEFAULT_WORKDIR, help="Folder for server logs and PGID files."),
    ssh_key: str = typer.Option("", help="Private key for the SSH host."),
    ssh_config: str = typer.Option("", help="SSH config file instead of ~/.ssh/config."),
    known_hosts: str = typer.Option("", help="Extra known_hosts file for the SSH host."),
    host_key_check: bool = typer.Option(True, help="Check the SSH host key (off: any key)."),
) -> None:
    """Start one configuration, wait until ready, print what it resolved, stop it.

    Example: sweep launch --launcher "sweep sim" --model-path kimi --tp 8 --port 30000
    --params num_steps=2,eagle_topk=1,num_draft_tokens=3

    Example: sweep launch --study studies/demo-sim.toml --params baseline
    """
    from sweep.commands.launch import launch_study
    from sweep.core.space import TrialConfig
    from sweep.engines import Deployment, registry

    if study_file:
        from sweep.study import load_study

        report = launch_study(load_study(study_file), TrialConfig.parse(params), on_event=_show)
        _render_launch(report)
        return
    if not model_path or not tp:
        raise typer.BadParameter("give --study FILE, or --model-path and --tp")
    from sweep.commands.launch import launch_once
    from sweep.server.executor import open_executor
    from sweep.server.lifecycle import LifecycleOptions

    target = None
    if host:
        from sweep.server.executor.ssh import SSHTarget

        target = SSHTarget.parse(
            host,
            key_filename=ssh_key or None,
            known_hosts=known_hosts or None,
            check_host_key=host_key_check,
            ssh_config_path=ssh_config or None,
        )
    if engine not in registry.ENGINES:
        known = ", ".join(registry.ENGINES)
        raise typer.BadParameter(f"expected one of {known}, got {engine!r}", param_hint="--engine")
    kind = registry.ENGINES[engine]
    settings = registry.AdapterSettings(
        tuple(shlex.split(launcher)) or kind.launcher,
        engine_version or None,
        python or None,
        draft_tp_flag,
    )
    adapter = kind.adapter(settings)
    deployment = Deployment(
        model_path=model_path,
        tp_size=tp,
        port=port,
        bind_host=bind_host,
        algorithm=algorithm,
        draft_model_path=draft_model_path or None,
        max_running_requests=max_running_requests,
        cuda_graph_max_bs=cuda_graph_max_bs or None,
        extra_flags=tuple(word for flag in extra_flag or () for word in shlex.split(flag)),
        env=tuple(_key_value(item) for item in env or ()),
    )
    options = LifecycleOptions(workdir=workdir, startup_timeout_s=timeout)
    config = TrialConfig.parse(params)
    with open_executor(target) as executor:
        report = launch_once(executor, adapter, deployment, config, options=options, on_event=_show)
    _render_launch(report)


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
    return key, value


def _show(event: Event) -> None:
    from sweep.redact import redact_message

    message = escape(redact_message(event.message))
    err.print(f"[dim]\\[{event.elapsed_s:7.1f} s][/dim] {message}", highlight=False)


def _render_launch(report: LaunchReport) -> None:
    from sweep.redact import redact_command, redact_data

    print(f"host: {report.host}\nurl: {report.url}\ncommand: {redact_command(report.command)}")
    print(f"engine: {report.engine.version} ({report.engine.source})")
    print("resolved:")
    for key, value in redact_data(report.resolved.as_dict()).items():
        print(f"  {key}: {value}")
    print("phases (s after launch):")
    for phase, seconds in report.phase_s.items():
        print(f"  {phase}: {seconds:.2f}")
    if report.preflight is not None:
        print(f"preflight: {report.preflight.duration_s:.2f} s")
    if report.stop is not None:
        stop = report.stop
        print(f"stop: {stop.duration_s:.2f} s ({stop.signal}, port free: {stop.port_free})")


@app.command()
def run(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    deadline: str = typer.Option(
        "", help='Local time HH:MM (or "tomorrow HH:MM") by which the last trial ends.'
    ),
    budget: str = typer.Option("", help='Wall time for this run, e.g. "8h" or "90m".'),
    n_trials: int = typer.Option(
        0,
        help="Stop once the study has this many configurations settled, earlier runs' "
        "included: measured, infeasible or failed for good (baselines, duplicates and "
        "exclusions do not count).",
    ),
    storage: str = typer.Option("", help="Storage URL instead of the study's."),
    fresh_answer: bool = typer.Option(
        False,
        "--fresh-answer",
        help="The study changed since its results were measured (deployment, workload, "
        "benchmark, objective): keep the earlier trials out of the search and the answer "
        "instead of refusing to resume.",
    ),
) -> None:
    """Run or resume a study: baseline, then trials until done, out of time or Ctrl-C.

    Example: sweep run studies/demo-sim.toml --budget 10m
    """
    from sweep.loop.start import run_study
    from sweep.study import load_study

    options = _run_options(deadline, budget, n_trials, storage, fresh_answer=fresh_answer)
    study = load_study(study_file)
    with _storage_errors(storage or study.storage):
        summary = run_study(study, options)
    out.print(f"stopped: {summary.stop_reason}", markup=False)
    out.print(
        f"measured {summary.measured}, infeasible {summary.infeasible}, failed "
        f"{summary.failed}, duplicates answered from storage {summary.duplicates}, "
        f"excluded {summary.excluded}, baselines {summary.baselines}"
    )
    out.print(f"best measured configuration: {summary.best}", markup=False)
    if summary.answer:
        out.print(f"{summary.answer_heading}: {summary.answer}", markup=False)
    if study.workload.has_axes:  # where the best setting changes with content or context
        out.print(f"by content and context: {_workload_line(study, storage)}", markup=False)
    out.print(
        f"results: {_url(summary.storage)} (study {summary.study}); "
        f"see `sweep status {study_file}`",
        markup=False,
    )
    _exit_for(summary)


@app.command()
def worker(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    host: str = typer.Option(..., help="The name of the study host this worker measures on."),
    storage: str = typer.Option("", help="The shared study's storage URL (PostgreSQL)."),
    deadline: str = typer.Option(
        "", help='Local time HH:MM (or "tomorrow HH:MM") by which the last trial ends.'
    ),
    budget: str = typer.Option("", help='Wall time for this worker, e.g. "8h" or "90m".'),
    n_trials: int = typer.Option(
        0, help="Stop once the study has this many configurations settled (as for `sweep run`)."
    ),
    heartbeat: int = typer.Option(10, help="Seconds between a running trial's heartbeats."),
    grace: int = typer.Option(60, help="Seconds without heartbeat before a trial is reaped."),
    summary_json: str = typer.Option("", hidden=True, help="Write the summary here (JSON)."),
    parent: int = typer.Option(
        0, hidden=True, help="Stop as on Ctrl-C once this process (`sweep run`) is gone."
    ),
    fresh_answer: bool = typer.Option(
        False,
        "--fresh-answer",
        help="As for `sweep run`: a changed study's earlier trials "
        "are kept out of the search and the answer.",
    ),
) -> None:
    """Join a shared study as one more worker, measuring on one of its hosts.

    Example: sweep worker studies/kimi.toml --host gpu-node-2
    --storage postgresql+psycopg://sweep@db-host/sweep
    """
    import dataclasses
    import json

    from sweep.loop.fleet import stop_when_parent_dies
    from sweep.loop.start import run_worker
    from sweep.loop.worker import SharedOptions
    from sweep.study import load_study

    shared = SharedOptions(heartbeat_s=heartbeat, grace_s=grace)
    options = _run_options(
        deadline, budget, n_trials, storage, shared=shared, fresh_answer=fresh_answer
    )
    study = load_study(study_file)
    with (
        _storage_errors(storage or study.storage),
        stop_when_parent_dies(parent or None, lambda text: out.print(text, markup=False)),
    ):
        summary = run_worker(study, host, options)
    if summary_json:
        with open(summary_json, "w") as file:
            json.dump(dataclasses.asdict(summary) | {"storage": _url(summary.storage)}, file)
    out.print(
        f"{host} stopped: {summary.stop_reason}; measured {summary.measured} here; "
        f"best in the study: {summary.best}",
        markup=False,
    )
    _exit_for(summary)


def _workload_line(study: Study, storage: str | None) -> str:
    from sweep.commands.status import load_status
    from sweep.exceptions import StorageError

    try:
        return load_status(study, storage).workload or "nothing measured yet"
    except (KeyError, StorageError):
        return "nothing measured yet"


def _exit_for(summary: RunSummary) -> None:
    """Warnings on stderr; exit 1 when the run stopped for a reason the user must act on."""
    for warning in summary.warnings:
        err.print(f"warning: {escape(warning)}")
    if summary.failed_run:
        err.print(f"error: {escape(summary.error or summary.stop_reason)}")
        raise typer.Exit(1)


def _run_options(
    deadline: str, budget: str, n_trials: int, storage: str, **extra: Any
) -> RunOptions:
    """``run`` and ``worker``'s shared options, checked (a bad value is a usage error)."""
    from sweep.loop.context import RunOptions
    from sweep.study.parse import (
        DURATION_EXPECTED,
        TIME_OF_DAY_EXPECTED,
        duration_seconds,
        is_time_of_day,
    )

    if deadline and not is_time_of_day(deadline):
        raise typer.BadParameter(
            f"expected {TIME_OF_DAY_EXPECTED}, got {deadline!r}", param_hint="--deadline"
        )
    budget_s = duration_seconds(budget) if budget else None
    if budget and budget_s is None:
        raise typer.BadParameter(
            f"expected {DURATION_EXPECTED}, got {budget!r}", param_hint="--budget"
        )
    return RunOptions(
        deadline=deadline or None,
        budget_s=budget_s,
        n_trials=n_trials or None,
        storage_url=storage or None,
        **extra,
    )


@app.command()
def schedule(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    out: str = typer.Option("", help="Output folder (default: ./<study name>-schedule)."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Relaunch the schedule beside the best static configuration, the engine's "
        "built-in schedule and no speculation, interleaved, and print each difference with "
        "its interval; exit 1 when nothing could be compared.",
    ),
    storage: str = typer.Option("", help="Storage URL instead of the study's."),
    context: int | None = typer.Option(
        None,
        "--context",
        help="The context band ([workload] input_len level) the engine's files are for; "
        "default: the level with the most traffic weight (the first on a tie).",
        show_default=False,
    ),
) -> None:
    """Export the per-concurrency schedule in the engine's own format; --verify relaunches it.

    From the measured levels: per level the confirmed best steps (fewer steps on a tie only
    when established; 0 where no speculation wins), as SGLang's adaptive config or vLLM's
    speculative config, for one context band; schedule-table.json holds every band's.

    Example: sweep schedule studies/workload-sim.toml --context 2048
    """
    from sweep.files import check_writable_folder
    from sweep.loop.verify_schedule import make_schedule
    from sweep.study import load_study

    study = load_study(study_file)
    if context is not None:
        from sweep.core.schedule_table import context_problem

        problem = context_problem(study.workload.input_len, context)
        if problem:
            raise typer.BadParameter(f"{study_file}: {problem}", param_hint="--context")
    folder = out or f"{study.name}-schedule"
    check_writable_folder(folder)  # a read-only or full folder: one line now, before any launch
    result = make_schedule(
        study, out=folder, verify=verify, storage_url=storage or None, context=context
    )
    print(result.export.table)
    print(f"launch command:\n  {result.export.command}\n")
    for path in result.export.files:
        print(f"wrote {path}")
    for record in result.verified:
        name = record.schedule.get("name", "schedule")
        print(f"verified {name}: trial {record.number} of the companion study, {record.state}")
    if result.verdict is not None:
        if not result.verdict.compared:  # nothing measured beside the schedule: not verified
            typer.echo(result.verdict.text, err=True)
            raise typer.Exit(1)
        print(result.verdict.text)
    if result.note:
        print(result.note)


@app.command()
def plan(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    commands: bool = typer.Option(False, "--commands", help="Print every launch command."),
) -> None:
    """Check a study and show what it will launch, what it excludes and why, and how long.

    Example: sweep plan studies/kimi-k2.5-eagle3.toml --commands
    """
    from sweep.commands.plan import plan_report
    from sweep.commands.plan_time import (
        confirmation_plan,
        estimate_text,
        limits_plan,
        slurm_plan,
    )
    from sweep.loop.checks import preflight, setup_change, setup_changed_error
    from sweep.study import load_study

    study = load_study(study_file)
    # no valid configuration, a missing prompt file, a bad storage URL
    checked = preflight(study)
    report = plan_report(study, gate=True, workload=checked.workload)
    if commands:
        from sweep.redact import redact_command

        for line in report.commands:
            print(redact_command(line))  # secrets stay in the study file
        return
    if report.engine_note:
        out.print(report.engine_note, markup=False)
    # one plain write per list: rich renders a line in ~2 ms, minutes for a 100,000-point plan
    print(f"{len(report.valid)} valid configurations:", flush=True)
    print("".join(f"  {config.label()}\n" for config in report.valid), end="", flush=True)
    if report.excluded:
        print(f"{len(report.excluded)} excluded:")
        print("".join(f"  {c.label()}: {reason}\n" for c, reason in report.excluded), end="")
    out.print(estimate_text(report), markup=False)
    if report.workload:
        out.print(report.workload, markup=False)
    job, job_warning = slurm_plan(study, time.time())
    for warning in (*report.warnings, *([job_warning] if job_warning else [])):
        out.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    out.print(confirmation_plan(study, report), markup=False)
    out.print(limits_plan(study, report), markup=False)
    if job:
        out.print(job, markup=False)
    out.print(f"sampler: {study.sampler}; storage: {_url(study.storage)}", markup=False)
    changed = setup_change(study, workload=checked.workload)
    if changed:  # `sweep run` would refuse at once: the check before a night says so
        raise setup_changed_error(study, changed)


@app.command()
def status(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    storage: str = typer.Option("", help="Storage URL instead of the study's."),
    trial: str = typer.Option(
        "", help="One trial's full detail (7, or b0 for a baseline): why it failed, its log."
    ),
) -> None:
    """Show every trial: state, configuration, objective with CI, accept length, failure.

    Example: sweep status studies/demo-sim.toml; sweep status studies/demo-sim.toml --trial 7
    """
    from sweep.commands.status import load_status
    from sweep.commands.trial_detail import load_trial, trial_detail
    from sweep.core.labels import parse_trial_label
    from sweep.loop.checks import require_results
    from sweep.study import load_study

    study = load_study(study_file)
    if trial and parse_trial_label(trial) is None:
        raise typer.BadParameter("expected a trial number as the table shows it: 7, or b0")
    with _reading(study):
        url = require_results(study, storage or None)  # never-run: says so, creates nothing
        if trial:
            with _storage_errors(url, "cannot read"):
                record = load_trial(study, url, trial)
            for line in trial_detail(record):
                out.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        with _storage_errors(url, "cannot read"):
            report = load_status(study, url)
        _render_status(study_file, study, url, report)


def _render_status(study_file: str, study: Study, url: str, report: StatusReport) -> None:
    from rich.table import Table

    from sweep.loop.checks import setup_change, setup_changed_error
    from sweep.store.claims import live_run

    table = Table(title=escape(f"{report.study} ({_url(report.storage)})"))
    for column in (
        "#",
        "kind",
        "state",
        "configuration",
        study.objective.value_name,
        "± 95%",
        "accept",
        "speedup",
        "note",
    ):
        table.add_column(column)
    several = len(study.hosts) > 1 or len({r.host for r in report.rows if r.host}) > 1
    if several:  # a fleet, or Slurm pilots each on their own node
        table.add_column("host")
    for r in report.rows:
        table.add_row(
            r.shown,
            r.kind,
            r.state,
            escape(r.label),
            _num(r.value),
            _num(r.half_width),
            _num(r.accept_length),
            _num(r.speedup, "x"),
            escape(r.failure + (" drift" if r.drift else "")),
            *([r.host] if several else []),
        )
    out.print(table)
    if not report.rows:
        out.print(f"no trial stored yet: `sweep run {study_file}` measures the first ones")
    failed = [r for r in report.rows if r.state in ("failed", "infeasible")]
    if failed:
        last = failed[-1]
        out.print(
            f"why {last.kind} {last.shown} failed, and where its full server log is: "
            f"`sweep status {study_file} --trial {last.shown}`",
            markup=False,
        )
    if report.baseline:
        on = f" on {report.baseline.host}" if several and report.baseline.host else ""
        out.print(f"baseline ({report.baseline.shown}{on}): {_num(report.baseline.value)}")
    if report.best:
        best, mean = report.best, report.best_mean
        figure = f"{_num(best.value)} ± {_num(best.half_width)}"
        speedup = best.speedup
        if mean is not None and mean.launches_text():  # relaunched: all its launches count
            figure, speedup = f"{mean.mean:.2f}, {mean.launches_text()}", mean.speedup
        out.print(
            f"best measured configuration: trial {best.number} {escape(best.label)}: "
            f"{figure} ({_num(speedup, 'x')} baseline)"
        )
    if report.answer:
        out.print(f"{report.answer_heading}: {escape(report.answer)}")
    if report.workload:
        out.print(f"by content and context: {escape(report.workload)}")
    for warning in report.drift_warnings:
        out.print(f"[yellow]drift:[/yellow] {escape(warning)}")
    earlier = sum(1 for r in report.rows if r.earlier)
    if earlier:
        out.print(
            f"{earlier} trials and baselines marked 'earlier setup' were measured before the "
            "study changed (--fresh-answer): kept out of the best and the answer"
        )
    changed = setup_change(study, url)
    if changed:
        out.print(f"[yellow]warning:[/yellow] {escape(str(setup_changed_error(study, changed)))}")
    running = [r.shown for r in report.rows if r.state == "running"]
    if running and live_run(url, study.name) is False:
        out.print(
            f"[yellow]note:[/yellow] {', '.join(running)} marked running, but no `sweep run` "
            "holds the study (was it killed?): the next `sweep run` marks "
            f"{'them' if len(running) > 1 else 'it'} failed (orchestrator_died), measures "
            "again and stops a server left behind"
        )


@app.command()
def report(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    out: str = typer.Option("", help="Output folder (default: ./<study name>-report)."),
    format: str = typer.Option("png", help="Figure formats, comma-separated: png,svg,pdf."),
    storage: str = typer.Option("", help="Storage URL instead of the study's."),
) -> None:
    """Write a study's report: HTML, Markdown, figures, CSV/Parquet trials, summary JSON.

    Example: sweep report studies/demo-sim.toml --out reports/demo-sim --format png,svg
    """
    _collect_no_garbage()
    from analysis.report.write import write_report  # lazily: pandas and matplotlib load only here
    from sweep.loop.checks import require_results
    from sweep.study import load_study

    study = load_study(study_file)
    with _reading(study):
        require_results(study, storage or None)
        files = write_report(
            study_file,
            out or f"{study.name}-report",
            formats=format.split(","),
            storage=storage or None,
        )
    print(
        f"report: {files.html}\nmarkdown: {files.markdown}\n{len(files.figures)} figure "
        f"files and {len(files.data)} data files in {files.folder}"
    )


@app.command()
def compare(
    study_files: Annotated[list[str], typer.Argument(help="Two or more study files.")],
    out: str = typer.Option(..., help="Output folder."),
    format: str = typer.Option("png", help="Figure formats, comma-separated: png,svg,pdf."),
) -> None:
    """Compare studies (the first is the reference): best of each, regressions, curves.

    Example: sweep compare studies/kimi-v1.toml studies/kimi-v2.toml --out reports/v1-vs-v2
    """
    _collect_no_garbage()
    from analysis.report.write import write_comparison
    from sweep.loop.checks import require_results
    from sweep.study import load_study

    studies = [load_study(study_file) for study_file in study_files]
    with _reading(*studies):
        for study in studies:
            require_results(study)
        files = write_comparison(study_files, out, formats=format.split(","))
    print(f"comparison: {files.html}\nmarkdown: {files.markdown}")


@app.command()
def export(
    study_file: str = typer.Argument(..., help="The study file (TOML)."),
    format: str = typer.Option(
        "", help="csv or parquet (default: the --out file's suffix, else csv)."
    ),
    out: str = typer.Option("", help="Output file (default: ./<study name>-trials.<format>)."),
    storage: str = typer.Option("", help="Storage URL instead of the study's."),
) -> None:
    """Export every trial as one row per trial and concurrency level (CSV or Parquet).

    Example: sweep export studies/demo-sim.toml --format parquet --out demo.parquet
    """
    from analysis.report.write import EXPORT_FORMATS, export_trials
    from sweep.loop.checks import require_results
    from sweep.study import load_study

    suffix = Path(out).suffix.lstrip(".").lower()
    format = format or (suffix if suffix in EXPORT_FORMATS else "csv")
    if format not in EXPORT_FORMATS:
        raise typer.BadParameter(f"expected csv or parquet, got {format!r}", param_hint="--format")
    if suffix in EXPORT_FORMATS and suffix != format:  # a .parquet file holding CSV misleads
        raise typer.BadParameter(
            f"--out {out!r} names a .{suffix} file but --format is {format}", param_hint="--out"
        )
    study = load_study(study_file)
    with _reading(study):
        require_results(study, storage or None)
        path = export_trials(
            study_file, out or f"{study.name}-trials.{format}", format, storage=storage or None
        )
    print(f"wrote {path}")


def _url(url: str) -> str:
    from sweep.redact import redact_url

    return redact_url(url)


def _storage_errors(url: str, doing: str = "cannot use") -> contextlib.AbstractContextManager[None]:
    """A database error in the block (a read-only or full database) is a one-line StorageError."""
    from sweep.store import storage_errors

    return storage_errors(url, doing)


def _reading(*studies: Study) -> contextlib.AbstractContextManager[None]:
    """A read command's storage calls wait for a restarting database (reached before or not),
    up to 30 s or the studies' shortest ``storage_retry``, saying so on stderr."""
    from sweep.store import patience, reading_patience

    seconds = min(study.storage_retry_s for study in studies)
    return patience(reading_patience(seconds, _say_on_stderr))


def _say_on_stderr(line: str) -> None:
    from sweep.redact import redact_message

    err.print(f"[yellow]note:[/yellow] {escape(redact_message(line))}")


def _collect_no_garbage() -> None:
    """No cyclic garbage collection for the rest of this process, when the process ends with
    the command (:func:`main`): a report builds millions of small objects with nothing cyclic
    worth freeing before the process ends, and collection passes over them — the last one,
    as collection comes back on after loading, alone 0.15 s at 2,000 trials — cost 0.3–0.4 s
    of a 3 s report. Called in-process (a test's runner), collection stays on."""
    if _ENDS_WITH_COMMAND.is_set():
        gc.disable()


def _num(value: float | None, suffix: str = "") -> str:
    return "" if value is None else f"{value:.3f}{suffix}" if suffix else f"{value:.2f}"


EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
"""Exit codes (docs/running.md): done; a SweepError (one message on stderr); a usage error
(a bad option or argument, from typer); Ctrl-C or SIGTERM."""


_ENDS_WITH_COMMAND = threading.Event()
"""Set by :func:`main`: this process ends when its command does."""


def main() -> None:
    """Console entry point: turns SweepError into one clean message (secrets redacted) and
    exit code 1; usage errors exit 2 (typer), Ctrl-C 130."""
    _ENDS_WITH_COMMAND.set()
    try:
        _run_app()
    except SystemExit as exc:
        _exit_now(exc.code)
    _exit_now(EXIT_OK)


def _run_app() -> None:
    from sweep.redact import redact_message

    try:
        app()
    except Interrupted as exc:
        err.print(f"[yellow]interrupted:[/yellow] {escape(redact_message(str(exc)))}")
        sys.exit(EXIT_INTERRUPTED)
    except SweepError as exc:
        err.print(f"[red]error:[/red] {escape(redact_message(str(exc)))}")
        sys.exit(EXIT_ERROR)


def _exit_now(code: object) -> None:
    """End the process as ``sys.exit(code)`` would, without the interpreter's teardown.

    Everything a command does is finished by then (records committed, servers stopped,
    files closed); what is left is freeing the imported modules (optuna, SQLAlchemy, numpy,
    scipy), which takes 0.4–0.9 s of CPU at every exit, for every `sweep` process: each run,
    worker and simulated server. Threads, exit handlers and output are finished first, in
    the order the interpreter finishes them.
    """
    if code is None:
        status = EXIT_OK
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): print it, exit 1, as the interpreter does
        print(code, file=sys.stderr)
        status = EXIT_ERROR
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
