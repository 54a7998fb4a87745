from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from .models import User


def too_many_attempts_message(wait_s: int) -> str:
    minutes, seconds = divmod(max(1, wait_s), 60)
    when = f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    return f"Too many attempts. Try again in {when}."


class SignupForm(forms.Form):
    """Step one: the address to confirm. The password is chosen from the emailed link, so an
    account is never created for an address by someone who cannot read its mail."""

    email = forms.EmailField()
    organization_name = forms.CharField(max_length=100, required=False)


class SignupPasswordForm(forms.Form):
    """Step two, from the confirmation link."""

    password = forms.CharField(widget=forms.PasswordInput, min_length=8)

    def __init__(self, *args: Any, email: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def clean_password(self) -> str:
        password = self.cleaned_data["password"]
        password_validation.validate_password(password, User(email=self.email))
        return password


class ThrottledAuthenticationForm(AuthenticationForm):
    """Tells a throttled client how long to wait instead of "didn't match" (the backend
    refused before checking the password, so the wait reveals nothing about it)."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": "Too many attempts.",
    }

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            wait = getattr(self.request, "login_throttled_s", 0)
            if wait:
                raise ValidationError(too_many_attempts_message(wait), code="throttled") from None
            raise

    @property
    def throttled(self) -> bool:
        return any(e.code == "throttled" for e in self.non_field_errors().as_data())
