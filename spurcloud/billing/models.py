"""Billing data: the price book, what each job attempt held and has been charged
(`MeteredRun`, its `UsageRecord`s per period), each organisation's credit ledger and
its cached balance, Stripe top-ups and events, and monthly invoices.

Money is an integer count of micro-units of `settings.BILLING_CURRENCY` (1 USD =
1,000,000) everywhere, never a float. The invariants are database constraints: one run
per (job, attempt), one usage record per (run, period start), one ledger entry per key
(a Stripe session, a sign-up grant), one row per Stripe event id.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from spurcloud.billing.errors import ImmutableRecord
from spurcloud.tenants.models import Organization

MICRO = 1_000_000  # micro-units in one unit of the currency


class AppendOnly(models.Model):
    """A record of money, written once: saving it again or deleting it through the ORM
    is refused here, and on PostgreSQL a trigger refuses UPDATE and DELETE of its rows
    from anywhere (migration 0007; `SET LOCAL spur.allow_money_edit = 'on'` lets a
    deliberate repair through, in its own transaction)."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRecord(
                f"a {self._meta.verbose_name} is never edited: correct it with a new record"
            )
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ImmutableRecord(f"a {self._meta.verbose_name} is never deleted")


class QosClass(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    SPOT = "spot", "Spot (preemptible)"


class PriceEntry(models.Model):
    """A price from `effective_from` until the next entry of the same GPU model and QoS
    class. Entries are never edited once in effect: a new price is a new entry, so past
    usage keeps the price it ran at. `gpu_model` "" prices any model without its own
    entry (and CPU-only jobs)."""

    gpu_model = models.CharField(max_length=64, blank=True)
    qos_class = models.CharField(max_length=16, choices=QosClass.choices)
    effective_from = models.DateTimeField()
    gpu_hour_micro = models.PositiveBigIntegerField(help_text="Per whole GPU per hour.")
    cpu_hour_micro = models.PositiveBigIntegerField(default=0, help_text="Per CPU per hour.")
    mem_gb_hour_micro = models.PositiveBigIntegerField(
        default=0, help_text="Per GiB of memory per hour."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "price"
        ordering = ["gpu_model", "qos_class", "effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_model", "qos_class", "effective_from"], name="price_one_per_start"
            ),
            models.CheckConstraint(
                condition=Q(qos_class__in=QosClass.values), name="price_qos_class_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model or '*'} {self.qos_class} from {self.effective_from:%Y-%m-%d}"

    def in_effect(self) -> bool:
        return self.effective_from <= timezone.now()

    # A price not yet in effect may still be corrected or withdrawn; once in effect it
    # is history (a trigger says the same on PostgreSQL, migration 0007).
    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            stored = PriceEntry.objects.filter(pk=self.pk).first()
            if stored is not None and stored.in_effect():
                raise ImmutableRecord("a price in effect is never edited: add a new entry")
            if self.in_effect():
                raise ImmutableRecord("a price edited before it takes effect stays in the future")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        stored = PriceEntry.objects.filter(pk=self.pk).first()
        if stored is not None and stored.in_effect():
            raise ImmutableRecord("a price in effect is never deleted: add a new entry")
        return super().delete(*args, **kwargs)


class BillingAccount(models.Model):
    """An organisation's billing settings and its balance: the sum of its ledger
    entries, kept here in the same transaction as each entry (the row is the lock that
    serialises its writers)."""

    class Mode(models.TextChoices):
        PREPAID = "prepaid", "Prepaid credit"
        POSTPAID = "postpaid", "Invoiced (postpaid)"
        EXEMPT = "exempt", "Exempt (not billed)"

    organization = models.OneToOneField(
        Organization, on_delete=models.PROTECT, related_name="billing_account"
    )
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.PREPAID)
    balance_micro = models.BigIntegerField(default=0)
    low_balance_micro = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Warn below this; empty: the site's default."
    )
    warned_at = models.DateTimeField(null=True, blank=True)
    depleted_at = models.DateTimeField(
        null=True, blank=True, help_text="Since when a prepaid balance is at or below zero."
    )
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    postpaid_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When it became invoiced: usage from then on is reported to Stripe's meter.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(mode__in=["prepaid", "postpaid", "exempt"]),
                name="billingaccount_mode_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.organization_id} ({self.mode})"


