"""net.connect_file: a producer started before its consumer waits for endpoints.json."""

from __future__ import annotations

import asyncio
import json

import pytest

from common import config as C
from common.errors import ConfigError
from producer.endpoint_file import resolve_connect, wait_for_endpoint


async def test_a_producer_waits_for_the_file_and_takes_its_control_endpoint(tmp_path):
    async with asyncio.timeout(10):
        path = tmp_path / "endpoints.json"
        waiter = asyncio.create_task(wait_for_endpoint(path, timeout_s=30))
        await asyncio.sleep(0)
        assert not waiter.done()
        path.write_text(json.dumps({"control": "tcp://127.0.0.1:4242", "rollouts": "x"}))
        assert await waiter == "tcp://127.0.0.1:4242"


async def test_the_endpoint_replaces_net_connect_and_is_held_to_the_same_rule(tmp_path):
    async with asyncio.timeout(10):
        path = tmp_path / "endpoints.json"
        cfg = C.load(None, [f"net.connect_file={json.dumps(str(path))}"])
        path.write_text(json.dumps({"control": "tcp://127.0.0.1:4242"}))
        assert (await resolve_connect(cfg)).net.connect == "tcp://127.0.0.1:4242"
        path.write_text(json.dumps({"control": "tcp://10.1.2.3:4242"}))
        with pytest.raises(ConfigError, match="leaves this machine"):
            await resolve_connect(cfg)
        assert await resolve_connect(C.Config()) == C.Config()  # unset: net.connect as given


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "does not exist"), ("{", "not a consumer's endpoints.json"),
     ('{"control": 5}', "not a string")],
)  # fmt: skip
async def test_a_file_that_never_becomes_valid_ends_in_one_clear_error(tmp_path, content, problem):
    async with asyncio.timeout(10):
        path = tmp_path / "endpoints.json"
        if content is not None:
            path.write_text(content)
        with pytest.raises(ConfigError, match=f"net.connect_file = .*{problem}"):
            await wait_for_endpoint(path, timeout_s=0.0)


def test_a_wildcard_bind_advertises_this_hosts_name_or_the_chosen_host() -> None:
    import socket

    from common.net.endpoints import advertised_host, tcp_endpoint

    assert advertised_host("0.0.0.0") == socket.gethostname()
    assert advertised_host("::") == socket.gethostname()
    assert advertised_host("0.0.0.0", "gpu-learner.lan") == "gpu-learner.lan"
    assert advertised_host("10.0.0.1") == "10.0.0.1"  # a bound address is reachable as it is
    assert tcp_endpoint("::1", 5555) == "tcp://[::1]:5555"
    assert tcp_endpoint("vm", 5555) == "tcp://vm:5555"


async def test_a_producer_says_that_it_waits_where_and_for_how_long(tmp_path, caplog):
    import logging

    from producer.endpoint_file import NoConsumer

    path = tmp_path / "endpoints.json"
    with caplog.at_level(logging.INFO, logger="asyncgrpo.producer"):
        async with asyncio.timeout(10):
            with pytest.raises(NoConsumer):  # exit 3: a supervisor may restart it
                await wait_for_endpoint(path, timeout_s=0.2)
            with pytest.raises(TimeoutError):  # producer.follow: past its timeout, by design
                await asyncio.wait_for(wait_for_endpoint(path, timeout_s=0.0, follow=True), 0.3)
    said = [r.getMessage() for r in caplog.records if "waiting for the consumer" in r.getMessage()]
    assert said[0] == (
        f"waiting for the consumer's endpoints file {path} (it does not exist; 0 s so far, up to "
        "net.handshake_timeout_s = 0.2 s)"
    )
    assert said[1].endswith("for ever (producer.follow))")


def test_a_consumer_bound_to_every_interface_says_what_it_bound_and_what_it_advertises():
    from common.net.endpoints import listening

    assert listening("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555") == (
        "listening on tcp://127.0.0.1:5555"
    )
    assert listening("tcp://0.0.0.0:5555", "tcp://gpu-learner:5555") == (
        "listening on tcp://0.0.0.0:5555 (every interface); producers are told "
        "tcp://gpu-learner:5555 (endpoints.json; `asyncgrpo consumer --advertise HOST` names "
        "another)"
    )
    assert listening("tcp://10.0.0.1:5555", "tcp://learner.lan:5555").startswith(
        "listening on tcp://10.0.0.1:5555; producers are told tcp://learner.lan:5555"
    )


def test_a_producer_says_how_long_it_waits_for_its_consumer():
    from producer.control import waits_line

    assert waits_line(False, 60.0) == "gives up after net.handshake_timeout_s = 60 s"
    assert waits_line(True, 300.0) == "producer.follow: waits up to net.consumer_timeout_s = 300 s"
    assert waits_line(True, float("inf")) == "producer.follow: waits for ever, by design"
