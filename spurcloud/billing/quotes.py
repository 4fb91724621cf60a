"""Prices as a renter sees them before running anything: each model's on-demand and spot
GPU-hour price now (the catalog, the launch form), and a job's estimated cost, checked
against a prepaid balance before it is submitted: by `jobs.services.submit_jobs`, so the
API, slurmrestd, `sbatch` and the portal refuse alike (402), and shown by the portal's
launch form (`portal/launch_quote.py`), from the same `spec_quote`.

The estimate is an upper bound of what metering can charge (a job is charged for what it
holds while it runs, at most its time limit), rounded up to a micro-unit: the price book
entry's GPU, CPU and memory prices for the job's QoS class (on-demand, or spot for
`BILLING_SPOT_QOS`), times what it may hold: its milli-GPUs, its CPUs (a whole node's for
`--exclusive`) and its memory (`--mem`; else the memory the node gives it: its CPUs times
the largest memory per CPU of the cluster's nodes, or a whole node's for `--mem=0` and
`--exclusive`), times its time limit (the job's, else its partition's default, else its
maximum: every partition has both, scheduler.config). For "any model" it is the dearest
the cluster has. The cluster's partitions and nodes are asked for only when needed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.utils import timezone

from scheduler.core.arrays import parse_array
from scheduler.core.contract import JobSpec
from scheduler.core.contract.request import ResourceRequest
from scheduler.core.errors import Rejected
from spurcloud.billing.errors import PaymentRequired
from spurcloud.billing.ledger import open_account
from spurcloud.billing.models import BillingAccount, PriceEntry, QosClass
from spurcloud.billing.money import format_amount
from spurcloud.tenants.models import Organization

MILLI = 1000  # milli-GPUs in a GPU; and the scale CPUs are counted in below
MIB_PER_GIB = 1024
# minutes x (milli-GPUs x GPU price x 1024 + CPUs x 1000 x CPU price x 1024 + MiB x 1000 x
# memory price) over this is micro-units (prices per hour).
DENOMINATOR = 60 * MILLI * MIB_PER_GIB

Nodes = Callable[[], Sequence[dict[str, Any]]]


@dataclass(frozen=True)
class Rates:
    """A price book entry's prices per hour (micro-units)."""

    gpu_hour_micro: int
    cpu_hour_micro: int = 0
    mem_gb_hour_micro: int = 0


@dataclass(frozen=True)
class Holds:
    """The most a job may hold at once: milli-GPUs, CPUs, MiB of memory."""

    gpu_milli: int
    cpus: int = 0
    mem_mb: int = 0

    def times(self, n: int) -> Holds:
        return Holds(self.gpu_milli * n, self.cpus * n, self.mem_mb * n)


@dataclass(frozen=True)
class Quote:
    micro: int
    text: str
    why: str


def hour_prices(*, now: datetime | None = None) -> dict[tuple[str, str], Rates]:
    """(GPU model, QoS class) -> the prices in effect now; model "" is the default of
    models without their own (and of CPU-only jobs)."""
    now = now or timezone.now()
    prices: dict[tuple[str, str], Rates] = {}
    for entry in PriceEntry.objects.filter(effective_from__lte=now).order_by("effective_from"):
        prices[(entry.gpu_model, entry.qos_class)] = Rates(
            int(entry.gpu_hour_micro), int(entry.cpu_hour_micro), int(entry.mem_gb_hour_micro)
        )
    return prices


class Balance(Protocol):
    """What the credit checks read of an organisation's billing account (a
    `BillingAccount`, or a submission's `SubmitTerms`)."""

    @property
    def mode(self) -> str: ...

    @property
    def balance_micro(self) -> int: ...


@dataclass(frozen=True)
class SubmitTerms:
    """What a submission's checks read of its organisation's billing: the account's mode
    and balance, and for a prepaid one the prices in effect (as `hour_prices`; else
    none, which no check reads)."""

    mode: str
    balance_micro: int
    prices: dict[tuple[str, str], Rates]


