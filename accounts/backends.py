"""The password backend: Django's, with guesses throttled (see accounts.attempts).

A backend, not a login form, so that every password check goes through it: the login page,
the admin's login page, and anything else calling `authenticate()`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from . import attempts


class ThrottledModelBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if request is None or not username:
            return super().authenticate(request, username=username, password=password, **kwargs)
        wait = attempts.login_wait_s(request, username)
        if wait:
            # Refused before the password is checked, so a guess made now says nothing.
            request.login_throttled_s = wait  # type: ignore[attr-defined]
            raise PermissionDenied
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            attempts.login_failed(request, username)
        else:
            attempts.login_succeeded(request, username)
        return user
