"""The account page: what belongs to the person rather than to an organisation. Their SSH
public keys (added, checked and removed here: tenants.services), and links to what
allauth keeps: email addresses, two-factor authentication (allauth.mfa: an authenticator
app's codes and recovery codes), the signed-in sessions (allauth.usersessions), the
password; and to the API tokens, which are per organisation."""

from __future__ import annotations

from allauth.mfa.models import Authenticator
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from spurcloud.portal.membership import AuthenticatedHttpRequest
from spurcloud.tenants.models import MAX_SSH_KEYS_PER_USER
from spurcloud.tenants.selectors import access_ssh_key, ssh_keys_of
from spurcloud.tenants.services import add_ssh_key, remove_ssh_key
from spurcloud.tenants.sshkeys import MAX_KEY_LINE, InvalidSshKey


class SshKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, required=False, label="Name", help_text="Empty: the key's comment."
    )
    public_key = forms.CharField(
        max_length=MAX_KEY_LINE,
        label="Public key",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="The line of your .pub file: ssh-ed25519, ecdsa-sha2-nistp256/384/521, "
        "or ssh-rsa of 2048 bits or more.",
    )


@login_required
def account(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key = add_ssh_key(
                user=request.user,
                name=form.cleaned_data["name"],
                public_key=form.cleaned_data["public_key"],
            )
        except InvalidSshKey as exc:
            form.add_error("public_key", str(exc))
        else:
            messages.success(request, f"SSH key {key.name} added ({key.fingerprint}).")
            return redirect("portal:account")
    mfa_types = set(Authenticator.objects.filter(user=request.user).values_list("type", flat=True))
    return render(
        request,
        "portal/account.html",
        {
            "form": form,
            "ssh_keys": ssh_keys_of(user=request.user),
            "max_ssh_keys": MAX_SSH_KEYS_PER_USER,
            "totp_enabled": Authenticator.Type.TOTP in mfa_types,
            "recovery_codes": Authenticator.Type.RECOVERY_CODES in mfa_types,
        },
    )


@require_POST
@login_required
def ssh_key_remove(request: AuthenticatedHttpRequest, key_id: str) -> HttpResponse:
    key = access_ssh_key(user=request.user, key_id=int(key_id))
    remove_ssh_key(key=key)
    messages.success(request, f"SSH key {key.name} removed.")
    return redirect("portal:account")
