"""The parser gate: the engine's own parser over every planned command, in one process.

Pure: this module builds the probe (a Python program run with the host's
interpreter as ``python -c PROGRAM PAYLOAD``) and reads its answer; the server wing
(``sweep.server.engine_check``) runs it through the executor, so it works over SSH
too. The payload is the commands' flags as JSON, compressed and base64-encoded into
one argv word (a command line, unlike stdin, passes through every executor);
:func:`payloads` splits a long plan into a few such words.

The program reads the engine's version from the package metadata (no import), then
imports the engine once and, for each command, runs its argument parser (and, for
SGLang, the algorithm-name resolution). It prints one line ``SWEEP-GATE {json}``:
``version``, ``importable`` (and ``error`` when not), the parser's ``options``
(option string → argparse ``nargs``), ``abbreviations`` (the parser's
``allow_abbrev``) and one result per command: ``ok`` true, false (rejected, with
``stage`` and the parser's exact ``message``: its last stderr line on a parser error,
the exception type and text when the engine's argument handling raised one) or null
(SGLang's name resolution itself failed: inconclusive, never a rejection).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sweep.engines.flags import FlagTable

MARKER = "SWEEP-GATE "
MAX_PAYLOAD_CHARS = 60_000
"""One argv word stays far below Linux's 128 KiB limit per argument."""
SAMPLE = 1_000
"""A longer plan's payload size is estimated from this many commands (linear in the plan)."""

PRELUDE = """
import base64, json, sys, zlib
from importlib import metadata
request = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
sys.argv = [request["prog"]]  # argparse names its errors after it, as the server does
def emit(**report):
    sys.stdout.write("\\n" + MARKER + json.dumps(report) + "\\n")
    sys.stdout.flush()
version = ""
for name in request["distributions"]:
    try:
        version = metadata.version(name)
        break
    except metadata.PackageNotFoundError:
        pass
"""

RUN = """
try:
    setup()
except (Exception, SystemExit) as exc:
    emit(version=version, importable=False, error=type(exc).__name__ + ": " + str(exc))
    raise SystemExit(0)
results = [check(argv) for argv in request["commands"]]
emit(version=version, importable=True, results=results, **options())
"""

COMMON = """
import argparse, contextlib, io
def run_parser(parse, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parse(list(argv)), None
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return None, {"ok": False, "stage": "parser",
                      "message": lines[-1].strip() if lines else "exit code %s" % exc.code}
    except Exception as exc:  # raised inside the engine's own argument handling: it would
        # raise the same at launch (e.g. SGLang's --config with a non-YAML file: ValueError)
        return None, {"ok": False, "stage": "parser",
                      "message": type(exc).__name__ + ": " + str(exc)}
def option_table(parser):
    if parser is None:
        return {"options": {}, "abbreviations": True}
    nargs = {o: a.nargs for o, a in parser._option_string_actions.items() if o.startswith("--")}
    return {"options": nargs, "abbreviations": bool(parser.allow_abbrev)}
"""

SGLANG = """
PARSERS = []
ALIASES = {"NEXTN": "EAGLE"}  # resolved to EAGLE before the name lookup (reference/sglang.md)
def setup():
    global prepare_server_args, Algorithm
    original = argparse.ArgumentParser.parse_known_args
    def capture(self, *args, **kwargs):
        PARSERS.append(self)
        return original(self, *args, **kwargs)
    argparse.ArgumentParser.parse_known_args = capture
    from sglang.srt.server_args import prepare_server_args
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as Algorithm
    except Exception:
        Algorithm = None
def check(argv):
    args, failed = run_parser(prepare_server_args, argv)
    if failed:
        return failed
    name = getattr(args, "speculative_algorithm", None)
    if name and Algorithm is not None:
        name = str(name).upper()
        try:
            Algorithm.from_string(ALIASES.get(name, name))
        except ValueError as exc:
            return {"ok": False, "stage": "algorithm", "message": "ValueError: " + str(exc)}
        except Exception as exc:
            return {"ok": None, "stage": "algorithm",
                    "message": type(exc).__name__ + ": " + str(exc)}
    return {"ok": True}
def options():
    ours = [p for p in PARSERS if "--model-path" in p._option_string_actions]
    return option_table(ours[-1] if ours else None)
"""

VLLM = """
def setup():
    global PARSER, validate
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    import importlib
    for where in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            cli_args = importlib.import_module(where)  # 0.32 / older releases
            break
        except ImportError as exc:
            missing = exc
    else:
        raise missing
    PARSER = cli_args.make_arg_parser(FlexibleArgumentParser(prog=request["prog"]))
    validate = getattr(cli_args, "validate_parsed_serve_args", None)
def parse(argv):
    args = PARSER.parse_args(argv)
    if validate is not None:
        try:
            validate(args)
        except (TypeError, ValueError) as exc:
            sys.stderr.write(type(exc).__name__ + ": " + str(exc) + "\\n")
            raise SystemExit(2)
    return args
def check(argv):
    args, failed = run_parser(parse, argv)
    return failed or {"ok": True}
def options():
    return option_table(PARSER)
"""

