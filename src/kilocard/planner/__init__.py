"""``kilocard plan``: the layout search and ranking (``search``) and its figures (``plots``); above validate."""
