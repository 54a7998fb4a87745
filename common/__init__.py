"""Plumbing every app shares: the one error shape, input and output serializers, content
negotiation, pagination, parsers, logging, metric counters, the database-connection helper,
row statements written once, PostgreSQL's timestamp loader and per-request Redis commands.
It imports no app of this project (tests/playground/test_layering.py holds that), so any app
may import it."""
