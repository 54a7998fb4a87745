"""Cloud sandbox adapters other than e2b (which lives in providers/e2b/).

One module per provider. Each imports its SDK lazily inside the adapter, so the
application runs without any of the optional extras installed; a missing SDK or
credential surfaces as ProviderNotConfigured when the provider is built.
"""
