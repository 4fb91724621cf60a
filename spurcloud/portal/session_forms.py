"""The session launcher's form: a template, GPU model and count or fraction, and a
maximum duration. Like the batch launch form (job_forms.py) it checks only what a form
must and builds a JobSpec dict; the scheduler's rules and messages are the scheduler's."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.conf import settings

from scheduler.core.contract import GPU_FRACTION
from spurcloud.portal.job_forms import _SPEC_TO_FORM
from spurcloud.portal.sessions import COMMENT_PREFIX, QOS, session_templates


class SessionLaunchForm(forms.Form):
    payment_required = False  # set when the credit refused it: the page answers 402
    template = forms.ChoiceField(label="Session template")
    gpu_type = forms.ChoiceField(required=False, label="GPU model")
    gpus = forms.IntegerField(required=False, min_value=1, label="GPUs", help_text="Whole GPUs.")
    gpu_fraction = forms.FloatField(
        required=False, label="Or a share of one GPU", help_text="0.001 to 0.999."
    )
    max_minutes = forms.IntegerField(
        min_value=1,
        initial=60,
        label="Maximum duration (minutes)",
        help_text="The session ends then, with a warning on its page before.",
    )
    idempotency_key = forms.RegexField(
        regex=r"^[0-9a-f]{32}$", widget=forms.HiddenInput, error_messages={"invalid": "Reload."}
    )

    def __init__(
        self,
        *args: Any,
        gpu_models: list[str] | None = None,
        ssh_keys: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """`ssh_keys`: the launcher's account keys, which the session's job carries."""
        self.ssh_keys = list(ssh_keys or ())
        kwargs.setdefault("initial", {}).setdefault("idempotency_key", uuid.uuid4().hex)
        kwargs.setdefault("prefix", "session")  # beside the batch form on the launch page
        super().__init__(*args, **kwargs)
        self.templates = session_templates()
        template = self.fields["template"]
        assert isinstance(template, forms.ChoiceField)
        template.choices = [(t.key, t.title) for t in self.templates.values()]
        gpu_type = self.fields["gpu_type"]
        assert isinstance(gpu_type, forms.ChoiceField)
        gpu_type.choices = [("", "Any model"), *((m, m) for m in gpu_models or [])]
        most = int(settings.SPUR_SESSION_MAX_MINUTES)
        self.fields["max_minutes"].widget.attrs["max"] = str(most)
        self.most = most

    def clean_max_minutes(self) -> int:
        value = int(self.cleaned_data["max_minutes"])
        if value > self.most:
            raise forms.ValidationError(f"At most {self.most} minutes.")
        return value

    def spec(self) -> dict[str, Any]:
        data = self.cleaned_data
        template = self.templates[data["template"]]
        spec: dict[str, Any] = {
            "script": template.script(data["max_minutes"]),
            "name": f"session-{template.key}",
            "comment": f"{COMMENT_PREFIX}{template.key}",
            "qos": QOS,
            "time_limit_min": data["max_minutes"],
        }
        if data.get("gpu_type"):
            spec["gpu_type"] = data["gpu_type"]
        if data.get("gpus"):
            spec["gpus"] = data["gpus"]
        if data.get(GPU_FRACTION.name) is not None:
            spec[GPU_FRACTION.name] = data[GPU_FRACTION.name]
        if self.ssh_keys:
            spec["ssh_keys"] = self.ssh_keys
        return spec

    def add_scheduler_error(self, field: str, message: str) -> None:
        name = _SPEC_TO_FORM.get(field, field)
        self.add_error(name if name in self.fields else None, message)
