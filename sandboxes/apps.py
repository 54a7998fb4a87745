from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"

    def ready(self) -> None:
        # Django's place for signal receivers: a template's image and root file system go
        # with its row, also when an organization's deletion cascades to it.
        from . import templates  # noqa: F401
