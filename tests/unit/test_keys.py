"""Key hygiene: secrets 0600 in 0700 directories, the consumer's material apart from each
producer host's, a per-host allowlist of public keys that revokes a host by deleting its file."""

from __future__ import annotations

import logging
import stat

import pytest
import zmq
import zmq.auth
from typer.testing import CliRunner

from common.errors import ConfigError
from common.net.keys import create_keys, load_keys
from consumer.key_gate import KeyGate
from launch.cli import app


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_the_layout_keeps_each_hosts_material_apart_and_secrets_private(tmp_path):
    keys = tmp_path / "keys"
    homes = create_keys(keys, ["gpu1", "gpu2"])
    assert homes == [keys / "producers" / "gpu1", keys / "producers" / "gpu2"]
    files = sorted(str(p.relative_to(keys)) for p in keys.rglob("*") if p.is_file())
    per_host = [f"producers/{h}/{f}" for h in ("gpu1", "gpu2")
                for f in ("client.key", "client.key_secret", "server.key")]  # fmt: skip
    assert files == [
        "clients/gpu1.key", "clients/gpu2.key", *per_host,
        "server/server.key", "server/server.key_secret",
    ]  # fmt: skip
    for secret in keys.rglob("*.key_secret"):
        assert _mode(secret) == 0o600
    for private in (keys / "server", *homes):
        assert _mode(private) == 0o700
    # a producer's directory holds nothing of the consumer's secret or of another host
    assert "secret-key" not in (homes[0] / "server.key").read_text()


def test_running_again_keeps_every_key_and_adds_new_hosts(tmp_path):
    keys = tmp_path / "keys"
    create_keys(keys, ["gpu1"])
    before = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()}
    create_keys(keys, ["gpu1", "gpu3"])
    assert all(p.read_bytes() == data for p, data in before.items())
    assert (keys / "clients" / "gpu3.key").exists()
    with pytest.raises(ConfigError, match="plain file name"):
        create_keys(keys, ["../evil"])


def test_each_side_loads_its_own_keys_and_a_producer_is_refused_the_consumers_dir(tmp_path):
    keys = tmp_path / "keys"
    create_keys(keys, ["gpu1"])
    server = load_keys(keys, "server")
    client = load_keys(keys / "producers" / "gpu1", "client")
    assert server.allowlist == keys / "clients"
    assert client.server_public == server.public
    assert client.allowlist is None
    listed, _ = zmq.auth.load_certificate(keys / "clients" / "gpu1.key")
    assert listed == client.public
    with pytest.raises(ConfigError, match=r"give a producer its own, .*producers/NAME \(gpu1\)"):
        load_keys(keys, "client")


def test_the_former_flat_layout_still_loads_for_both_roles(tmp_path):
    for name in ("server", "client"):
        zmq.auth.create_certificates(tmp_path, name)
    assert load_keys(tmp_path, "server").allowlist == tmp_path
    assert load_keys(tmp_path, "client").directory == tmp_path


def test_a_secret_readable_by_others_is_warned_about(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("asyncgrpo.keys"), "disabled", False)
    create_keys(tmp_path, ["gpu1"])
    (tmp_path / "server" / "server.key_secret").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.keys"):
        load_keys(tmp_path, "server")
    assert "readable by other users: chmod 600" in caplog.text


def test_the_allowlist_admits_listed_hosts_and_a_deleted_file_revokes_one(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(logging.getLogger("asyncgrpo.consumer"), "disabled", False)
    create_keys(tmp_path, ["gpu1", "gpu2"])
    gpu1 = load_keys(tmp_path / "producers" / "gpu1", "client").public
    gpu2 = load_keys(tmp_path / "producers" / "gpu2", "client").public
    ctx = zmq.Context()
    gate = KeyGate(ctx, tmp_path / "clients")
    gate.start()
    try:
        assert gate.callback("*", gpu1)
        assert gate.callback("*", gpu2)
        (tmp_path / "clients" / "gpu2.key").unlink()
        gate._checked = float("-inf")  # the next handshake looks again (at most once a second)
        gate._peer = "10.0.0.3"
        with caplog.at_level(logging.WARNING, logger="asyncgrpo.consumer"):
            assert not gate.callback("*", gpu2)
            assert not gate.callback("*", gpu2)  # rate-limited: one line per address
        assert gate.callback("*", gpu1)
        assert gate.refused == 2
        refused = [r for r in caplog.records if "refused a CurveZMQ connection" in r.message]
        assert len(refused) == 1
        assert "from 10.0.0.3" in refused[0].message
    finally:
        gate.stop()
        ctx.destroy(linger=0)


def test_the_keys_command_says_which_directory_goes_where(tmp_path):
    result = CliRunner().invoke(app, ["keys", str(tmp_path / "k"), "-p", "gpu1"])
    assert result.exit_code == 0
    assert f"consumer host: --keys {tmp_path / 'k'}" in result.output
    assert f"producer host gpu1: copy {tmp_path / 'k' / 'producers' / 'gpu1'}/ there" in (
        result.output
    )
