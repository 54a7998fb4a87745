from django.contrib import admin

from .models import Sandbox


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = ["id", "organization", "provider", "state", "created_at", "last_activity_at"]
    list_filter = ["state", "provider"]
    search_fields = ["id", "provider_id", "organization__slug"]
    readonly_fields = ["id", "provider_id", "created_at", "started_at", "destroyed_at"]
