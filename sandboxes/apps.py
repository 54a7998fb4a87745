from django.apps import AppConfig

from accounts.authentication_reads import read_for_requests

from .row_cache import keys_for_request


class SandboxesConfig(AppConfig):
    name = "sandboxes"

    def ready(self) -> None:
        # Django's place for signal receivers: a template's image and root file system go
        # with its row, also when an organization's deletion cascades to it.
        from . import templates  # noqa: F401

        # A GET of a sandbox reads the generation of the row it may have cached (row_cache)
        # in its authentication's Redis round trip.
        read_for_requests(keys_for_request)
