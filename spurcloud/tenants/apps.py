from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "spurcloud.tenants"
    label = "tenants"
    verbose_name = "Tenants"
