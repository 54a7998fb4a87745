"""Server-rendered pages beyond the dashboard (the browser UI)."""

from django.urls import path

from . import views

urlpatterns = [
    path("sandboxes/<str:sandbox_id>/", views.playground, name="playground"),
    path("templates/", views.templates, name="templates"),
    path("team/", views.team, name="team"),
    path("billing/", views.billing, name="billing"),
    path("staff/", views.staff, name="staff"),
    path(
        "staff/sandboxes/<str:sandbox_id>/kill", views.staff_sandbox_kill, name="staff-sandbox-kill"
    ),
]
