from django.apps import AppConfig

from .authentication_reads import read_at_authentication


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's place for signal receivers: a changed or deleted API key is re-read by
        # every process that cached it, and a changed organization likewise (orgcache), the
        # epoch that says so riding in the authentication's round trip.
        from . import keycache, orgcache  # noqa: F401

        read_at_authentication(orgcache.keys_for)
