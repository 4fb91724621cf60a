"""Design rules of billing, as tests: money is integers, and every money column says
its unit; the ledger cannot be edited from the admin."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import models
from django.test import RequestFactory

from spurcloud.billing.models import LedgerEntry


def test_no_billing_model_keeps_a_float_or_a_money_column_without_its_unit() -> None:
    for model in apps.get_app_config("billing").get_models():
        for field in model._meta.concrete_fields:
            assert not isinstance(field, models.FloatField), f"{model.__name__}.{field.name}"
            if field.is_relation:
                continue
            if any(word in field.name for word in ("amount", "balance", "price", "_hour")):
                assert field.name.endswith("_micro") or field.name.endswith("_seconds"), (
                    f"{model.__name__}.{field.name}: money is in micro-units, and says so"
                )
                assert isinstance(field, models.BigIntegerField), f"{model.__name__}.{field.name}"


@pytest.mark.django_db
def test_the_ledger_is_append_only_in_the_admin() -> None:
    request = RequestFactory().get("/admin/")
    ledger_admin = admin.site._registry[LedgerEntry]
    assert not ledger_admin.has_add_permission(request)
    assert not ledger_admin.has_change_permission(request)
    assert not ledger_admin.has_delete_permission(request)
