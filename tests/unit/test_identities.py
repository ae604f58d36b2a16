"""Small pieces that keep credentials where they belong (issue 14): the token minter (S4/S9), the
sidecar's /tuning redaction (S14) and the agent's non-blocking inventory publisher (S12)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine_sidecar.redaction import Redactor
from extender.token_minter import parse_mint, run, write_atomically
from nodeagent.kube import InventoryPublisher, NodePods


@pytest.mark.parametrize("argv,shown", [
    (["vllm", "serve", "m", "--api-key", "s3cret", "--port", "8000"],
     ["vllm", "serve", "m", "--api-key", "<redacted>", "--port", "8000"]),
    (["vllm", "serve", "m", "--api-key=s3cret"], ["vllm", "serve", "m", "--api-key=<redacted>"]),
    (["vllm", "--ssl-keyfile-password", "pw", "--hf-token=hf_x"],
     ["vllm", "--ssl-keyfile-password", "<redacted>", "--hf-token=<redacted>"]),
    (["vllm", "serve", "m", "--api-key"], ["vllm", "serve", "m", "--api-key"]),
    (["vllm", "--max-num-seqs", "64"], ["vllm", "--max-num-seqs", "64"]),
])
def test_tuning_report_redacts_credentials(argv, shown):
    assert Redactor()(argv) == shown  # by position alone: no known values


def test_the_minter_writes_renews_and_keeps_the_last_token_while_the_apiserver_is_away(tmp_path: Path):
    out = tmp_path / "identity" / "token"
    stop = threading.Event()
    answers: list = [("t1", 0.5), RuntimeError("connection refused"), ("t2", 100.0)]
    seen: list[str] = []

    def request():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            seen.append(out.read_text())  # the failed renewal leaves the valid token in place
            raise answer
        if not answers:
            stop.set()
        return answer
    thread = threading.Thread(target=run, args=(request, out, stop), daemon=True,
                              kwargs={"backoff_initial_s": 0.05, "also": {"ca.crt": "CA", "namespace": "ns"}})
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert seen == ["t1"] and out.read_text() == "t2"
    assert (out.parent / "ca.crt").read_text() == "CA" and (out.parent / "namespace").read_text() == "ns", \
        "the folder is a whole in-cluster identity"
    assert oct(out.stat().st_mode & 0o777) == "0o440"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".token-")], "a temporary file was left"


def test_write_atomically_replaces_the_file_whole(tmp_path: Path):
    path = tmp_path / "token"
    write_atomically(path, "a" * 4096)
    write_atomically(path, "b")
    assert path.read_text() == "b"


def test_the_inventory_publisher_never_blocks_the_caller_and_writes_the_newest_value():
    gate = threading.Event()
    written: list[str] = []

    def patch(text: str) -> None:
        gate.wait(5)  # a hung apiserver call
        written.append(text)
    publisher = InventoryPublisher(patch, backoff_initial_s=0.01)
    started = time.monotonic()
    for text in ("v1", "v2", "v3"):
        publisher.publish(text)
    assert time.monotonic() - started < 0.5, "publish waited for the apiserver"
    gate.set()
    deadline = time.monotonic() + 5
    while written[-1:] != ["v3"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written[-1] == "v3" and len(written) <= 2, written


def test_node_pods_follow_list_and_events():
    pods = NodePods()
    pods.replace([{"metadata": {"namespace": "a", "name": "p"}}])
    pods.apply("ADDED", {"metadata": {"namespace": "a", "name": "q"}})
    pods.apply("DELETED", {"metadata": {"namespace": "a", "name": "p"}})
    assert [p["metadata"]["name"] for p in pods.pods()] == ["q"]


@pytest.mark.parametrize("spec,ok", [("gpusched-extender=/var/run/x", True), ("=/x", False), ("a=", False), ("a", False)])
def test_mint_specs_name_an_account_and_a_folder(spec, ok):
    import argparse
    if ok:
        assert parse_mint(spec) == ("gpusched-extender", Path("/var/run/x"))
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="ACCOUNT=DIR"):
            parse_mint(spec)