def submit_terms(*, organization: Organization) -> SubmitTerms:
    """The organisation's `SubmitTerms`, read fresh in one statement: the account's row,
    joined for a prepaid one to the price book's entries in effect (oldest first, so
    that the newest of each GPU model and QoS class wins). Nothing is kept between
    submissions: a balance used up a moment ago refuses the next one. An account not
    opened yet is opened (ledger.open_account: its sign-up credit) and read as before.
    Django's query compiler made these two reads a sixth of the web's CPU a submission."""
    with connection.cursor() as cursor:
        cursor.execute(
            _terms_sql(),
            [
                BillingAccount.Mode.PREPAID.value,
                connection.ops.adapt_datetimefield_value(timezone.now()),
                organization.pk,
            ],
        )
        rows = cursor.fetchall()
    if not rows:
        account = open_account(organization=organization)
        prepaid = account.mode == BillingAccount.Mode.PREPAID
        return SubmitTerms(
            account.mode, int(account.balance_micro), hour_prices() if prepaid else {}
        )
    prices = {
        (model, qos_class): Rates(int(gpu), int(cpu), int(mem))
        for _, _, model, qos_class, gpu, cpu, mem in rows
        if qos_class is not None  # no price joined (not prepaid, or an empty book)
    }
    return SubmitTerms(str(rows[0][0]), int(rows[0][1]), prices)


_TERMS_SQL: dict[str, str] = {}


def _terms_sql() -> str:
    """`submit_terms`' statement (per database vendor: quoting differs), made once."""
    found = _TERMS_SQL.get(connection.vendor)
    if found is None:
        quote = connection.ops.quote_name

        def column(model: type[BillingAccount | PriceEntry], name: str) -> str:
            return quote(str(model._meta.get_field(name).column))  # type: ignore[union-attr]

        account, price = quote(BillingAccount._meta.db_table), quote(PriceEntry._meta.db_table)
        prices = ", ".join(
            f"p.{column(PriceEntry, name)}"
            for name in (
                "gpu_model",
                "qos_class",
                "gpu_hour_micro",
                "cpu_hour_micro",
                "mem_gb_hour_micro",
            )
        )
        found = _TERMS_SQL[connection.vendor] = (
            f"SELECT a.{column(BillingAccount, 'mode')}, "  # noqa: S608 - the models' names
            f"a.{column(BillingAccount, 'balance_micro')}, {prices} "
            f"FROM {account} a LEFT JOIN {price} p "
            f"ON a.{column(BillingAccount, 'mode')} = %s "
            f"AND p.{column(PriceEntry, 'effective_from')} <= %s "
            f"WHERE a.{column(BillingAccount, 'organization')} = %s "
            f"ORDER BY p.{column(PriceEntry, 'effective_from')}"
        )
    return found


def rates_for(
    prices: dict[tuple[str, str], Rates], gpu_model: str, qos_class: str = QosClass.ON_DEMAND
) -> Rates | None:
    """A model's own prices, else the default ("") ones of the QoS class (as metering)."""
    found = prices.get((gpu_model, qos_class))
    return found if found is not None else prices.get(("", qos_class))


def qos_class_of(qos: str) -> QosClass:
    return QosClass.SPOT if qos in settings.BILLING_SPOT_QOS else QosClass.ON_DEMAND