class LedgerEntry(AppendOnly):
    """One change of an organisation's credit. Append-only: a mistake is corrected by
    another entry (a refund or an adjustment), never by an edit."""

    class Kind(models.TextChoices):
        TOP_UP = "top_up", "Top-up"
        USAGE = "usage", "Usage"
        REFUND = "refund", "Refund"
        ADJUSTMENT = "adjustment", "Adjustment"
        PROMOTION = "promotion", "Promotional credit"

    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="ledger_entries"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    amount_micro = models.BigIntegerField(help_text="Credit added (positive) or used (negative).")
    balance_after_micro = models.BigIntegerField()
    # What makes the entry happen once: a Stripe session, a sign-up grant, a caller's key.
    key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["organization", "-id"], name="ledger_org_recent")]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["top_up", "usage", "refund", "adjustment", "promotion"]),
                name="ledger_kind_valid",
            ),
            # Usage only takes credit; top-ups, refunds and promotions only add it.
            models.CheckConstraint(
                condition=~Q(kind="usage") | Q(amount_micro__lte=0), name="ledger_usage_debits"
            ),
            models.CheckConstraint(
                condition=~Q(kind__in=["top_up", "refund", "promotion"]) | Q(amount_micro__gt=0),
                name="ledger_credits_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_micro}"


class MeteredRun(models.Model):
    """One attempt of a job that held resources: what it held, when, and how far it has
    been charged. `remainder` is the part of a micro-unit not yet charged (numerator over
    `pricing.DENOMINATOR`): charging in periods then adds up to exactly what the whole
    run costs, floored once. `carried_remainder` is what the job's attempt before this one
    left uncharged when it ended, where this run's charging starts from: a requeued job
    costs its whole time floored once, not each attempt floored on its own."""

    cluster = models.CharField(max_length=64)
    job_id = models.PositiveBigIntegerField()
    attempt = models.PositiveIntegerField()
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="metered_runs"
    )
    gpu_model = models.CharField(max_length=64, blank=True)
    qos_class = models.CharField(max_length=16, choices=QosClass.choices)
    gpu_milli = models.PositiveBigIntegerField(default=0)
    cpus = models.PositiveIntegerField(default=0)
    mem_mb = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    metered_until = models.DateTimeField()
    charged_micro = models.BigIntegerField(default=0)
    remainder = models.BigIntegerField(default=0)
    carried_remainder = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_id", "attempt"], name="meteredrun_one_per_attempt"
            ),
            models.CheckConstraint(
                condition=Q(metered_until__gte=F("started_at")), name="meteredrun_after_start"
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(metered_until__lte=F("ended_at")),
                name="meteredrun_not_past_end",
            ),
        ]
        indexes = [
            # The tick: the runs still open, by organisation.
            models.Index(
                fields=["organization", "id"],
                condition=Q(ended_at__isnull=True),
                name="meteredrun_open",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}"


class UsageRecord(models.Model):
    """What one run used in one period at one price. Periods split at price changes and
    at month starts, so an invoice month and a price own whole records."""

    # No index of their own: the unique (run, period_start) and (organization,
    # period_start) lead with them, and every index is paid on each record a tick writes.
    run = models.ForeignKey(
        MeteredRun, on_delete=models.PROTECT, related_name="usage", db_index=False
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    gpu_model = models.CharField(max_length=64, blank=True)
    qos_class = models.CharField(max_length=16, choices=QosClass.choices)
    gpu_milli_seconds = models.PositiveBigIntegerField(
        help_text="GPU capacity held times seconds (thousandths of a GPU-second)."
    )
    price = models.ForeignKey(PriceEntry, on_delete=models.PROTECT, null=True, related_name="+")
    amount_micro = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["period_start", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "period_start"], name="usage_one_per_period"),
            models.CheckConstraint(
                condition=Q(period_end__gt=F("period_start")), name="usage_period_not_empty"
            ),
        ]
        indexes = [
            # Usage lists and invoices: one organisation's records in a time window.
            models.Index(fields=["organization", "period_start"], name="usage_org_period"),
        ]


class TopUp(models.Model):
    """A Checkout Session for credit. Credited once, when Stripe says it is paid; marked
    expired when Stripe says the session expired unpaid (so that reconciliation stops
    asking about it)."""

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        PAID = "paid", "Paid"
        EXPIRED = "expired", "Expired"

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    amount_micro = models.PositiveBigIntegerField()
    session_id = models.CharField(max_length=255, unique=True)
    url = models.URLField(max_length=2000)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # Reconciliation: the open ones, oldest first.
            models.Index(fields=["id"], condition=Q(status="open"), name="topup_open")
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["open", "paid", "expired"]), name="topup_status_valid"
            )
        ]


class StripeEvent(models.Model):
    """A webhook event received, recorded (by its id, once) before it is acted on."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    payload = models.JSONField()
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)


class Invoice(AppendOnly):
    """An organisation's usage of one calendar month (UTC), line by GPU model and QoS."""

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    number = models.CharField(max_length=40, unique=True)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    currency = models.CharField(max_length=3)
    total_micro = models.BigIntegerField()
    issued_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-period_start", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "period_start"], name="invoice_one_per_month"
            )
        ]


