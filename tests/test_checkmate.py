"""Checkmate's MILP: its plans check out (inputs present, held tensors kept, simulated peak within the
budget), and it finds the optimum a stage-by-stage brute force finds on tiny DAGs."""
import itertools
import math

import numpy as np
import pytest

from planner.remat import checkmate

MiB = 2**20


def training_chain(m):
    """Checkmate's linear benchmark: m forward nodes, the loss, m backward nodes; backward node j reads
    node j-1 and its forward mirror n-1-j."""
    n = 2 * m + 1
    return [[j - 1] * (j > 0) + [n - 1 - j] * (j > m) for j in range(n)]


def brute_force(sizes, costs, deps, budgets):
    """The least cost per budget (inf when none fits), by dynamic programming over the tensors held
    between stages, every R row and every held set enumerated; a stage's peak is simulate()'s on a
    schedule that is that stage alone."""
    n = len(sizes)
    moves = []  # (stage, held before, held after, cost, peak)
    for t in range(n):
        for held in itertools.product((0, 1), repeat=t):
            for again in itertools.product((0, 1), repeat=t):
                R, S = np.zeros((n, n), bool), np.zeros((n, n), bool)
                R[t, :t], R[t, t], S[t, :t] = again, True, held
                if any(not (R[t, i] or S[t, i]) for j in np.flatnonzero(R[t]) for i in deps[j]):
                    continue
                room = np.flatnonzero(R[t] | S[t]) if t + 1 < n else []
                for keep in itertools.product((0, 1), repeat=len(room)):
                    if t + 1 < n:
                        S[t + 1] = False
                        S[t + 1, room] = keep
                    moves.append((t, held, tuple(S[t + 1, :t + 1]) if t + 1 < n else (),
                                  checkmate.schedule_cost(R, costs), checkmate.simulate(R, S, sizes, deps)))
    best = {}
    for budget in budgets:
        cost = {(): 0.0}
        for t in range(n):
            after = {}
            for stage, held, kept, c, peak in moves:
                if stage == t and peak <= budget and held in cost:
                    after[kept] = min(after.get(kept, math.inf), cost[held] + c)
            cost = after
        best[budget] = cost.get((), math.inf)
    return best


def test_chain_with_room_for_everything_recomputes_nothing():
    deps = training_chain(8)
    n = len(deps)
    sol = checkmate.solve([MiB] * n, [1.0] * n, deps, n * MiB)
    checkmate.check(sol, [MiB] * n, deps)
    assert sol.feasible and sol.recompute_cost == 0 and sol.cost == n and sol.gap == 0


def test_chain_under_a_sqrt_budget_recomputes_and_fits():
    deps = training_chain(8)
    n = len(deps)
    budget = round(2 * math.sqrt(n)) * MiB
    sol = checkmate.solve([MiB] * n, [1.0] * n, deps, budget)
    checkmate.check(sol, [MiB] * n, deps)
    assert sol.feasible and sol.recompute_cost > 0 and sol.peak <= budget
    assert sol.cost == checkmate.schedule_cost(sol.R, [1.0] * n) == n + sol.recompute_cost


def test_budget_below_the_bound_is_infeasible():
    deps = training_chain(4)
    sizes = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    low = checkmate.min_budget(sizes, deps)
    assert low == 9 + 5 + 1  # node 5 reads nodes 4 and 3
    sol = checkmate.solve(sizes, [1.0] * len(sizes), deps, low - 1)
    assert not sol.feasible and sol.R is None and sol.cost == math.inf


def test_two_layer_training_chain_recomputes_the_first_activation():
    # f0 f1 loss g1(loss, f1) g0(g1, f0): in 3 units f0 cannot be held past the loss, so g0 recomputes it
    deps, sizes, costs = training_chain(2), [1] * 5, [2.0, 3.0, 1.0, 1.0, 1.0]
    tight = checkmate.solve(sizes, costs, deps, 3)
    checkmate.check(tight, sizes, deps)
    assert tight.recompute_cost == 2.0 and tight.R[4, 0] and tight.peak == 3
    assert checkmate.solve(sizes, costs, deps, 4).recompute_cost == 0


def test_diamond_matches_brute_force():
    # a -> b, a -> c, (b, c) -> d, (d, a) -> e, sizes 2 4 1 1 1: holding a beside b, c and d takes 8;
    # with 7, e recomputes a; with 6 (the bound), computing c beside a and b already takes 7
    deps, sizes, costs = [[], [0], [0], [1, 2], [3, 0]], [2, 4, 1, 1, 1], [1.0, 5.0, 5.0, 5.0, 1.0]
    budgets = range(checkmate.min_budget(sizes, deps), sum(sizes) + 1)
    assert brute_force(sizes, costs, deps, budgets) == {6: math.inf, 7: 18.0, 8: 17.0, 9: 17.0}
    assert not checkmate.solve(sizes, costs, deps, 6).feasible
    sol = checkmate.solve(sizes, costs, deps, 7)
    checkmate.check(sol, sizes, deps)
    assert sol.cost == 18.0 and sol.R[4, 0] and sol.R.sum() == 6
    assert checkmate.solve(sizes, costs, deps, 8).cost == 17.0


@pytest.mark.parametrize("seed", range(12))
def test_random_tiny_dags_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 5
    deps = [[]] + [sorted(rng.choice(k, size=min(k, rng.integers(1, 3)), replace=False).tolist())
                   for k in range(1, n)]
    sizes, costs = rng.integers(1, 5, n).tolist(), rng.integers(1, 6, n).astype(float).tolist()
    budgets = range(checkmate.min_budget(sizes, deps) - 1, sum(sizes) + 1)
    best = brute_force(sizes, costs, deps, budgets)
    for budget in budgets:
        sol = checkmate.solve(sizes, costs, deps, budget)
        assert sol.feasible == (best[budget] < math.inf), (budget, sol.status)
        if sol.feasible:
            checkmate.check(sol, sizes, deps)
            assert sol.cost == pytest.approx(best[budget])


def test_check_rejects_a_broken_plan():
    deps, sizes = training_chain(2), [1] * 5
    sol = checkmate.solve(sizes, [1.0] * 5, deps, 4)
    checkmate.check(sol, sizes, deps)
    sol.S[4, 3] = False  # g0 then reads g1, which nothing holds or computes
    with pytest.raises(ValueError, match="without its inputs"):
        checkmate.check(sol, sizes, deps)
    sol.S[4, 3] = True
    sol.budget = sol.peak - 1
    with pytest.raises(ValueError, match="budget"):
        checkmate.check(sol, sizes, deps)


def test_cpsat_finds_the_same_optimum():
    deps = training_chain(4)
    n = len(deps)
    sizes, costs = [MiB + 7] * n, [float(k + 1) for k in range(n)]
    budget = 5 * (MiB + 7) + 100
    milp = checkmate.solve(sizes, costs, deps, budget)
    cpsat = checkmate.solve(sizes, costs, deps, budget, solver="cpsat")
    checkmate.check(cpsat, sizes, deps)
    assert cpsat.gap == 0 and cpsat.cost == milp.cost and milp.recompute_cost > 0
