from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "spurcloud.portal"
    label = "portal"
    verbose_name = "Portal"
