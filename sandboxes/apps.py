from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
