"""A trial spread over several pods: only the chief replica's keeper ships to the manager.

Every pod runs a keeper with the trial's token, and each numbers its records
from 1: were a second replica to ship, the manager would take its records for
duplicates of the chief's (or the chief's for duplicates of its own). Real
processes: `python -m trialkit.manager.server` on loopback, one keeper per
replica on its own trial dir, as each pod has.
"""
from __future__ import annotations

import json

import pytest

from harness import PYTHON, Manager, assert_delivered_once, channel_records, start_keeper
from trialkit import layout, records
from trialkit.keeper.spool import Spool

TRAIN = """
import os, trialkit
for value in os.environ["T_VALUES"].split(","):
    trialkit.report_intermediate_result(float(value))
trialkit.report_final_result(float(os.environ["T_FINAL"]))
"""


def tf_config(index: int) -> dict:
    cluster = {"worker": ["pod-0:2222", "pod-1:2222"]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}


def pytorchjob(node_rank: int) -> dict:
    # training-operator >= 1.4: a pod runs torchrun, whose workers' RANK is theirs; the pod's is PET_NODE_RANK.
    return {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "PET_NNODES": "2", "PET_NODE_RANK": str(node_rank)}


def run_replica(tmp_path, manager: Manager, name: str, replica_env: dict, values: str, final: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    keeper = start_keeper(tmp_path / name, [PYTHON, str(script)], manager=manager,
                          T_VALUES=values, T_FINAL=final, **replica_env)
    _, err = keeper.communicate(timeout=60)
    assert keeper.returncode == 0, err


def spooled(trial_dir) -> list:
    spool = Spool(layout.spool_dir(trial_dir))
    recs = [json.loads(data) for _, data in spool.read(0, 1000, 1 << 20)]
    spool.close()
    return [(r["type"], r["value"]["status"] if r["type"] == records.STATUS else r["value"]) for r in recs]


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "exp")
    m.register("t1", "token-1")
    yield m.start()
    m.close()


@pytest.mark.parametrize("replica", [tf_config, pytorchjob], ids=["TF_CONFIG", "PyTorchJob"])
def test_the_second_replica_keeps_its_records_and_the_chief_ships_its_own(tmp_path, manager, replica):
    run_replica(tmp_path, manager, "replica-1", replica(1), values="11,12", final="13")
    assert manager.store.records_for("t1") == []
    assert spooled(tmp_path / "replica-1") == [
        (records.STATUS, "RUNNING"), ("PERIODICAL", 11.0), ("PERIODICAL", 12.0), ("FINAL", 13.0),
        (records.STATUS, "SUCCEEDED"),
    ]
    assert Spool(layout.spool_dir(tmp_path / "replica-1")).acked == 0

    run_replica(tmp_path, manager, "replica-0", replica(0), values="1,2", final="3")
    chief_channel = channel_records(layout.home(tmp_path / "replica-0") / layout.CHANNEL)
    assert sorted(r["value"] for r in chief_channel) == [1.0, 2.0, 3.0]
    assert_delivered_once(manager, "t1", chief_channel, ["RUNNING", "SUCCEEDED"])
