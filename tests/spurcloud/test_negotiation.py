"""The API's content negotiation (spurcloud/api/negotiation.py) answers what DRF's own
answers, for the requests it answers at once and for those it leaves to DRF."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer, TemplateHTMLRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from spurcloud.api.negotiation import JsonFirstNegotiation
from spurcloud.api.renderers import FastJSONRenderer


class CsvRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"


def _request(accept: str | None, query: str = "") -> Request:
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    return Request(APIRequestFactory().get(f"/api/v1/jobs{query}", **headers))


def _answer(negotiation: Any, request: Request, renderers: list[BaseRenderer]) -> Any:
    try:
        renderer, media_type = negotiation.select_renderer(request, renderers)
    except NotAcceptable:
        return "406"
    return type(renderer), media_type


@pytest.mark.parametrize(
    ("accept", "query"),
    [
        (None, ""),
        ("*/*", ""),
        ("application/json", ""),
        ("application/json; indent=4", ""),
        ("text/html", ""),  # refused: 406
        ("text/csv, */*;q=0.1", ""),
        ("*/*", "?format=csv"),
        ("*/*", "?format=json"),
    ],
)
@pytest.mark.parametrize(
    "renderers",
    [
        [FastJSONRenderer()],
        [FastJSONRenderer(), CsvRenderer()],
        [TemplateHTMLRenderer(), JSONRenderer()],  # a page first: DRF's choice
    ],
    ids=["json", "json-csv", "html-json"],
)
def test_it_answers_as_drfs_own(
    accept: str | None, query: str, renderers: list[BaseRenderer]
) -> None:
    try:
        expected = _answer(DefaultContentNegotiation(), _request(accept, query), renderers)
    except Exception as exc:  # DRF's 404 for an unknown ?format=
        with pytest.raises(type(exc)):
            _answer(JsonFirstNegotiation(), _request(accept, query), renderers)
        return
    assert _answer(JsonFirstNegotiation(), _request(accept, query), renderers) == expected
