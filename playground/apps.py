from django.apps import AppConfig
from django.db.backends.signals import connection_created

from common.pg_timestamps import on_connection_created


class PlaygroundConfig(AppConfig):
    name = "playground"

    def ready(self) -> None:
        from . import schema  # noqa: F401 - registers the OpenAPI auth extensions

        connection_created.connect(on_connection_created, dispatch_uid="pg_timestamps")
