"""Failure memory: append-only JSONL, torn-tail recovery, reload, exact resume to a checkpoint."""

import json

import pytest

from roleagent_jax.aiw import FailureMemory, FailureReport, trajectory_digest
from roleagent_jax.types import Step, Trajectory


def make_traj(task_id: int, n: int = 3) -> Trajectory:
    steps = [Step("o", [], "r", f"go to desk {i}", True, 0.0, f"You arrive at desk {i}.") for i in range(n)]
    return Trajectory(
        task_id=task_id, task_type="pick_and_place_simple", goal="put some pencil on desk.", steps=steps
    )


def report(ftype: str = "navigation_loop") -> FailureReport:
    return FailureReport(
        failure_type=ftype,
        detail="d ☃",
        critical_step=2,
        lesson="l",
        query="pick and place: loop",
        raw="x" * 5000,
        source="llm",
    )


def test_append_reload_and_query(tmp_path):
    path = tmp_path / "mem" / "failures.jsonl"
    m = FailureMemory(path)
    m.add(0, make_traj(1), report())
    m.add_many([(1, make_traj(2), report("wrong_receptacle")), (1, make_traj(3), report())])
    assert len(m) == 3
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4 and all(json.loads(x) for x in lines[:-1])
    m2 = FailureMemory(path)
    assert m2.records == m.records
    assert [r["task_id"] for r in m2.records_by_type("navigation_loop")] == [1, 3]
    assert m2.type_counts() == {"navigation_loop": 2, "wrong_receptacle": 1}
    assert m2.records_for_task(2)[0]["iteration"] == 1
    rec = m2.records[0]
    assert rec["detail"] == "d ☃" and len(rec["raw"]) == 1000 and rec["digest"]["n_steps"] == "3"
    assert rec["task_type"] == "pick_and_place_simple" and rec["critical_step"] == 2


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "failures.jsonl"
    m = FailureMemory(path)
    m.add_many([(0, make_traj(i), report()) for i in range(3)])
    good = path.read_bytes()
    with open(path, "ab") as fh:  # a crash in the middle of writing the 4th record
        fh.write(b'{"iteration": 1, "task_id": 9, "failure_ty')
    m2 = FailureMemory(path)
    assert len(m2) == 3 and path.read_bytes() == good
    m2.add(2, make_traj(7), report())  # appends cleanly after the truncation
    assert [r["task_id"] for r in FailureMemory(path).records] == [0, 1, 2, 7]


def test_corrupt_complete_line_is_skipped(tmp_path):
    path = tmp_path / "failures.jsonl"
    FailureMemory(path).add(0, make_traj(1), report())
    with open(path, "ab") as fh:
        fh.write(b"not json\n[1, 2]\n")
    m = FailureMemory(path)
    assert len(m) == 1 and m.n_skipped == 2


def test_resume_truncates_to_checkpoint(tmp_path):
    path = tmp_path / "failures.jsonl"
    m = FailureMemory(path)
    m.add_many([(0, make_traj(i), report()) for i in range(4)])
    ckpt = json.loads(json.dumps(m.state_dict()))
    snapshot = list(m.records)
    m.add_many([(1, make_traj(10 + i), report("wrong_receptacle")) for i in range(3)])  # after the checkpoint
    with open(path, "ab") as fh:
        fh.write(b'{"torn')
    resumed = FailureMemory(path)
    resumed.load_state_dict(ckpt)
    assert resumed.records == snapshot
    assert FailureMemory(path).records == snapshot
    assert resumed.state_dict() == ckpt


def test_resume_refuses_a_foreign_file(tmp_path):
    a = FailureMemory(tmp_path / "a.jsonl")
    a.add(0, make_traj(1), report())
    ckpt = a.state_dict()
    b = FailureMemory(tmp_path / "b.jsonl")
    b.add(0, make_traj(2), report("wrong_receptacle"))
    with pytest.raises(ValueError, match="restore the memory file"):
        b.load_state_dict(ckpt)
    empty = FailureMemory(tmp_path / "new.jsonl")
    st = empty.state_dict()
    assert st["n_records"] == 0
    empty.load_state_dict(st)
    assert len(empty) == 0


def test_digest_is_stable_and_sensitive():
    a, b = trajectory_digest(make_traj(1)), trajectory_digest(make_traj(1))
    assert a == b and len(a["hash"]) == 16
    assert trajectory_digest(make_traj(1, n=4))["hash"] != a["hash"]
    assert trajectory_digest(make_traj(1, n=40))["actions"].endswith("...")
