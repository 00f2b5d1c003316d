"""The exit-code policy of every ``kilocard`` verb (one table; docs/validate.md, "Commands and exit codes",
says the same).

| code | name    | meaning                                                                        |
|------|---------|--------------------------------------------------------------------------------|
| 0    | OK      | the verb did its job                                                           |
| 1    | INVALID | the input was understood but refused (an invalid config, no layout fits, a     |
|      |         | submission that Slurm refused) or the verb's job failed; also an unexpected    |
|      |         | error (a bug), as one line naming it (``KILOCARD_DEBUG=1``: the traceback)     |
| 2    | USAGE   | the input cannot be used: a bad flag, a config that does not compose, an       |
|      |         | unreadable or unsafe file, a run directory that cannot be resumed              |
| 130  | INTERRUPTED | Ctrl-C before anything was started                                         |
| 141  | PIPE    | the reader of stdout went away (``| head``): the verb stops quietly, as a Unix  |
|      |         | tool ended by SIGPIPE does (128 + 13)                                          |

``kilocard run`` returns these until the ranks start; from then on it returns the trainer's own
codes (the one table ``kilocard.exitcodes.TABLE``: ``exitcodes.listing()`` names them all).
"""

from __future__ import annotations

OK = 0
INVALID = 1
USAGE = 2
INTERRUPTED = 130
PIPE = 141
