"""Spur-Cloud, the Django project. Importing it loads the Celery app, so that
`celery -A spurcloud worker` and `shared_task` find it."""

from spurcloud.celery import app as celery_app

__all__ = ["celery_app"]
