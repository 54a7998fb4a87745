"""Browser pages for accounts: sign up, switch organization, accept an invitation."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from playground.errors import ApplicationError

from . import services
from .forms import SignupForm
from .selectors import organizations_for_user


def signup(request):  # type: ignore[no-untyped-def]
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.user_signup(**form.cleaned_data)
        except ApplicationError as exc:
            form.add_error("email", exc.message)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect(request.GET.get("next") or "dashboard")
    return render(request, "registration/signup.html", {"form": form})


@login_required
@require_POST
def switch_organization(request):  # type: ignore[no-untyped-def]
    org = organizations_for_user(request.user).filter(pk=request.POST.get("organization")).first()
    if org is None:
        messages.error(request, "You are not a member of that organization.")
    else:
        request.session["organization_id"] = org.pk
    return redirect(request.POST.get("next") or "dashboard")


def accept_invitation(request, token: str):  # type: ignore[no-untyped-def]
    try:
        invitation = services.invitation_get_by_token(token)
    except ApplicationError as exc:
        return render(request, "accounts/invitation.html", {"error": exc.message}, status=404)
    if not request.user.is_authenticated:
        return redirect(f"/accounts/login/?next=/invitations/{token}/")
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