class InvoiceLine(AppendOnly):
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    gpu_model = models.CharField(max_length=64, blank=True)
    qos_class = models.CharField(max_length=16, choices=QosClass.choices)
    gpu_milli_seconds = models.PositiveBigIntegerField()
    amount_micro = models.BigIntegerField()

    class Meta:
        ordering = ["gpu_model", "qos_class"]
        constraints = [
            models.UniqueConstraint(
                fields=["invoice", "gpu_model", "qos_class"], name="invoiceline_one_per_kind"
            )
        ]


class CreditNote(AppendOnly):
    """Money given back against an invoice (a billing error, an outage): it credits the
    organisation's balance (a refund entry, keyed by the note) and never exceeds what
    the invoice left to credit."""

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    number = models.CharField(max_length=48, unique=True)
    amount_micro = models.PositiveBigIntegerField()
    reason = models.CharField(max_length=200)
    # The request's own key (the admin form's): a form posted twice issues one note.
    key = models.CharField(max_length=100, null=True, blank=True, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_micro__gt=0), name="creditnote_positive")
        ]


class UsageDay(models.Model):
    """A daily rollup of usage records (UTC day, organisation, GPU model, QoS class): what
    the revenue dashboard reads for past days, so that a year of per-minute records never
    has to be summed on a page load. Rebuilt whole per day from the records that start
    before the mark (`UsageRollupMark`, `reports.roll_up_recent`, idempotent)."""

    day = models.DateField()
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    gpu_model = models.CharField(max_length=64, blank=True)
    qos_class = models.CharField(max_length=16, choices=QosClass.choices)
    gpu_milli_seconds = models.PositiveBigIntegerField()
    amount_micro = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "organization", "gpu_model", "qos_class"],
                name="usageday_one_per_key",
            )
        ]
        indexes = [models.Index(fields=["organization", "day"], name="usageday_org_day")]


class UsageRollupMark(models.Model):
    """One row: the daily rollup holds exactly the usage records that start before
    `until`; the ones from `until` on are summed live."""

    until = models.DateTimeField()


class MeterEventReport(models.Model):
    """A usage record of an invoiced organisation reported to Stripe as a Billing Meter
    event. The row is claimed (unique per record) before Stripe hears of it, and the
    event's `identifier` is derived from the record's key, so a report retried after a
    crash carries the same identifier (and idempotency key): Stripe counts it once.
    `usage_record_id` is no foreign key: only records of closed runs are reported, and
    those are never rewritten (metering rewrites an open run's records only)."""

    usage_record_id = models.BigIntegerField(unique=True)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    identifier = models.CharField(max_length=100, unique=True)
    value_micro = models.PositiveBigIntegerField()
    timestamp = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # What is left to send.
            models.Index(fields=["id"], condition=Q(reported_at__isnull=True), name="meter_unsent")
        ]


class SpendAlert(models.Model):
    """A threshold an organisation watches: this month's spend above it, or the balance
    below it. Crossing it mails the owners and billing members once per calendar month
    (UTC; `SpendAlertFiring`, unique per alert and month) and shows in the portal."""

    class Kind(models.TextChoices):
        MONTHLY_SPEND_ABOVE = "monthly_spend_above", "This month's spend above"
        BALANCE_BELOW = "balance_below", "Balance below"

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="spend_alerts"
    )
    kind = models.CharField(max_length=24, choices=Kind.choices)
    threshold_micro = models.BigIntegerField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "threshold_micro"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "kind", "threshold_micro"], name="spendalert_one_per_value"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["monthly_spend_above", "balance_below"]),
                name="spendalert_kind_valid",
            ),
            # A spend threshold is positive; a balance threshold may be any amount.
            models.CheckConstraint(
                condition=~Q(kind="monthly_spend_above") | Q(threshold_micro__gt=0),
                name="spendalert_spend_positive",
            ),
        ]


class SpendAlertFiring(models.Model):
    """An alert crossed in one month: the row is the "once" of its email."""

    alert = models.ForeignKey(SpendAlert, on_delete=models.CASCADE, related_name="firings")
    period_start = models.DateTimeField(help_text="The month (UTC) it fired in.")
    value_micro = models.BigIntegerField(help_text="The spend or balance that crossed it.")
    fired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-fired_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "period_start"], name="spendalert_once_a_month"
            )
        ]


class CapacitySample(models.Model):
    """The cluster's GPUs at one hour (UTC; `capacity.record_capacity`, hourly): a day's
    capacity for the utilisation chart is the mean of its samples times 24 hours, so a
    day when the cluster was smaller reads as it was, not against today's size."""

    hour = models.DateTimeField(unique=True)
    gpus = models.PositiveIntegerField()
