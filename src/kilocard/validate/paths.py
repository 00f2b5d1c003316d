"""Input files a run reads exist, checked before anything is launched (I/O: not a validator rule).

``validate`` is pure, so the file checks are this separate step, part of
``validate.inputpaths.input_path_issues`` (which ``validate``, ``run`` and ``sbatch`` call next to
it): every ``data.data_path`` prefix
(the prefixes of a weighted blend ``[w1, p1, w2, p2]`` too) must have its ``.bin`` and ``.idx``,
looked up as the trainer does (``kilocard.data.paths``: the current directory, then kilocard's
shipped root). A missing prefix is a ``DATA_PATH`` error naming its place in the list.
"""

from __future__ import annotations

from kilocard.config.schema import RunConfig
from kilocard.data.errors import DataError
from kilocard.data.paths import resolve_data_prefix, split_blend
from kilocard.validate.issues import Issue, error


def _issue(err: DataError, field: str, value: object) -> Issue:
    """A ``DATA_PATH`` error from a ``DataError`` (``<what>; fix: <how>``)."""
    what, how = err.parts()
    return error("DATA_PATH", field, value, what.removeprefix("data.data_path: "), how or f"change {field}")


def check_paths(cfg: RunConfig) -> list[Issue]:
    """``DATA_PATH`` errors for every ``data.data_path`` prefix without its ``.bin/.idx`` pair."""
    if cfg.data.type != "indexed":
        return []
    try:
        prefixes, weights = split_blend(cfg.data.data_path)
    except DataError as err:
        return [_issue(err, "data.data_path", list(cfg.data.data_path))]
    out = []
    for n, prefix in enumerate(prefixes):
        index = n if weights is None else 2 * n + 1
        try:
            resolve_data_prefix(prefix)
        except DataError as err:
            out.append(_issue(err, f"data.data_path[{index}]", prefix))
    return out
