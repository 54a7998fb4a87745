"""Server-rendered pages beyond the dashboard (the browser UI)."""

from django.urls import path

from . import views

urlpatterns = [
    path("team/", views.team, name="team"),
]
