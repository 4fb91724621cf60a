"""Stripe's webhook endpoint: POST /billing/stripe/webhook.

The body is read raw (the signature covers its exact bytes) and bounded; the
signature is verified before anything is parsed or stored (stripe_payments)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from spurcloud.billing.errors import BillingRefused, PaymentProviderError
from spurcloud.billing.stripe_payments import receive_webhook

MAX_BODY = 256 * 1024  # Stripe's events are a few kilobytes


@csrf_exempt  # Stripe signs the body; there is no session or form to forge
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        length = -1
    if not 0 < length <= MAX_BODY:
        return JsonResponse({"detail": "body missing or too large", "code": "invalid"}, status=400)
    signature = request.headers.get("Stripe-Signature", "")
    try:
        new = receive_webhook(payload=request.body, signature=signature)
    except BillingRefused as exc:
        return JsonResponse({"detail": exc.message, "code": "invalid"}, status=400)
    except PaymentProviderError as exc:
        return JsonResponse({"detail": exc.message, "code": "unavailable"}, status=503)
    return JsonResponse({"received": True, "duplicate": not new})
