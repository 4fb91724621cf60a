from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "spurcloud.jobs"
    label = "jobs"
    verbose_name = "Jobs"
