from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's place for signal receivers: a changed or deleted API key is re-read by
        # every process that cached it.
        from . import keycache  # noqa: F401
