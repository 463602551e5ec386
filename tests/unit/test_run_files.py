"""The run directory's typed files (common/files/run_files.py): written key for key as before the
records existed, older runs' files still read, and the module light enough for the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.files import run_files as RF
from common.files.metrics import StepRecord
from common.wire import OUTCOMES

BALANCE = {"issued": 9, "trained": 4, "dropped_stale": 1, "dropped_zero_variance": 2,
           "rejected_invalid": 0, "expired": 1, "open": 1, "ok": 1}  # fmt: skip
ADMISSION = {"queued_groups": 1, "queued_bytes": 300, "groups_held": 0, "holds": 2,
             "hold_s_mean": 0.25, "hold_s_max": 0.5, "queued_bytes_max": 900,
             "queued_groups_max": 3}  # fmt: skip
LEDGER = {
    "balance": BALANCE,
    "by_producer": {"p1": {"issued": 5, "trained": 3, "expired": 1}, "p2": {"issued": 4}},
    "hosts": {"p1": "a", "p2": "b"},
    "counters": {"rejected": 2, "rejected.bad_logprob": 2, "messages": 40},
    "admission": ADMISSION,
    "policy_version": 4,
}


def test_the_balance_has_one_count_per_outcome_of_the_wire_in_its_order():
    assert RF.FINAL_STATES == OUTCOMES
    balance = RF.Balance.from_json(BALANCE)
    assert [balance.final(o) for o in OUTCOMES] == [4, 1, 2, 0, 1]
    assert balance.ok is True
    assert list(balance.to_json().items()) == list(BALANCE.items())
    assert "ok" not in RF.Balance(issued=1, open=1).to_json()  # the per-step totals


def test_ledger_json_is_written_exactly_as_before_and_reads_back(tmp_path):
    ledger = RF.Ledger.from_json(LEDGER)
    RF.write_ledger(tmp_path, ledger)
    assert (tmp_path / RF.LEDGER).read_text() == json.dumps(LEDGER, indent=1, sort_keys=True)
    assert RF.read_ledger(tmp_path) == ledger
    assert ledger.count("p1", "trained") == 3
    assert ledger.count("p2", "trained") == ledger.count("nobody", "issued") == 0
    assert ledger.held("p1") == 5
    assert ledger.refused() == {"rejected.bad_logprob": 2}
    assert ledger.admission is not None
    assert ledger.admission.queued_bytes_max == 900
    assert not (tmp_path / (RF.LEDGER + ".tmp")).exists()


def test_a_ledger_of_an_older_run_reads_with_what_it_has(tmp_path):
    old = {"balance": BALANCE, "by_producer": {"p1": {"issued": 9}}, "counters": {},
           "policy_version": 2}  # fmt: skip
    (tmp_path / RF.LEDGER).write_text(json.dumps(old))
    ledger = RF.read_ledger(tmp_path)
    assert (ledger.hosts, ledger.admission) == ({}, None)  # before hosts and backpressure
    assert ledger.to_json() == {**old, "hosts": {}}
    partial = {"admission": {"holds": 1}, "balance": {"issued": 2}, "newer_key": 1}
    (tmp_path / RF.LEDGER).write_text(json.dumps(partial))
    ledger = RF.read_ledger(tmp_path)
    assert (ledger.admission, ledger.balance.issued) == (RF.BackpressureTotals(holds=1), 2)


def test_a_ledger_being_replaced_or_absent_is_none_to_a_live_reader(tmp_path):
    assert RF.latest_ledger(tmp_path) is None
    (tmp_path / RF.LEDGER).write_text('{"balance": {"iss')
    assert RF.latest_ledger(tmp_path) is None
    (tmp_path / RF.LEDGER).write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        RF.read_ledger(tmp_path)


def test_lease_lines_keep_their_key_order_and_a_torn_last_line_is_skipped(tmp_path):
    line = {"lease_id": (1 << 40) | 7, "prompt_index": 3, "step": 2, "min_version": 0,
            "producer_id": "p1", "issued_at": 12.5, "state": "trained", "behavior_version": 1,
            "trained_step": 2, "num_tokens": 17, "reason": ""}  # fmt: skip
    RF.append_leases(tmp_path, [RF.LeaseLine.from_json(line)] * 2)
    RF.append_leases(tmp_path, [])
    text = (tmp_path / RF.LEASES).read_text()
    assert text == 2 * (json.dumps(line) + "\n")
    with open(tmp_path / RF.LEASES, "a") as f:
        f.write('{"lease_id": 9, "prom')  # a crash mid-line
    lines = RF.read_leases(tmp_path)
    assert len(lines) == 2
    assert (lines[0].staleness, lines[0].producer_id) == (1, "p1")
    assert RF.read_leases(tmp_path / "nowhere") == []
    with pytest.raises(ValueError, match="LeaseLine lacks state"):
        RF.LeaseLine.from_json({k: v for k, v in line.items() if k != "state"})


def test_the_producers_files_are_written_as_before(tmp_path):
    status = {"host": "h", "pid": 7, "engine": "fake", "version": 3, "state": "generating",
              "num_in_flight": 2, "counters": {"groups_sent": 4.0, "reward_errors": 1.0},
              }  # fmt: skip
    current = RF.ProducersFile(unix_time=1.5, producers={"p1": RF.ProducerStatus(**status)})
    RF.write_producers(tmp_path, current)
    expected = json.dumps({"unix_time": 1.5, "producers": {"p1": status}}, sort_keys=True)
    assert (tmp_path / RF.PRODUCERS).read_text() == expected
    assert RF.read_producers(tmp_path) == current.producers
    view = current.producers["p1"]
    assert (view.groups_sent, view.reward_errors, view.reward_timeouts) == (4, 1, 0)
    change = RF.ProducerChange(unix_time=2.0, producer="p1", version=3, state="idle")
    RF.append_producer_changes(tmp_path, [change])
    assert (tmp_path / RF.PRODUCER_HISTORY).read_text() == (
        json.dumps({"unix_time": 2.0, "producer": "p1", "version": 3, "state": "idle"}) + "\n"
    )
    assert RF.read_producer_history(tmp_path) == [change]


def test_a_run_older_than_producers_json_gives_its_producers_from_the_metrics_line(tmp_path):
    line = {"producers": {"p1": {"version": 2, "state": "idle"}},
            "producer_counters": {"p1": {"reward_errors": 5}}}  # fmt: skip
    record = StepRecord.from_json({**_REQUIRED_STEP, **line})
    (p1,) = RF.latest_producers(tmp_path, record).values()
    assert (p1.version, p1.state, p1.reward_errors, p1.host) == (2, "idle", 5, "")
    assert RF.latest_producers(tmp_path, None) == {}
    RF.write_producers(tmp_path, RF.ProducersFile(unix_time=0.0, producers={}))
    assert RF.latest_producers(tmp_path, record)["p1"].version == 2  # an empty file: no view


def test_endpoints_json_keeps_the_consumers_order_and_older_runs_lack_the_data_socket(tmp_path):
    ports = {"control": 5, "rollouts": 6, "announce": 7, "data": 8}
    endpoints = RF.Endpoints(**{k: f"tcp://127.0.0.1:{p}" for k, p in ports.items()})
    RF.write_endpoints(tmp_path, endpoints)
    text = (tmp_path / RF.ENDPOINTS).read_text()
    assert text == json.dumps({k: f"tcp://127.0.0.1:{p}" for k, p in ports.items()})
    assert RF.read_endpoints(tmp_path / RF.ENDPOINTS).ports() == ports
    older = {k: f"tcp://h:{p}" for k, p in ports.items() if k != "data"}
    (tmp_path / RF.ENDPOINTS).write_text(json.dumps(older))
    assert RF.read_endpoints(tmp_path / RF.ENDPOINTS).ports() == {"control": 5, "rollouts": 6,
                                                                    "announce": 7}  # fmt: skip
    (tmp_path / RF.ENDPOINTS).write_text('{"control": ["tcp://h:1"]}')
    with pytest.raises(ValueError, match="'control' is not a string"):
        RF.read_endpoints(tmp_path / RF.ENDPOINTS)


def test_a_checkpoints_book_state_keeps_its_layout():
    book = {"incarnation": 1, "open": [], "counts": {"issued": 2}}
    state = RF.BookState(book=book, identities={"keys": {}}, log_sizes={RF.LEASES: 10})
    data = state.to_json()
    assert list(data) == ["incarnation", "open", "counts", "identities", "logs"]
    assert RF.BookState.from_json(data) == state
    assert RF.BookState.from_json(book) == RF.BookState(book=book)  # before identities


def test_the_module_imports_neither_numpy_nor_the_wire():
    """`asyncgrpo --help` stays instant: the CLI imports this module at its start."""
    code = "import sys, common.files.run_files; print({'numpy', 'common.wire'} & set(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "set()"


_REQUIRED_STEP = {
    "step": 1, "time_s": 1.0, "unix_time": 1.0, "step_wall_s": 1.0, "reward_mean": 0.0,
    "reward_std": 0.0, "frac_reward_zero_std": 0.0, "staleness_mean": 0.0, "staleness_max": 0,
    "staleness_hist": {}, "tokens_per_s": 0.0, "learner_idle_frac": 0.0, "wait_s": 0.0,
    "publish_submit_s": 0.0, "snapshot_write_s": 0.0, "num_completion_tokens": 0,
    "groups_trained": 0, "groups_dropped_stale": 0, "groups_dropped_zero_variance": 0,
    "groups_rejected_invalid": 0, "groups_expired": 0, "leases_open": 0, "rejected_messages": 0,
}  # fmt: skip
