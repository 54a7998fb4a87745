"""Plumbing every app shares: the one error shape, input checks, pagination, parsers, logging,
metric counters, the database-connection helper. It imports no app of this project
(tests/playground/test_layering.py holds that), so any app may import it."""
