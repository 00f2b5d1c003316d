"""Performance model: parameter counts, FLOPs conventions, memory, step time, planner."""
