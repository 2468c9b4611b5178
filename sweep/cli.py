"""The ``sweep`` command line: thin commands over library functions.

Every command parses its options, calls one library function and renders the
result. A :class:`~sweep.exceptions.SweepError` becomes a one-line message and
exit code 1 in :func:`main`; usage errors exit 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from sweep import __version__
from sweep.exceptions import SweepError

app = typer.Typer(
    name="sweep",
    help="Find the fastest speculative-decoding settings for an LLM inference server.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)


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


def main() -> None:
    """Console entry point: turns SweepError into a clean message and exit code 1."""
    try:
        app()
    except SweepError as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(1)
