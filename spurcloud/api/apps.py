from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "spurcloud.api"
    label = "api"
    verbose_name = "API"

    def ready(self) -> None:
        # Registers the OpenAPI description of the token authentication with drf-spectacular.
        from spurcloud.api import schema  # noqa: F401
