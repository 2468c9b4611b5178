"""Studies with several hosts for tests and `make perf`: `sweep sim` servers on their own
ports and workdirs, one host optionally through the test sshd, on a shared database."""

from __future__ import annotations

from pathlib import Path

from tests.support.ports import free_port
from tests.support.sshd import Sshd
from tests.support.studies import write_study

SPACE = "num_steps = [1, 2, 3, 4, 5, 6]"


def hosts_table(folder: Path, sshd: Sshd | None, names: tuple[str, ...]) -> str:
    """Hosts, each with its own server port and workdir; host c over SSH if ``sshd``."""
    tables = []
    for name in names:
        table = f'[[hosts]]\nname = "{name}"\nworkdir = "{folder / ("servers-" + name)}"\n'
        table += f"server_port = {free_port()}\n"
        if name == "c" and sshd is not None:
            table += f'kind = "ssh"\naddress = "127.0.0.1"\nport = {sshd.port}\n'
            table += f'user = "{sshd.user}"\nkey = "{sshd.key}"\nstrict_host_key = false\n'
        tables.append(table)
    return "\n".join(tables)


def shared_study(folder: Path, storage: str, sshd: Sshd | None = None, output_len: int = 48,
                 sampler: str = "grid", space: str = SPACE,
                 names: tuple[str, ...] = ("a", "b", "c")) -> Path:  # fmt: skip
    """A study on `sweep sim` with hosts ``names`` whose launches are recorded in
    launches.jsonl."""
    path = write_study(folder, space=space, study=f'sampler = "{sampler}"\nstorage = "{storage}"')
    text = path.read_text().replace(f'[host]\nworkdir = "{folder / "servers"}"\n', "")
    text = text.replace("output_len = 48", f"output_len = {output_len}")
    path.write_text(text + "\n" + hosts_table(folder, sshd, names))
    return path
