from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.utils import timezone

from spurcloud.tenants.models import DEFAULT_SCOPES, SCOPE_ORDER, Membership, Scope

# How long a new token lives: the choices offered, in days ("" for never).
TOKEN_LIFETIMES = [("30", "30 days"), ("90", "90 days"), ("365", "a year"), ("", "never")]


class OrganizationForm(forms.Form):
    name = forms.CharField(max_length=200, label="Organisation name")


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, label="Token name", help_text="Where it will be used, e.g. laptop."
    )
    scopes = forms.MultipleChoiceField(
        label="May",
        widget=forms.CheckboxSelectMultiple,
        initial=sorted(DEFAULT_SCOPES),
        help_text="What the token may do; give it no more than it needs.",
    )
    expires_in_days = forms.ChoiceField(
        label="Expires in", choices=TOKEN_LIFETIMES, initial="90", required=False
    )

    def __init__(self, *args: Any, staff: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The admin scope is for operators' tokens only; others are not offered it.
        offered = [s for s in SCOPE_ORDER if staff or s is not Scope.ADMIN]
        field = self.fields["scopes"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(s.value, s.label) for s in offered]

    def expires_at(self) -> datetime | None:
        days = self.cleaned_data.get("expires_in_days") or ""
        return timezone.now() + timedelta(days=int(days)) if days else None


class InvitationForm(forms.Form):
    email = forms.EmailField(label="Email", help_text="Whom the invitation is for.")
    role = forms.ChoiceField(
        choices=[
            (Membership.Role.MEMBER, "Member"),
            (Membership.Role.ADMIN, "Admin"),
            (Membership.Role.BILLING, "Billing (sees jobs and bills, runs nothing)"),
        ],
        initial=Membership.Role.MEMBER,
    )
