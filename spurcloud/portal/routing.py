from django.urls import path, re_path

from spurcloud.portal.consumers import JobsConsumer
from spurcloud.portal.jupyter_proxy import PATH_PATTERN, JupyterProxyConsumer
from spurcloud.portal.output_consumer import JobOutputConsumer
from spurcloud.portal.terminal_consumer import SessionTerminalConsumer

websocket_urlpatterns = [
    path("ws/jobs/", JobsConsumer.as_asgi()),
    # At most 18 digits, as everywhere a job id is in a path: always a 64-bit id.
    re_path(r"^ws/jobs/(?P<job_id>[0-9]{1,18})/output/$", JobOutputConsumer.as_asgi()),
    re_path(r"^ws/sessions/(?P<job_id>[0-9]{1,18})/terminal/$", SessionTerminalConsumer.as_asgi()),
    # A session's JupyterLab: its websockets, at the path of its pages (jupyter_proxy.py).
    re_path(PATH_PATTERN, JupyterProxyConsumer.as_asgi()),
]
