"""Billing through the web API (docs/architecture.md, "Billing"):

    GET  /api/v1/billing/balance             the organisation's credit (any member)
    GET  /api/v1/billing/prices              the price book in effect and to come (any member)
    GET  /api/v1/billing/ledger              credit entries, newest first   (owner, admin, billing)
    GET  /api/v1/billing/usage               usage records, newest first    (owner, admin, billing)
    POST /api/v1/billing/topups              a Stripe Checkout Session      (owner, billing)
    POST /api/v1/billing/portal              Stripe's customer portal       (owner, billing)
    GET  /api/v1/billing/invoices            monthly invoices               (owner, admin, billing)
    GET  /api/v1/billing/invoices/{id}       one, with its lines            (owner, admin, billing)
    GET  /api/v1/billing/invoices/{id}/html  printable                      (owner, admin, billing)
    GET  /api/v1/billing/invoices/{id}/pdf   printable PDF (billing_documents.py), and a
         .../invoices/{id}/credit-notes/{note}/pdf  credit note's          (owner, admin, billing)

Amounts are strings of decimal currency units (`"12.500000"`) beside their exact
integer micro-units. The organisation is the token's; another's invoice is a 404.
Reads need the `read` scope; a top-up, which only opens a payment page, the `jobs`
scope (the write scope tenants' tokens have).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from spurcloud.api.authentication import request_token, request_user
from spurcloud.api.views import AUTH, BAD, ClosedQueryApi, _error
from spurcloud.billing import ledger, selectors, stripe_payments
from spurcloud.billing.models import Invoice, LedgerEntry, PriceEntry, UsageRecord
from spurcloud.billing.money import to_decimal
from spurcloud.billing.stripe_payments import MICRO_PER_CENT
from spurcloud.tenants.models import Scope

MAX_LIMIT = 1000
ROLE = {403: _error("The token lacks the scope, or the user's role does not allow this.")}
INVOICE_MISSING = {404: _error("No such invoice here (or another organisation's).")}


def money_field(**kwargs: Any) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=20, decimal_places=6, **kwargs)


class BalanceSerializer(serializers.Serializer[Any]):
    currency = serializers.CharField()
    mode = serializers.ChoiceField(choices=["prepaid", "postpaid", "exempt"])
    balance = money_field()
    balance_micro = serializers.IntegerField()
    low_balance = money_field()
    credit_used_up = serializers.BooleanField(help_text="New jobs are refused (402).")
    depleted_at = serializers.DateTimeField(allow_null=True)


class PriceSerializer(serializers.ModelSerializer[PriceEntry]):
    class Meta:
        model = PriceEntry
        fields = [
            "gpu_model",
            "qos_class",
            "effective_from",
            "gpu_hour_micro",
            "cpu_hour_micro",
            "mem_gb_hour_micro",
        ]


class LedgerEntrySerializer(serializers.ModelSerializer[LedgerEntry]):
    class Meta:
        model = LedgerEntry
        fields = ["id", "kind", "amount_micro", "balance_after_micro", "description", "created_at"]


class UsageSerializer(serializers.ModelSerializer[UsageRecord]):
    job_id = serializers.IntegerField(source="run.job_id")
    attempt = serializers.IntegerField(source="run.attempt")

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "job_id",
            "attempt",
            "period_start",
            "period_end",
            "gpu_model",
            "qos_class",
            "gpu_milli_seconds",
            "amount_micro",
        ]


class InvoiceLineSerializer(serializers.Serializer[Any]):
    gpu_model = serializers.CharField()
    qos_class = serializers.CharField()
    gpu_milli_seconds = serializers.IntegerField()
    amount_micro = serializers.IntegerField()


class CreditNoteSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    number = serializers.CharField()
    amount_micro = serializers.IntegerField()
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()


class InvoiceSerializer(serializers.ModelSerializer[Invoice]):
    lines = InvoiceLineSerializer(many=True, read_only=True)
    credit_notes = CreditNoteSerializer(many=True, read_only=True)

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "period_start",
            "period_end",
            "currency",
            "total_micro",
            "lines",
            "credit_notes",
        ]


class PageQuery(serializers.Serializer[Any]):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT, default=100)
    before = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="From the previous next."
    )


def _page(request: Request, rows: Any, serializer: Any) -> Response:
    """A page of `rows` (ordered by id, newest first): `next` asks for the ones before."""
    query = PageQuery(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    limit, before = query.validated_data["limit"], query.validated_data.get("before")
    if before is not None:
        rows = rows.filter(pk__lt=before)
    items = list(rows.order_by("-pk")[: limit + 1])
    more = len(items) > limit
    items = items[:limit]
    following = None
    if more and items:
        following = request.build_absolute_uri(
            f"{request.path}?limit={limit}&before={items[-1].pk}"
        )
    return Response({"results": serializer(items, many=True).data, "next": following})


def _page_of(serializer: Any, name: str) -> Any:
    from drf_spectacular.utils import inline_serializer

    return inline_serializer(
        name=name,
        fields={"results": serializer(many=True), "next": serializers.URLField(allow_null=True)},
    )


class BalanceApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_balance",
        summary="The organisation's credit balance",
        responses={200: BalanceSerializer, **AUTH, **ROLE},
    )
    def get(self, request: Request) -> Response:
        organization = request_token(request).organization
        selectors.require_member(organization=organization, user=request_user(request))
        account = ledger.open_account(organization=organization)
        return Response(
            BalanceSerializer(
                {
                    "currency": settings.BILLING_CURRENCY,
                    "mode": account.mode,
                    "balance": to_decimal(account.balance_micro),
                    "balance_micro": account.balance_micro,
                    "low_balance": to_decimal(ledger.low_balance_micro(account)),
                    "credit_used_up": account.mode == "prepaid" and account.balance_micro <= 0,
                    "depleted_at": account.depleted_at,
                }
            ).data
        )


class PricesApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_prices",
        summary="The price book (per GPU-hour by model and QoS class, in micro-units)",
        responses={200: PriceSerializer(many=True), **AUTH},
    )
    def get(self, request: Request) -> Response:
        return Response(PriceSerializer(selectors.price_book()[:MAX_LIMIT], many=True).data)


class LedgerApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}
    query_parameters = frozenset(PageQuery().fields)

    @extend_schema(
        operation_id="billing_ledger",
        summary="Credit ledger entries, newest first",
        parameters=[PageQuery],
        responses={200: _page_of(LedgerEntrySerializer, "LedgerPage"), **BAD, **AUTH, **ROLE},
    )
    def get(self, request: Request) -> Response:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        return _page(request, selectors.ledger_of(organization=organization), LedgerEntrySerializer)


class UsageApi(ClosedQueryApi):
    class Query(PageQuery):
        since = serializers.DateTimeField(required=False, help_text="Periods ending after.")
        until = serializers.DateTimeField(required=False, help_text="Periods starting before.")

    required_scopes = {"GET": Scope.READ}
    query_parameters = frozenset(Query().fields)

    @extend_schema(
        operation_id="billing_usage",
        summary="Usage records (per job, attempt and period), newest first",
        parameters=[Query],
        responses={200: _page_of(UsageSerializer, "UsagePage"), **BAD, **AUTH, **ROLE},
    )
    def get(self, request: Request) -> Response:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        query = self.Query(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        records = selectors.usage_of(
            organization=organization,
            since=query.validated_data.get("since"),
            until=query.validated_data.get("until"),
        )
        return _page(request, records, UsageSerializer)


class TopUpSerializer(serializers.Serializer[Any]):
    # Whole cents (Checkout charges cents), within the site's bounds; the schema states
    # them, so a request it allows is one the service takes.
    amount_cents = serializers.IntegerField(
        min_value=-(-settings.BILLING_TOPUP_MIN_MICRO // MICRO_PER_CENT),
        max_value=settings.BILLING_TOPUP_MAX_MICRO // MICRO_PER_CENT,
        help_text="Credit to buy, in cents of the site's currency.",
    )


class TopUpAnswerSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    session_id = serializers.CharField()
    url = serializers.URLField(help_text="Stripe Checkout: send the user here to pay.")
    amount_micro = serializers.IntegerField()
    status = serializers.CharField()


class TopUpsApi(ClosedQueryApi):
    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        operation_id="billing_topup",
        summary="Top up credit: a Stripe Checkout Session for an amount you pick",
        request=TopUpSerializer,
        responses={
            201: TopUpAnswerSerializer,
            **BAD,
            **AUTH,
            **ROLE,
            502: _error("Stripe could not be reached or refused."),
        },
    )
    def post(self, request: Request) -> Response:
        body = TopUpSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        topup = stripe_payments.create_topup(
            organization=request_token(request).organization,
            user=request_user(request),
            amount_micro=body.validated_data["amount_cents"] * MICRO_PER_CENT,
            idempotency_key=request.headers.get("Idempotency-Key", "")[:100],
        )
        answer = {
            "id": topup.pk,
            "session_id": topup.session_id,
            "url": topup.url,
            "amount_micro": topup.amount_micro,
            "status": topup.status,
        }
        return Response(TopUpAnswerSerializer(answer).data, status=status.HTTP_201_CREATED)


class PortalApi(ClosedQueryApi):
    class Answer(serializers.Serializer[Any]):
        url = serializers.URLField(help_text="Stripe's customer portal: send the user here.")

    required_scopes = {"POST": Scope.JOBS}

    @extend_schema(
        operation_id="billing_portal",
        summary="A Stripe customer portal session (payment methods, receipts)",
        request=None,
        responses={
            201: Answer,
            **AUTH,
            **ROLE,
            502: _error("Stripe could not be reached or refused."),
        },
    )
    def post(self, request: Request) -> Response:
        url = stripe_payments.customer_portal_url(
            organization=request_token(request).organization, user=request_user(request)
        )
        return Response(self.Answer({"url": url}).data, status=status.HTTP_201_CREATED)


class InvoicesApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}
    query_parameters = frozenset(PageQuery().fields)

    @extend_schema(
        operation_id="billing_invoices",
        summary="Monthly invoices, newest first",
        parameters=[PageQuery],
        responses={200: _page_of(InvoiceSerializer, "InvoicePage"), **BAD, **AUTH, **ROLE},
    )
    def get(self, request: Request) -> Response:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        invoices = selectors.invoices_of(organization=organization).prefetch_related(
            "lines", "credit_notes"
        )
        return _page(request, invoices, InvoiceSerializer)


class InvoiceDetailApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_invoice",
        summary="One invoice with its lines",
        responses={200: InvoiceSerializer, **AUTH, **ROLE, **INVOICE_MISSING},
    )
    def get(self, request: Request, invoice_id: int) -> Response:
        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        invoice = selectors.access_invoice(organization=organization, invoice_id=invoice_id)
        return Response(InvoiceSerializer(invoice).data)


class InvoiceHtmlApi(ClosedQueryApi):
    required_scopes = {"GET": Scope.READ}

    @extend_schema(
        operation_id="billing_invoice_html",
        summary="One invoice as a printable HTML page",
        responses={
            (200, "text/html"): OpenApiResponse(description="The invoice, printable."),
            **AUTH,
            **ROLE,
            **INVOICE_MISSING,
        },
    )
    def get(self, request: Request, invoice_id: int) -> HttpResponse:
        from spurcloud.billing.invoices import invoice_html

        organization = request_token(request).organization
        selectors.require_reader(organization=organization, user=request_user(request))
        invoice = selectors.access_invoice(organization=organization, invoice_id=invoice_id)
        return HttpResponse(invoice_html(invoice), content_type="text/html; charset=utf-8")