PROGRAMS = {"sglang": SGLANG, "vllm": VLLM}


def program(engine: str) -> str:
    """The gate's Python program for ``engine`` (``"sglang"`` or ``"vllm"``)."""
    body = PROGRAMS[engine]
    return f"MARKER = {MARKER!r}\n{PRELUDE}{COMMON}{body}{RUN}"


def version_program(distributions: Sequence[str]) -> str:
    """A program printing the first installed distribution's version (metadata, no import)."""
    return (
        "from importlib import metadata\n"
        f"for name in {list(distributions)!r}:\n"
        "    try:\n"
        "        print(metadata.version(name))\n"
        "        break\n"
        "    except metadata.PackageNotFoundError:\n"
        "        pass\n"
        "else:\n"
        "    raise SystemExit('no distribution ' + ' or '.join("
        + repr(list(distributions))
        + "))\n"
    )


def payloads(
    commands: Sequence[Sequence[str]],
    distributions: Sequence[str],
    prog: str,
    max_chars: int = MAX_PAYLOAD_CHARS,
) -> list[str]:
    """The commands as a few argv words, each under ``max_chars`` (a command longer than that
    goes alone). Linear in the plan: each command is compressed about once, and a word that
    comes out too long is retried with as many commands as its measured ratio says fit.

    Args:
        commands: each command's server flags.
        distributions: the engine's package names (for its version).
        prog: the program name the parser's messages start with (``sglang serve``).
        max_chars: the largest payload word.
    """
    header = {"distributions": list(distributions), "prog": prog}
    out: list[str] = []
    start, size = 0, max(1, len(commands))
    if size > SAMPLE:  # how many fit, from a sample, rather than compress the whole plan at once
        sample = _encode(header, [list(c) for c in commands[:SAMPLE]])
        size = max(1, int(SAMPLE * max_chars / len(sample) * 0.9))
    while start < len(commands):
        batch = [list(c) for c in commands[start : start + size]]
        word = _encode(header, batch)
        if len(word) > max_chars and len(batch) > 1:
            # too long: try as many commands as the measured ratio says fit (with a margin);
            # each command is encoded a bounded number of times, so the split is linear
            size = max(1, min(len(batch) - 1, int(len(batch) * max_chars / len(word) * 0.9)))
            continue
        out.append(word)
        start += len(batch)
    return out or [_encode(header, [])]


def _encode(header: Mapping[str, object], commands: list[list[str]]) -> str:
    data = json.dumps({**header, "commands": commands})
    return base64.b64encode(zlib.compress(data.encode(), 9)).decode("ascii")


@dataclass(frozen=True)
class Verdict:
    """The parser's verdict on one command.

    Attributes:
        ok: True accepted, False rejected, None inconclusive (the check itself failed).
        stage: ``"parser"`` or ``"algorithm"`` (SGLang's name resolution).
        message: the engine's exact message (its last stderr line for the parser).
    """

    ok: bool | None
    stage: str = ""
    message: str = ""


@dataclass(frozen=True)
class GateReport:
    """What the gate program printed.

    Attributes:
        version: the engine's package version ("" when not installed).
        importable: whether the engine imported (else ``error`` says why).
        error: why it did not, or why the program gave no answer.
        options: the parser's options (``None`` when not importable).
        verdicts: one per command, in order.
    """

    version: str
    importable: bool
    error: str = ""
    options: FlagTable | None = None
    verdicts: tuple[Verdict, ...] = ()


def read_report(stdout: str, stderr: str, exit_code: int, source: str) -> GateReport:
    """Parse the program's output; no ``SWEEP-GATE`` line means it could not run.

    Args:
        source: names the parser in messages, e.g. "SGLang 0.5.23's parser".
    """
    lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        why = (stderr.strip().splitlines() or [f"exit code {exit_code}, no answer"])[-1]
        return GateReport("", False, why)
    data = json.loads(lines[-1][len(MARKER) :])
    if not data.get("importable"):
        return GateReport(str(data.get("version") or ""), False, str(data.get("error", "")))
    verdicts = tuple(
        Verdict(r.get("ok"), str(r.get("stage", "")), str(r.get("message", "")))
        for r in data.get("results", [])
    )
    options = FlagTable.from_nargs(
        dict(data.get("options") or {}), source, bool(data.get("abbreviations", True))
    )
    return GateReport(str(data.get("version") or ""), True, "", options, verdicts)


def merge(reports: Sequence[GateReport]) -> GateReport:
    """Several payloads' reports as one (the first failure wins)."""
    failed = next((r for r in reports if not r.importable), None)
    if failed is not None:
        return failed
    first = reports[0]
    verdicts = tuple(v for r in reports for v in r.verdicts)
    return GateReport(first.version, True, "", first.options, verdicts)
