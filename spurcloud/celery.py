"""The Celery app: `celery -A spurcloud worker`.

Its configuration is the `CELERY_*` part of spurcloud/settings.py (broker, acks_late,
reject_on_worker_lost). The controller sends tasks to it by name (`spur.launch_jobs`,
`spur.signal_job`, `spur.job_events`; see docs/architecture.md) without importing Django.
"""

from __future__ import annotations

import os

from celery import Celery

from scheduler import filequeue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")

filequeue.register()  # filesystem:// writes whole messages only (see scheduler/filequeue.py)
app = Celery("spurcloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