def estimate_micro(*, rates: Rates, holds: Holds, time_limit_min: int) -> int:
    """What `holds` costs at `rates` for `time_limit_min` minutes, rounded up."""
    per_minute = (
        holds.gpu_milli * rates.gpu_hour_micro * MIB_PER_GIB
        + holds.cpus * MILLI * rates.cpu_hour_micro * MIB_PER_GIB
        + holds.mem_mb * MILLI * rates.mem_gb_hour_micro
    )
    return -(-per_minute * time_limit_min // DENOMINATOR)


def partition_limit(partitions: Sequence[dict[str, Any]], name: str) -> int | None:
    """The time limit a job without one gets in partition `name` ("": the default)."""
    for part in partitions:
        if (name and part.get("name") == name) or (not name and part.get("default")):
            return part.get("default_time_min") or part.get("max_time_min") or None
    return None


def gpu_models_of(nodes: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({str(g["model"]) for n in nodes for g in n.get("gpus", ()) if g.get("model")})


def holds_of(spec: JobSpec, *, nodes: Nodes, charged: Rates) -> Holds:
    """The most `spec` may hold on one try (an array's task: one of them). The nodes are
    read only when what the job gets depends on them and `charged` prices it."""
    req = ResourceRequest.of(spec)
    need_nodes = spec.exclusive or not req.mem_per_node_mb
    cpu_priced, mem_priced = charged.cpu_hour_micro > 0, charged.mem_gb_hour_micro > 0
    cluster = list(nodes()) if need_nodes and (cpu_priced or mem_priced) else []
    most_cpus = max((int(n.get("cpus") or 0) for n in cluster), default=0)
    most_mem = max((int(n.get("memory_mb") or 0) for n in cluster), default=0)
    per_cpu = max(
        (int(n.get("memory_mb") or 0) // int(n["cpus"]) for n in cluster if n.get("cpus")),
        default=0,
    )
    if spec.exclusive:
        cpus, mem = max(most_cpus, req.cpus_per_node), most_mem
    else:
        cpus = req.cpus_per_node
        # None: the node's memory per CPU; 0: all of the node's (scheduler placement).
        given = req.mem_per_node_mb
        mem = cpus * per_cpu if given is None else given or most_mem
    return Holds(req.gpu_milli, cpus * req.nodes, mem * req.nodes)


def spec_quote(
    spec: JobSpec,
    *,
    partitions: Callable[[], Sequence[dict[str, Any]]],
    nodes: Nodes,
    prices: dict[tuple[str, str], Rates] | None = None,
) -> Quote | None:
    """A submission's estimate (an array's tasks counted); None without a time limit, a
    price, or anything to charge."""
    tasks = 1
    if spec.array:
        try:
            tasks = len(parse_array(spec.array)[0])
        except Rejected:
            return None  # the controller refuses it with its own message
    minutes = spec.time_limit_min
    if minutes is None:
        minutes = partition_limit(partitions(), spec.partition)
    if not minutes or minutes <= 0:
        return None
    prices = hour_prices() if prices is None else prices
    qos_class = qos_class_of(spec.qos)
    gpus = ResourceRequest.of(spec).gpu_milli
    candidates = [spec.gpu_type] if spec.gpu_type or not gpus else gpu_models_of(nodes()) or [""]
    best: tuple[int, Rates, Holds] | None = None
    for model in candidates:
        rates = rates_for(prices, model, qos_class)
        if rates is None:
            continue
        holds = holds_of(spec, nodes=nodes, charged=rates).times(tasks)
        micro = estimate_micro(rates=rates, holds=holds, time_limit_min=int(minutes))
        if best is None or micro > best[0]:
            best = (micro, rates, holds)
    if best is None or best[0] <= 0:
        return None
    micro, rates, holds = best
    return Quote(micro=micro, text=_money(micro), why=_why(rates, holds, int(minutes)))


def _money(micro: int) -> str:
    return format_amount(micro, settings.BILLING_CURRENCY)


def _why(rates: Rates, holds: Holds, minutes: int) -> str:
    parts = []
    if holds.gpu_milli and rates.gpu_hour_micro:
        parts.append(
            f"{_money(rates.gpu_hour_micro)} per GPU-hour × {holds.gpu_milli / 1000:g} GPU"
        )
    if holds.cpus and rates.cpu_hour_micro:
        parts.append(f"{_money(rates.cpu_hour_micro)} per CPU-hour × {holds.cpus} CPU")
    if holds.mem_mb and rates.mem_gb_hour_micro:
        gib = holds.mem_mb / MIB_PER_GIB
        parts.append(f"{_money(rates.mem_gb_hour_micro)} per GiB-hour × {gib:g} GiB")
    rate = parts[0] if len(parts) == 1 else f"({' + '.join(parts)})"
    return f"{rate} × {minutes} min (the time limit): the most this job can cost."


def check_affordable(
    *, organization: Organization, estimate: int, account: Balance | None = None
) -> None:
    """Refuses (PaymentRequired) a job whose estimate exceeds a prepaid balance."""
    account = account or open_account(organization=organization)
    if account.mode == BillingAccount.Mode.PREPAID and estimate > account.balance_micro:
        raise PaymentRequired(
            f"Payment required: this job may cost up to {_money(estimate)} "
            f"(price x resources x time limit), more than your balance of "
            f"{_money(account.balance_micro)}. Top up in the billing page, "
            "or ask for fewer GPUs or a shorter time limit."
        )


def check_submissions_affordable(
    *,
    organization: Organization,
    specs: Sequence[JobSpec],
    partitions: Callable[[], Sequence[dict[str, Any]]],
    nodes: Nodes,
    account: Balance | None = None,
    prices: dict[tuple[str, str], Rates] | None = None,
) -> None:
    """Refuses (PaymentRequired, 402) submissions whose estimates together exceed a
    prepaid balance; postpaid and exempt organisations are never refused here.
    `account` and `prices` (`hour_prices`'): where the caller read them already."""
    account = account or open_account(organization=organization)
    if account.mode != BillingAccount.Mode.PREPAID:
        return
    prices = hour_prices() if prices is None else prices
    if not prices:
        return  # no price book: nothing is estimated (and the controller is not asked)
    # Asked once for the whole list, and only if a job needs them.
    partitions, nodes = functools.cache(partitions), functools.cache(nodes)
    total = 0
    for spec in specs:
        found = spec_quote(spec, partitions=partitions, nodes=nodes, prices=prices)
        total += found.micro if found is not None else 0
    if total:
        check_affordable(organization=organization, estimate=total, account=account)
