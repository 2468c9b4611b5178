"""The overnight trial loop on one host: ask → validity rules → claim → measure → decide → tell.

Each step is small and has one owner:

* *ask*, *validity rules*, *duplicates*, *claim* (:mod:`sweep.loop.propose`): Optuna
  proposes (or a queued configuration is taken); a configuration that cannot work is told
  as excluded, one already measured is answered from storage, several workers never launch
  one configuration twice (:mod:`sweep.store.claims`);
* *measure* (:mod:`sweep.loop.attempt`, :mod:`sweep.loop.measure`): one launch, with
  retries, returns an outcome value;
* *decide* (:mod:`sweep.core.policy`): what next — stop, baseline due, parser gate, wait
  for other workers, propose — is one pure function of the stored records;
* *tell* (:mod:`sweep.loop.tell`): the record is stored and Optuna told.

The runner keeps no result state of its own: what was measured is read back from storage
(:class:`~sweep.loop.history.History`), so a resumed run, another worker and ``sweep
status`` all see the same thing. One runner per study and host holds a lease
(:class:`~sweep.store.claims.Lease`) for the whole run; solo and shared studies differ only
in their strategy (:mod:`sweep.loop.sharing`).
"""

from __future__ import annotations

from sweep.core.outcome import Failed
from sweep.exceptions import ExecutorError
from sweep.loop.context import RunContext, RunSummary
from sweep.loop.phases import Phase, Prepare
from sweep.loop.propose import abandon
from sweep.loop.sharing import server_place
from sweep.server.port_holders import port_held_by


class Runner:
    """Runs one study on one host through its phases until a stop condition."""

    def __init__(self, ctx: RunContext) -> None:
        """``ctx`` is built once by :func:`sweep.loop.wiring.run_context`."""
        self.ctx = ctx

    def run(self) -> RunSummary:
        """Run until done, out of time, or interrupted.

        Raises:
            StudyBusy: another live run holds this study (and host), or another host's
                run of it starts its servers on this host's port of the same machine.
            Interrupted: Ctrl-C (or SIGTERM); the interrupted trial is recorded first.
        """
        ctx = self.ctx
        server = server_place(ctx.host, ctx.rig.deployment.port)
        with ctx.sharing.lease(ctx.stores.claims, ctx.host.name, ctx.clock, server):
            phase: Phase | None = Prepare().run(ctx)
            try:
                while phase is not None:
                    phase = phase.run(ctx)
            except BaseException as exc:  # Ctrl-C, SIGTERM, an error: no trial left RUNNING
                abandon(ctx, exc)
                raise
            finally:
                ctx.display.close()
        summary = ctx.summary
        summary.best = ctx.history().best_text()
        left = left_held(ctx)
        if left:  # the next run (or anything else) would meet a held port
            summary.warnings += left
            summary.error = summary.error or ("" if summary.failed_run else left[0])
            summary.failed_run = True
        return summary

    @property
    def summary(self) -> RunSummary:
        return self.ctx.summary


def left_held(ctx: RunContext) -> list[str]:
    """What the run leaves held on its host: what the last stop could not free (its process
    group, GPU memory) and, looked at again now, the port — whoever took it (a child of a
    server that left its group, a process that took it after a clean stop). Nothing when the
    run launched nothing."""
    if not any(t.kind.launches for t in ctx.launches):
        return [f"after the last stop: {w}" for w in ctx.stop_warnings]
    port, host = ctx.rig.deployment.port, ctx.rig.executor.host
    try:
        held = port_held_by(ctx.rig.executor, port, ctx.rig.deployment.bind_host)
    except ExecutorError:  # the host cannot be asked: what the last stop saw stands
        return [f"after the last stop: {w}" for w in ctx.stop_warnings]
    # the port as it is now, rather than as the last stop saw it (our own wording: port_holders')
    stop = [w for w in ctx.stop_warnings if not w.startswith(f"port {port} ")]
    out = [f"after the last stop: {w}" for w in stop]
    if held:
        out.append(
            f"port {port} on {host} is still held at the end of the run by {held}; the next "
            "run's first launch would wait for it, then stop: stop that process"
        )
    return out


__all__ = ["Failed", "Runner"]
