"""`spurcloud manage seed_demo`: a ready-to-use demo tenant, for `spurcloud up` and for
trying the platform. Idempotent: run it again and it reuses the organisation and the admin,
sets the password again (the generated one is printed, so it must be the valid one) and
replaces its own API token (a stored token's secret cannot be shown again).

Prints one JSON line on stdout, `{"email", "password", "token", "organization"}`, for a
supervisor to parse; nothing else goes to stdout."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from spurcloud.billing.models import BillingAccount
from spurcloud.billing.services import set_billing_mode
from spurcloud.tenants.models import ApiToken, Membership, Organization, Scope
from spurcloud.tenants.services import (
    add_member,
    create_api_token,
    create_organization,
    revoke_api_token,
)

TOKEN_NAME = "seed_demo"


class Command(BaseCommand):
    help = "Create (or refresh) the demo organisation, its admin and an API token."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--organization", default="demo", help="Organisation slug.")
        parser.add_argument("--email", default="admin@example.com")
        parser.add_argument("--username", default="admin")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        slug, email, username = options["organization"], options["email"], options["username"]
        password = os.environ.get("SPUR_ADMIN_PASSWORD") or secrets.token_urlsafe(12)

        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_superuser(username=username, email=email, password=password)
        else:
            user.email = email
            user.is_staff = user.is_superuser = user.is_active = True
            user.set_password(password)
            user.save()
        # Verified, so the login works whatever ACCOUNT_EMAIL_VERIFICATION says.
        EmailAddress.objects.update_or_create(
            user=user, email=email, defaults={"verified": True, "primary": True}
        )

        organization = Organization.objects.filter(slug=slug).first()
        if organization is None:
            organization = create_organization(name=slug.capitalize(), owner=user, slug=slug)
        elif not Membership.objects.filter(
            user=user, organization=organization, role=Membership.Role.OWNER
        ).exists():
            add_member(organization=organization, user=user, role=Membership.Role.OWNER)

        # The demo is not billed: nothing it runs is ever refused for credit.
        set_billing_mode(organization=organization, mode=BillingAccount.Mode.EXEMPT)

        for old in ApiToken.objects.filter(
            user=user, organization=organization, name=TOKEN_NAME, revoked_at__isnull=True
        ).select_related("organization"):
            revoke_api_token(token=old, by=user)
        # The CLI's token: reads and jobs. The demo admin is an operator, but operator
        # powers (the admin scope) are for tokens made on purpose, in the portal.
        _, secret = create_api_token(
            user=user,
            organization=organization,
            name=TOKEN_NAME,
            scopes={Scope.READ, Scope.JOBS},
        )

        self.stdout.write(
            json.dumps(
                {
                    "email": email,
                    "password": password,
                    "token": secret,
                    "organization": organization.slug,
                }
            )
        )
