"""The job pages' forms: the job list's filters, and the launch form.

The launch form checks only what a form must (types, one of script or command) and
builds a JobSpec dict; every rule about the job itself (bounds, GPU shares, partitions,
what no node can hold) is the scheduler's, applied by `jobs.services.submit_job` and the
controller exactly as for `POST /api/v1/jobs`, and their messages come back to the field
they name."""

from __future__ import annotations

import uuid
from functools import lru_cache
from typing import Any

from django import forms
from django.conf import settings
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from scheduler.core.contract import GPU_FRACTION, JobState
from scheduler.slurm.batchscript import SbatchError, check_script, wrap_script

# The spec field a scheduler message names -> the form field that shows it.
_SPEC_TO_FORM = {"gpu_milli": GPU_FRACTION.name, "gpus_per_node": "gpus"}


class JobFilterForm(forms.Form):
    """The job list's filters. Django renders a choice field through a template for the
    field and another for each of its choices: a fifth of the page's cost, for the same
    few values again and again. `fields_html` keeps the rendering of each set of values
    (the choices are the contract's states, fixed while the process runs)."""

    state = forms.ChoiceField(
        required=False,
        label="State",
        choices=[("", "Any state"), *((s.value, s.value) for s in JobState)],
    )
    user = forms.CharField(required=False, max_length=150, label="User")
    name = forms.CharField(required=False, max_length=200, label="Name")

    def filters(self) -> dict[str, Any]:
        """The selector's filters (jobs.selectors.job_history) of a valid form."""
        data = self.cleaned_data
        return {
            "states": [data["state"]] if data.get("state") else None,
            "user": data.get("user") or None,
            "name": data.get("name") or None,
        }

    def fields_html(self) -> SafeString:
        """The fields (labels, values, invalid marks) as `portal/_job_filters.html` shows
        them: the same for the same values, so kept for each."""
        return _filter_fields_html(tuple(str(self.data.get(name, "")) for name in FILTERS))


FILTERS = tuple(JobFilterForm.base_fields)


@lru_cache(maxsize=256)
def _filter_fields_html(values: tuple[str, ...]) -> SafeString:
    form = JobFilterForm(dict(zip(FILTERS, values, strict=True)))
    return mark_safe(render_to_string("portal/_job_filters.html", {"form": form}))


class LaunchForm(forms.Form):
    payment_required = False  # set when the credit refused it: the page answers 402
    name = forms.CharField(
        required=False, label="Job name", help_text="As squeue shows it; optional."
    )
    command = forms.CharField(
        required=False,
        label="Command",
        help_text="One command line, run as sbatch --wrap runs it. Or give a script below.",
        widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 3"}),
    )
    script = forms.CharField(
        required=False,
        strip=False,
        label="Batch script",
        help_text="A whole script, starting with #! (#SBATCH lines are not read here).",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )
    partition = forms.ChoiceField(required=False, label="Partition")
    gpu_type = forms.ChoiceField(required=False, label="GPU model")
    gpus = forms.IntegerField(required=False, label="GPUs", help_text="Whole GPUs.")
    gpu_fraction = forms.FloatField(
        required=False,
        label="Or a share of one GPU",
        help_text="0.001 to 0.999, instead of whole GPUs.",
    )
    time_limit_min = forms.IntegerField(
        required=False, label="Time limit (minutes)", help_text="Empty: the partition's default."
    )
    qos = forms.ChoiceField(
        required=False,
        label="Price class",
        help_text="Spot costs less, and may be preempted (requeued) for on-demand work.",
    )
    # One submission per rendering of the form: a resent POST lands on the same job.
    idempotency_key = forms.RegexField(
        regex=r"^[0-9a-f]{32}$", widget=forms.HiddenInput, error_messages={"invalid": "Reload."}
    )

    def __init__(
        self,
        *args: Any,
        gpu_models: list[str] | None = None,
        partitions: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("initial", {}).setdefault("idempotency_key", uuid.uuid4().hex)
        super().__init__(*args, **kwargs)
        self._choices("gpu_type", "Any model", gpu_models or [])
        self._choices("partition", "The default partition", partitions or [])
        # Billing's spot QoS the scheduler has by default (scheduler.core.policy).
        spot = ["spot"] if "spot" in settings.BILLING_SPOT_QOS else []
        qos = self.fields["qos"]
        assert isinstance(qos, forms.ChoiceField)
        qos.choices = [("", "On-demand"), *((q, "Spot (preemptible)") for q in spot)]

    def _choices(self, name: str, blank: str, values: list[str]) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", blank), *((v, v) for v in values)]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        command, script = data.get("command", ""), data.get("script", "")
        if command and script:
            raise forms.ValidationError("Give a command or a script, not both.")
        if not command and not script:
            raise forms.ValidationError("Give a command to run, or a batch script.")
        if script:
            try:
                check_script(script)  # sbatch's own checks and words
            except SbatchError as exc:
                self.add_error("script", " ".join(exc.lines).replace("sbatch: error: ", ""))
        return data

    def spec(self) -> dict[str, Any]:
        """The JobSpec dict to submit (what POST /api/v1/jobs takes): only what was given,
        so everything else keeps the scheduler's defaults."""
        data = self.cleaned_data
        spec: dict[str, Any] = {
            "script": data["script"] or wrap_script(data["command"]),
            "name": data["name"] or ("wrap" if data["command"] else "web"),
        }
        for key in ("partition", "gpu_type", "qos"):
            if data.get(key):
                spec[key] = data[key]
        if data.get("gpus"):
            spec["gpus"] = data["gpus"]
        for key in (GPU_FRACTION.name, "time_limit_min"):
            if data.get(key) is not None:
                spec[key] = data[key]
        return spec

    def add_scheduler_error(self, field: str, message: str) -> None:
        """A refusal by the scheduler, shown by the field it names (else the form's)."""
        name = _SPEC_TO_FORM.get(field, field)
        if name == "script" and self.cleaned_data.get("command"):
            name = "command"
        self.add_error(name if name in self.fields else None, message)
