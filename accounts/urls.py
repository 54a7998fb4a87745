from django.urls import path

from . import apis

urlpatterns = [
    path("organization", apis.OrganizationApi.as_view(), name="api-organization"),
    path("members", apis.MemberListApi.as_view(), name="api-members"),
    path("members/<int:member_id>", apis.MemberDetailApi.as_view(), name="api-member"),
    path("invitations", apis.InvitationListApi.as_view(), name="api-invitations"),
    path(
        "invitations/<int:invitation_id>",
        apis.InvitationDetailApi.as_view(),
        name="api-invitation",
    ),
    path(
        "invitations/<int:invitation_id>/resend",
        apis.InvitationResendApi.as_view(),
        name="api-invitation-resend",
    ),
    path("api-keys", apis.ApiKeyListApi.as_view(), name="api-keys"),
    path("api-keys/<int:key_id>", apis.ApiKeyDetailApi.as_view(), name="api-key"),
]
