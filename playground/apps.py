from django.apps import AppConfig


class PlaygroundConfig(AppConfig):
    name = "playground"

    def ready(self) -> None:
        from . import schema  # noqa: F401 - registers the OpenAPI auth extensions
