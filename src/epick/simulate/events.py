"""The kinds of event in a fleet's queue, in virtual time."""

ARRIVE, ENGINE, DISPATCH, KV_EVENTS, RESTART, RETURN, FIRST_TOKEN = 0, 1, 2, 3, 4, 5, 6
# Events that do not keep a run going on their own.
BACKGROUND = (KV_EVENTS, RESTART, RETURN, FIRST_TOKEN)
PREFILL_SUFFIX = "#prefill"  # of the id of a request's prefill part
