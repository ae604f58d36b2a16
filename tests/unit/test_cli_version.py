"""``gpusched version`` (issue 48): the client's release always, the extender's when it answers —
and a server that cannot be asked is said on stderr with exit 1, the client's line still printed.
Run as ``kubectl-gpusched``, usage names ``kubectl gpusched``."""

from __future__ import annotations

import pytest

from devcluster.processes import free_port
from gpusched_api.release import release
from gpusched_cli.__main__ import main, program_name


@pytest.mark.parametrize("invoked_as, name", [
    ("/usr/local/bin/kubectl-gpusched", "kubectl gpusched"),
    ("kubectl-gpusched", "kubectl gpusched"),
    ("/work/.venv/bin/gpusched", "gpusched"),
    ("-m", "gpusched"),  # python -m gpusched_cli
])
def test_the_program_names_the_command_the_user_typed(invoked_as: str, name: str):
    assert program_name(invoked_as) == name


def test_the_client_release_is_the_installed_distributions(capsys):
    assert main(["version", "--client"]) == 0
    assert capsys.readouterr().out == f"Client Version: gpusched {release()}\n"
    assert release()[0].isdigit()  # installed (pip install -e .): a real release, not the sentence


def test_an_unreachable_server_is_said_on_stderr_after_the_clients_line(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["version", "--url", url]) == 1
    said = capsys.readouterr()
    assert said.out == f"Client Version: gpusched {release()}\n"
    assert said.err.startswith(f"gpusched version: cannot reach the gpusched extender at {url}"), said.err
