from django.apps import AppConfig

from accounts.authentication_reads import read_at_authentication


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # Models are loaded only now (Django's documented place for such imports).
        from .metering import period_keys_for

        # A metered request's period state rides in its authentication's Redis round trip.
        read_at_authentication(period_keys_for)
