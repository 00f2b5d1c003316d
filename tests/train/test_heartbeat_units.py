"""``kilocard.train.heartbeat`` without a launcher: the timeout floor, the kept state, and no NVRx outside ft_launcher.

The heartbeats themselves run against NVRx's real rank monitor in tests/train/test_faults_injob.py.
"""

from __future__ import annotations

import json

from kilocard.train import heartbeat
from kilocard.train.signals import Watchdog


def _state(initial: float, subsequent: float) -> dict:
    return {"current_timeouts": {"heartbeat": {"initial": initial, "subsequent": subsequent, "were_calculated": True}}}


def test_calibrated_timeouts_keep_the_startup_allowance_and_never_go_below_the_floor():
    floor = heartbeat.MIN_TIMEOUT_S
    assert heartbeat.bounded(_state(0.4, 0.3), 300) == _state(300, floor)
    assert heartbeat.bounded(_state(0.4, 2 * floor), 300) == _state(300, 2 * floor)
    assert heartbeat.bounded({"current_timeouts": {}}, 300) == {"current_timeouts": {}}


def test_kept_state_is_read_back_and_a_torn_file_is_ignored(tmp_path):
    path = tmp_path / heartbeat.HEARTBEAT_FILE
    assert heartbeat.load_state(path) is None
    path.write_text(json.dumps(_state(30.0, 12.5)))
    assert heartbeat.load_state(path) == _state(30.0, 12.5)
    assert heartbeat.describe(_state(30.0, 12.5)) == "initial 30.0s, subsequent 12.5s"
    path.write_text('{"current_timeouts": {"heart')
    assert heartbeat.load_state(path) is None


def test_outside_ft_launcher_the_plain_watchdog_guards_the_rank(tmp_path):
    """No rank-monitor socket in the environment: the own watchdog alone, NVRx not involved."""
    guard = heartbeat.start(0, 0, tmp_path, {"RANK": "0"})
    assert type(guard) is Watchdog
    guard.beat("step 1")
    guard.stop()
    assert not (tmp_path / heartbeat.HEARTBEAT_FILE).exists()
