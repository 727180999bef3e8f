"""Every ONNX backend node case is run (tests/test_node_run.py) or not, for a reason said here."""
from node_cases import all_cases, supported_cases, why_not_run


def test_every_case_runs_or_has_a_reason():
    run = {c.name for c in supported_cases()}
    unexplained = sorted(c.name for c in all_cases() if c.name not in run and why_not_run(c) is None)
    assert not unexplained, f"{len(unexplained)} cases neither run nor refused with a reason: {unexplained[:20]}"


def test_most_cases_run():
    assert len(supported_cases()) / len(all_cases()) > 0.9
