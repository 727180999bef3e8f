"""What a plan says of itself in Python: a one-line repr (a plan holds thousands of tensors and steps) and
`Plan.report()`, the text of its arena, breakdown and training step."""
import planner


def test_a_plan_is_one_line_and_reports_itself():
    plan = planner.compile("zoo:lenet", {"input": (8, 1, 28, 28)}, training=True, optimizer="adam",
                           remat="mirror").verify()
    line = repr(plan)
    assert "\n" not in line and len(line) < 200 and line.startswith(f"<Plan {plan.strategy}, ")
    assert "training step with adam" in line and f"{len(plan.steps)} steps" in line
    text = plan.report()
    first, fullest, dtypes, training = text.splitlines()
    assert first.startswith(f"{plan.strategy} plan, {plan.schedule} schedule, fp32 (device any): arena ")
    assert f"{len(plan.tensors)} tensors" in first and "LOAD" in first
    step = plan.stats["fullest_step"]
    assert f"at its fullest step (step {step} of {len(plan.steps)}" in fullest
    assert all(f"{field} " in fullest for field in plan.breakdown)
    assert "by element type: float32" in dtypes
    assert training.startswith("training step with adam: 10 params trained") and "mirror recomputes" in training
    inference = planner.compile("zoo:mlp", {"input": (2, 784)})
    assert "inference" in repr(inference) and len(inference.report().splitlines()) == 3
