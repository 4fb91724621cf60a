"""A websocket test client over asgiref's ApplicationCommunicator.

channels.testing.WebsocketCommunicator does the same, but importing `channels.testing`
imports daphne (for its live-server test case), which this project does not install."""

from __future__ import annotations

import json
from typing import Any

from asgiref.testing import ApplicationCommunicator


class WebsocketClient(ApplicationCommunicator):
    def __init__(self, application: Any, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        scope = {
            "type": "websocket",
            "path": path,
            "query_string": b"",
            "headers": headers,
            "subprotocols": [],
        }
        super().__init__(application, scope)

    async def connect(self, timeout: float = 5) -> tuple[bool, Any]:
        """(True, subprotocol) when accepted, (False, close code) when turned away."""
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(timeout)
        if response["type"] == "websocket.close":
            return False, response.get("code", 1000)
        assert response["type"] == "websocket.accept"
        return True, response.get("subprotocol")

    async def receive_json_from(self, timeout: float = 5) -> Any:
        response = await self.receive_output(timeout)
        assert response["type"] == "websocket.send", response
        return json.loads(response["text"])

    async def receive_nothing(self, timeout: float = 0.2) -> bool:
        """True when the application sent nothing within `timeout`."""
        return bool(await super().receive_nothing(timeout))

    async def disconnect(self, code: int = 1000, timeout: float = 5) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": code})
        await self.wait(timeout)
