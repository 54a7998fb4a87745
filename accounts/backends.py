"""The password backend: Django's, with guesses throttled (see accounts.attempts).

A backend, not a login form, so that every password check goes through it: the login page,
the admin's login page, and anything else calling `authenticate()`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from common.rows import RowLookup

from . import attempts
from .models import User

USER_BY_ID = RowLookup(User, "pk")
"""`User.objects.get(pk=...)`, written once (common/rows.py): a browser session's every request
loads its user, which the ORM compiled each time (~0.85 ms of the request's CPU here)."""


class ThrottledModelBackend(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        """Django's, by a statement written once. The user's id comes from the session, as
        Django's `get_user` converted it (an int); anything else takes Django's path."""
        if not isinstance(user_id, int):
            return super().get_user(user_id)
        user = USER_BY_ID.get(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

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
