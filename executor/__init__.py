"""memplan's executor: runs a Plan out of one preallocated arena (see issue: executor)."""
