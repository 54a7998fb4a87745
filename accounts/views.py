"""Browser pages for accounts: sign up, log in, reset a password, switch organization, accept
an invitation."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import Resolver404, resolve, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from common.errors import ApplicationError

from . import attempts, services
from .forms import (
    SignupForm,
    SignupPasswordForm,
    ThrottledAuthenticationForm,
    too_many_attempts_message,
)
from .permissions import signed_in_user
from .selectors import organizations_for_user

LOGIN_BACKEND = "accounts.backends.ThrottledModelBackend"


def safe_next(request: HttpRequest, candidate: str | None, default: str = "/") -> str:
    """`candidate` if it is a path on this site (the check Django's login view makes), else
    `default`: an absolute URL to another host must never be followed after a form."""
    if candidate and url_has_allowed_host_and_scheme(
        candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return candidate
    return default


def _too_many(
    request: HttpRequest, wait_s: int, template: str, context: dict[str, Any]
) -> HttpResponse:
    response = render(
        request, template, {**context, "throttled": too_many_attempts_message(wait_s)}, status=429
    )
    response["Retry-After"] = str(wait_s)
    return response


def signup(request: HttpRequest) -> HttpResponse:
    """Step one: mail a confirmation link. Answers the same whether or not the address
    already has an account (that mail says so instead), so the page tells nobody."""
    next_url = safe_next(request, request.POST.get("next") or request.GET.get("next"), "")
    form = SignupForm(request.POST or None)
    context = {"form": form, "next": next_url}
    if request.method == "POST" and form.is_valid():
        email = form.cleaned_data["email"]
        send, refuse_s = attempts.mail_request_allowed(
            request,
            email,
            per_email=attempts.SIGNUP_PER_EMAIL,
            per_address=attempts.SIGNUP_PER_ADDRESS,
        )
        if refuse_s:
            return _too_many(request, refuse_s, "registration/signup.html", context)
        if send:
            services.signup_request(
                email=email,
                organization_name=form.cleaned_data["organization_name"],
                next_url=next_url,
                base_url=request.build_absolute_uri("/").rstrip("/"),
            )
        return render(request, "registration/signup_sent.html", {"email": email})
    return render(request, "registration/signup.html", context)


def _invitation_token_in(next_url: str) -> str | None:
    """The invitation token when the signup started from an invitation link."""
    try:
        match = resolve(next_url.split("?", 1)[0]) if next_url else None
    except Resolver404:
        return None
    if match is None or match.url_name != "accept-invitation":
        return None
    return str(match.kwargs["token"])


def signup_confirm(request: HttpRequest, token: str) -> HttpResponse:
    """Step two, from the mailed link: choose a password; the account is created now."""
    try:
        pending = services.signup_request_read(token)
    except ApplicationError as exc:
        return render(
            request, "registration/signup_confirm.html", {"error": exc.message}, status=400
        )
    form = SignupPasswordForm(request.POST or None, email=pending.email)
    if request.method == "POST" and form.is_valid():
        invitation_token = _invitation_token_in(pending.next_url)
        try:
            user = services.user_signup(
                email=pending.email,
                password=form.cleaned_data["password"],
                organization_name=pending.organization_name,
                invitation_token=invitation_token,
            )
        except ApplicationError as exc:
            return render(
                request,
                "registration/signup_confirm.html",
                {"error": exc.message},
                status=exc.status_code,
            )
        login(request, user, backend=LOGIN_BACKEND)
        joined = services.invitation_joined(token=invitation_token, user=user)
        if joined is not None:
            # Signed up from the invitation with its address: already a member, no detour.
            request.session["organization_id"] = joined.pk
            messages.success(request, f"Welcome to Sandpit: you joined {joined.name}.")
            response = redirect("dashboard")
        else:
            response = redirect(safe_next(request, pending.next_url, reverse("dashboard")))
        attempts.remember_browser(request, response, user.email)
        return response
    return render(request, "registration/signup_confirm.html", {"form": form, "pending": pending})


class LoginView(auth_views.LoginView):
    """Django's login view with throttled guesses (429 while throttled) and a cookie that
    marks this browser as known to the account (see accounts.attempts)."""

    form_class = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        attempts.remember_browser(self.request, response, form.get_user().email)
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        wait = getattr(self.request, "login_throttled_s", 0)
        if wait:
            response.status_code = 429
            response["Retry-After"] = str(wait)
        return response


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset view. Per client address past the limit: 429. Per email address past the
    limit: the usual "sent" page but no mail, so it can neither flood an inbox nor tell
    whether the address has an account."""

    def form_valid(self, form: PasswordResetForm) -> HttpResponse:
        send, refuse_s = attempts.mail_request_allowed(
            self.request,
            form.cleaned_data["email"],
            per_email=attempts.RESET_PER_EMAIL,
            per_address=attempts.RESET_PER_ADDRESS,
        )
        if refuse_s:
            response = self.render_to_response(self.get_context_data(form=form), status=429)
            response["Retry-After"] = str(refuse_s)
            return response
        if send:
            return super().form_valid(form)
        return HttpResponseRedirect(self.get_success_url())


@login_required
@require_POST
def switch_organization(request: HttpRequest) -> HttpResponse:
    chosen = request.POST.get("organization")
    # A missing choice (None) matches no organization: the refusal below.
    org = organizations_for_user(signed_in_user(request)).filter(pk=chosen).first()  # type: ignore[misc]
    if org is None:
        messages.error(request, "You are not a member of that organization.")
    else:
        request.session["organization_id"] = org.pk
    return redirect(safe_next(request, request.POST.get("next"), reverse("dashboard")))


def accept_invitation(request: HttpRequest, token: str) -> HttpResponse:
    try:
        invitation = services.invitation_get_by_token(token)
    except ApplicationError as exc:
        return render(request, "accounts/invitation.html", {"error": exc.message}, status=404)
    if not request.user.is_authenticated:
        return redirect(f"{reverse('login')}?next={reverse('accept-invitation', args=[token])}")
    if not services.invitation_is_for(invitation, request.user):
        # Neither the organization nor the role nor the invited address is shown.
        return render(
            request,
            "accounts/invitation.html",
            {"error": services.INVITATION_WRONG_ACCOUNT},
            status=403,
        )
    if request.method == "POST":
        try:
            membership = services.invitation_accept(token=token, user=request.user)
        except ApplicationError as exc:
            return render(
                request,
                "accounts/invitation.html",
                {"error": exc.message, "invitation": invitation},
                status=exc.status_code,
            )
        request.session["organization_id"] = membership.organization_id
        messages.success(request, f"You joined {membership.organization.name}.")
        return redirect("dashboard")
    return render(request, "accounts/invitation.html", {"invitation": invitation})
