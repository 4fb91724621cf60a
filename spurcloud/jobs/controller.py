"""The web's one ControllerClient per process, built from settings.

ControllerClient keeps a pool of HTTP connections and remembers which replica answered
last, so it is shared. It is rebuilt when the settings it came from change (tests point
it at a controller they started)."""

from __future__ import annotations

import threading

from django.conf import settings

from scheduler.client import ControllerClient

_lock = threading.Lock()
_client: ControllerClient | None = None
_client_key: tuple[tuple[str, ...], str, float, float] | None = None


def controller_client() -> ControllerClient:
    global _client, _client_key
    key = (
        tuple(settings.SPUR_CONTROLLER_URLS),
        settings.SPUR_CLUSTER_TOKEN,
        float(settings.SPUR_CONTROLLER_TIMEOUT_S),
        float(settings.SPUR_CONTROLLER_RETRY_S),
    )
    with _lock:
        if _client is None or _client_key != key:
            if _client is not None:
                _client.close()
            _client = ControllerClient(list(key[0]), key[1], timeout=key[2], retry_for_s=key[3])
            _client_key = key
        return _client
