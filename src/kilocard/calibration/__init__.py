"""The performance model's calibration: published rows, the fit, its cross-validation and error band.

``baselines`` (published rows -> configs and the comparison), ``unstated`` (the policy for facts a
source does not state), ``fit`` (the free parameters fitted on the rows), ``crossval`` (leave one
source out), ``trust`` (the held-out error band ``plan`` and ``validate`` quote), ``series`` (scaling
series), ``site`` (a site's own runs as rows, and the refit on them). The model itself, the formulas
these modules fit, is ``kilocard.perf``; nothing there imports this package.
"""
