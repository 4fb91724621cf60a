from django import forms


class OrganizationForm(forms.Form):
    name = forms.CharField(max_length=200, label="Organisation name")


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, label="Token name", help_text="Where it will be used, e.g. laptop."
    )
