"""Performance model: parameter counts, FLOPs conventions, memory, step time, goodput (the planner is
``kilocard.planner``)."""
