"""``python -m kilocard.train <run_dir>``: the per-rank training entry (see ``kilocard.train.entry``)."""

import os

from kilocard.base.lifeline import die_with_parent  # noqa: E402  (imports no torch)
from kilocard.base.quickexit import exit_now  # noqa: E402  (imports no torch)

# No rank outlives its launcher (torchrun, ft_launcher, srun's step daemon): SIGKILL when it dies.
die_with_parent(os.getppid())

from kilocard.base.quiet import quiet_library_warnings  # noqa: E402

quiet_library_warnings()  # before torch and Megatron-Core import: no copy of their notes per rank
# The stop flag first: a USR1/TERM that arrives while the heavy modules import is kept, not fatal.
from kilocard.train.signals import StopFlag  # noqa: E402  (imports no torch)

_early = StopFlag()
_early.install()

from kilocard.train import entry  # noqa: E402

code = entry.main(stop=_early)
_early.settle()  # the outcome is decided: a USR1 from here on must not kill the rank as Python shuts down
exit_now(code)  # without the interpreter's teardown of torch and Megatron-Core (about 1 CPU-s a rank)
