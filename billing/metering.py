"""Placeholder until the billing helper lands its implementation."""
