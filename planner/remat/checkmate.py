"""Optimal rematerialisation as an integer program (Checkmate, Jain et al. 2020; REFERENCE.md §5):
which tensors of a DAG to recompute, and when, to fit a memory budget at the least compute.

Plain data in: node k (of a topological order 0..n-1) produces one tensor of sizes[k] bytes at
costs[k] and reads the nodes deps[k]; the last node is the sink. Stage t computes node t (R[t,t] = 1)
and whatever it recomputes (R[t,i]), reading the tensors kept from the stage before (S[t,i]).
"""
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize, sparse

from ..errors import require


@dataclass
class Solution:
    """A solve's outcome. R[t,i]: node i computed in stage t; S[t,i]: its tensor held entering stage t
    (None when infeasible). cost counts every computation, the first of each node included; peak is
    the plan's peak bytes (max U, recomputed exactly from R and S); gap is the solver's relative MIP gap."""
    feasible: bool
    cost: float
    recompute_cost: float
    R: np.ndarray
    S: np.ndarray
    peak: int
    gap: float
    status: str
    seconds: float
    budget: int


def min_budget(sizes, deps):
    """A lower bound on any feasible budget: computing node k holds its tensor and all its inputs at
    once. The least feasible budget can be higher (tensors kept across a stage also count)."""
    return max(sizes[k] + sum(sizes[i] for i in set(deps[k])) for k in range(len(sizes)))


def schedule_cost(R, costs):
    """The compute of a schedule: every computation R[t,i] at costs[i]."""
    return float(np.asarray(R, float).sum(axis=0) @ np.asarray(costs, float))


def keep_all(deps):
    """R and S of the schedule that recomputes nothing: stage t computes node t alone, and each tensor
    is held from its node to its last reader."""
    n, last = len(deps), np.array(_last_readers(_users(deps)))
    t = np.arange(n)[:, None]
    return np.eye(n, dtype=bool), (t > np.arange(n)) & (t <= last)


def simulate(R, S, sizes, deps, inplace=None):
    """The peak bytes of schedule R/S under Checkmate's accounting: a stage starts holding S[t],
    allocates each tensor it computes, and frees a tensor (input or output) after the last node of the
    stage that reads it, unless S[t+1] keeps it. A tensor both held and recomputed counts twice.
    Node k with inplace[k] = p writes over p's tensor when that is freed at k: p is freed first."""
    n, users, inplace = len(sizes), _users(deps), inplace or {}
    peak = 0
    for t in range(n):
        kept = S[t + 1] if t + 1 < n else np.zeros(n, bool)
        mem = sum(sizes[i] for i in range(t) if S[t, i])
        for k in range(t + 1):
            if not R[t, k]:
                continue
            gone = [i for i in set(deps[k]) | {k} if not kept[i] and not any(R[t, j] for j in users[i] if k < j <= t)]
            if inplace.get(k) in gone:
                mem -= sizes[inplace[k]]
                gone.remove(inplace[k])
            mem += sizes[k]
            peak = max(peak, mem)
            mem -= sum(sizes[i] for i in gone)
    return peak


def check(solution, sizes, deps, inplace=None):
    """Raise ValueError unless the solution is a valid schedule: stage t computes node t and nothing
    later, every computation's inputs are computed earlier in its stage or held, a held tensor was
    computed or held the stage before, and the schedule's peak fits the budget and matches `peak`."""
    R, S, n = solution.R, solution.S, len(sizes)
    if not solution.feasible:
        raise ValueError(f"no schedule to check: {solution.status}")
    if R.shape != (n, n) or S.shape != (n, n):
        raise ValueError(f"R and S must be {n}x{n}")
    if np.triu(R, 1).any() or not np.diagonal(R).all() or np.triu(S).any():
        raise ValueError("stage t must compute node t, nothing after it, and hold only earlier nodes")
    for t in range(n):
        for j in np.flatnonzero(R[t]):
            missing = [i for i in deps[j] if not (R[t, i] or S[t, i])]
            if missing:
                raise ValueError(f"stage {t} computes {j} without its inputs {missing}")
        if t + 1 < n and (S[t + 1] & ~(R[t] | S[t])).any():
            raise ValueError(f"stage {t + 1} holds tensors stage {t} had not")
    peak = simulate(R, S, sizes, deps, inplace)
    if peak != solution.peak or peak > solution.budget:
        raise ValueError(f"peak {peak} bytes (solution says {solution.peak}, budget {solution.budget})")


