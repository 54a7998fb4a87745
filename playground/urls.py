from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts import urls as account_urls
from accounts import views as account_views
from billing import urls as billing_urls
from common import errors
from sandboxes import urls as sandbox_urls

from . import health, metrics, views

handler404 = "common.errors.handler404"
handler500 = "common.errors.handler500"

# One flat list, the sandbox endpoints first: a request walks it in order, and an include
# with an empty prefix that does not match raises and records every pattern it tried
# (about half of resolving a sandbox request); the apps' paths never overlap.
api_v1 = [*sandbox_urls.urlpatterns, *account_urls.urlpatterns, *billing_urls.urlpatterns]

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file, not inline, so the CSP holds.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    re_path(r"^api/", errors.api_not_found),
    path("e2b/", include("e2bcompat.urls")),
    path("health/live", health.live, name="health-live"),
    path("health/ready", health.ready, name="health-ready"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/signup/", account_views.signup, name="signup"),
    path(
        "accounts/signup/confirm/<str:token>/",
        account_views.signup_confirm,
        name="signup-confirm",
    ),
    path("accounts/login/", account_views.LoginView.as_view(), name="login"),
    path(
        "accounts/password_reset/",
        account_views.PasswordResetView.as_view(),
        name="password_reset",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("organizations/switch/", account_views.switch_organization, name="switch-organization"),
    path("invitations/<str:token>/", account_views.accept_invitation, name="accept-invitation"),
    path("", include("playground.page_urls")),
]
