from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "spurcloud.billing"
    label = "billing"
    verbose_name = "Billing"