def solve(sizes, costs, deps, budget, time_limit=60.0, solver="milp", allowed=None, inplace=None):
    """The least-compute schedule whose peak fits `budget` bytes: Checkmate's MILP solved by HiGHS
    (scipy.optimize.milp) or, with solver="cpsat", by OR-Tools CP-SAT (memory counted in units of
    ceil(budget / 2**20) bytes, sizes rounded up: conservative). `allowed` (n x n bool) limits
    recomputation: stage t may compute node i < t again only where allowed[t, i] (default: anywhere);
    `inplace` {k: p}: node k writes over node p's tensor when p is freed at k (see simulate).
    Infeasible budgets give feasible=False."""
    start, n = time.perf_counter(), len(sizes)
    allowed = np.ones((n, n), bool) if allowed is None else np.asarray(allowed, bool)
    inplace = inplace or {}
    if solver not in ("milp", "cpsat"):
        raise ValueError(f"unknown solver {solver!r}; choose milp or cpsat")
    if budget < min_budget(sizes, deps):
        return _infeasible(budget, "budget below min_budget", start)
    if solver == "milp":
        scale = max(max(sizes), 1)
        model = _model([s / scale for s in sizes], deps, budget / scale, allowed, inplace)
        x, status, gap = _milp(model, costs, time_limit)
    else:
        unit = max(1, math.ceil(budget / 2**20))
        model = _model([math.ceil(s / unit) for s in sizes], deps, budget // unit, allowed, inplace)
        x, status, gap = _cpsat(model, costs, time_limit)
    if x is None:
        return _infeasible(budget, status, start)
    R, S = np.zeros((n, n), bool), np.zeros((n, n), bool)
    R[np.tril_indices(n)] = x[model["r"]] > 0.5
    S[np.tril_indices(n, -1)] = x[model["s"]] > 0.5
    cost, peak = schedule_cost(R, costs), simulate(R, S, sizes, deps, inplace)
    if peak > budget:
        return _infeasible(budget, f"{status}; the rounded plan needs {peak} bytes", start)
    return Solution(True, cost, cost - float(sum(costs)), R, S, peak, gap, status, time.perf_counter() - start, budget)


def _infeasible(budget, status, start):
    return Solution(False, math.inf, math.inf, None, None, 0, math.inf, status, time.perf_counter() - start, budget)


def _last_readers(users):
    """For each node, the last node that reads its tensor (itself when none does)."""
    return [max([k] + users[k]) for k in range(len(users))]


def _users(deps):
    users = [[] for _ in deps]
    for k, ins in enumerate(deps):
        for i in set(ins):
            users[i].append(k)
    return users


def _model(mem, deps, cap, allowed, inplace):
    """Checkmate's MILP over [R | S | U | FREE] (R, S and U lower-triangular, row by row; FREE per
    stage t, node k <= t and tensor i in deps[k] + {k}): a sparse constraint matrix with row bounds,
    variable bounds and which variables are binary, for memory `mem` per node and U <= `cap`.

    Exact reductions where `allowed` fixes R[t, k] at 0: such a k frees nothing (no FREE variables),
    U[t, k] equals the U before it (U kept only where stage t may compute), its input rows hold
    trivially (left out); a tensor never recomputed whose readers are never recomputed is held from
    its node to its last reader, no longer (S fixed)."""
    n, users = len(mem), _users(deps)
    may = np.tril(allowed, -1) | np.eye(n, dtype=bool)  # where R[t, k] can be 1
    r, s, u = (np.full((n, n), -1) for _ in range(3))
    nr = n * (n + 1) // 2
    r[np.tril_indices(n)] = np.arange(nr)
    s[np.tril_indices(n, -1)] = nr + np.arange(nr - n)
    u[np.tril_indices(n)] = 2 * nr - n + np.arange(nr)
    frees = [(t, i, k) for t in range(n) for k in np.flatnonzero(may[t]) for i in sorted(set(deps[k]) | {k})]
    f0 = 3 * nr - n
    freed, early = {}, {}
    for f, (t, i, k) in enumerate(frees):
        (early if inplace.get(k) == i else freed).setdefault((t, k), []).append((f0 + f, mem[i]))
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(terms, lb, ub):
        for col, val in terms:
            rows.append(len(lo))
            cols.append(col)
            vals.append(val)
        lo.append(lb)
        hi.append(ub)

    last = _last_readers(users)
    recomputed = may.sum(axis=0) > 1
    fixed = ~recomputed & np.array([not recomputed[users[k]].any() for k in range(n)], bool)
    for t in range(n):
        for j in np.flatnonzero(may[t]):  # inputs computed or held: R[t,j] <= R[t,i] + S[t,i]
            for i in set(deps[j]):
                row([(r[t, j], 1), (r[t, i], -1), (s[t, i], -1)], -np.inf, 0)
        for i in range(t + 1 if t + 1 < n else 0):  # held tensors: S[t+1,i] <= R[t,i] + S[t,i]
            if not fixed[i]:
                row([(s[t + 1, i], 1), (r[t, i], -1)] + ([(s[t, i], -1)] if i < t else []), -np.inf, 0)
        # memory after each computation: U[t,k] = U[t,k'] + mem[k] R[t,k] - freed after k' (k' the
        # stage's computation before k), the first U[t,k] = mem[k] R[t,k] + sum_i mem[i] S[t,i]
        before = None
        for k in np.flatnonzero(may[t]):
            held = [(s[t, i], -mem[i]) for i in range(t)] if before is None else \
                [(u[t, before], -1)] + freed.get((t, before), [])
            row([(u[t, k], 1), (r[t, k], -mem[k])] + held + early.get((t, k), []), 0, 0)
            before = k
    for f, (t, i, k) in enumerate(frees):
        # FREE[t,i,k] = 1 exactly when h = (1 - R[t,k]) + S[t+1,i] + sum_{j in users(i), k<j<=t} R[t,j]
        # is 0: 1 - FREE <= h <= kappa (1 - FREE), kappa = len(terms) the most h can be (terms = h - 1)
        terms = [(r[t, k], -1)] + ([(s[t + 1, i], 1)] if t + 1 < n else []) + \
            [(r[t, j], 1) for j in users[i] if k < j <= t and may[t, j]]
        row([(c, -v) for c, v in terms] + [(f0 + f, -1)], -np.inf, 0)
        row(terms + [(f0 + f, len(terms))], -np.inf, len(terms) - 1)
    nvar = f0 + len(frees)
    lb, ub = np.zeros(nvar), np.ones(nvar)
    lb[np.diagonal(r)] = 1
    ub[r[~may & (r >= 0)]] = 0
    t, i = np.tril_indices(n, -1)
    hold = fixed[i] & (t <= np.array(last)[i])
    lb[s[t[hold], i[hold]]] = 1
    ub[s[t[fixed[i] & ~hold], i[fixed[i] & ~hold]]] = 0
    ub[u[np.tril_indices(n)]] = cap
    binary = np.ones(nvar, int)
    binary[u[np.tril_indices(n)]] = 0
    return {"A": sparse.csr_array((vals, (rows, cols)), shape=(len(lo), nvar)), "lo": np.array(lo), "hi": np.array(hi),
            "lb": lb, "ub": ub, "binary": binary, "r": r[np.tril_indices(n)], "s": s[np.tril_indices(n, -1)]}


def _milp(model, costs, time_limit):
    """HiGHS through scipy: (x or None, status text, relative gap)."""
    c = np.zeros(len(model["lb"]))
    c[model["r"]] = _stage_costs(costs)
    res = optimize.milp(c / max(c.max(), 1e-300), integrality=model["binary"],
                        bounds=optimize.Bounds(model["lb"], model["ub"]),
                        constraints=optimize.LinearConstraint(model["A"], model["lo"], model["hi"]),
                        options={"time_limit": time_limit})
    gap = 0.0 if res.status == 0 else (res.mip_gap if res.mip_gap is not None else math.inf)
    return res.x, res.message, gap


def _cpsat(model, costs, time_limit):
    """OR-Tools CP-SAT on the same rows (all coefficients integral): (x or None, status, relative gap)."""
    cp_model = require("ortools.sat.python.cp_model", "MEMPLAN_REMAT_SOLVER=cpsat", "OR-Tools", "solver")
    m = cp_model.CpModel()
    x = [m.new_int_var(int(lb), int(ub), f"x{v}") for v, (lb, ub) in enumerate(zip(model["lb"], model["ub"]))]
    A = model["A"]
    for k in range(A.shape[0]):
        lo, hi = A.indptr[k], A.indptr[k + 1]
        expr = cp_model.LinearExpr.weighted_sum([x[j] for j in A.indices[lo:hi]], [int(a) for a in A.data[lo:hi]])
        m.add_linear_constraint(expr, int(max(model["lo"][k], -2**62)), int(min(model["hi"][k], 2**62)))
    m.minimize(cp_model.LinearExpr.weighted_sum([x[j] for j in model["r"]], list(_stage_costs(costs))))
    engine = cp_model.CpSolver()
    engine.parameters.max_time_in_seconds = time_limit
    status = engine.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, engine.status_name(status), math.inf
    bound, value = engine.best_objective_bound, engine.objective_value
    gap = 0.0 if status == cp_model.OPTIMAL else abs(value - bound) / max(abs(value), 1e-300)
    return np.array([engine.value(v) for v in x], float), engine.status_name(status), gap


def _stage_costs(costs):
    """costs[i] for every R[t,i], in R's order (row by row, i <= t)."""
    n = len(costs)
    return np.asarray(costs, float)[np.tril_indices(n)[1]]
