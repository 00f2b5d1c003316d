"""Performance model: parameter counts, FLOPs conventions, memory, step time, goodput (its calibration on
published and site rows is ``kilocard.calibration``; the planner is ``kilocard.planner``)."""
