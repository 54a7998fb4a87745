"""REST endpoints for organizations, members, invitations and API keys."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.inputs import InputSerializer
from common.schema_shapes import results_of

from . import services
from .models import ApiKey, Invitation, Membership, Organization, Role
from .permissions import (
    HasOrganization,
    IsOrganizationManager,
    IsSignedIn,
    manager_of,
    principal_of,
)
from .selectors import api_keys_for_org, invitation_get_for_org


class ApiKeyOutput(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", default=None)
    revoked = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "created_by",
            "last_used_at",
            "expires_at",
            "revoked_at",
            "revoked",
        ]

    def get_revoked(self, obj: ApiKey) -> bool:
        return obj.revoked_at is not None


class ApiKeyListApi(APIView):
    permission_classes = [IsOrganizationManager]

    class ApiKeyCreateInput(InputSerializer):
        name = serializers.CharField(max_length=100, help_text="A label for the key.")
        expires_at = serializers.DateTimeField(
            required=False,
            allow_null=True,
            help_text="When the key stops working (ISO 8601); default never.",
        )

    @extend_schema(
        operation_id="v1_api_keys_list", responses=results_of("ApiKey", ApiKeyOutput(many=True))
    )
    def get(self, request: Request) -> Response:
        keys = api_keys_for_org(principal_of(request).organization)
        return Response({"results": ApiKeyOutput(keys, many=True).data})

    @extend_schema(request=ApiKeyCreateInput, responses={201: ApiKeyOutput})
    def post(self, request: Request) -> Response:
        data = self.ApiKeyCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        principal = principal_of(request)
        issued = services.api_key_create(
            organization=principal.organization,
            name=data.validated_data["name"],
            created_by=principal.user,
            expires_at=data.validated_data.get("expires_at"),
        )
        body = ApiKeyOutput(issued.api_key).data
        body["secret"] = issued.secret
        return Response(body, status=status.HTTP_201_CREATED)


class ApiKeyDetailApi(APIView):
    permission_classes = [IsOrganizationManager]

    @extend_schema(responses={200: ApiKeyOutput})
    def delete(self, request: Request, key_id: int) -> Response:
        api_key = get_object_or_404(
            ApiKey, pk=key_id, organization=principal_of(request).organization
        )
        services.api_key_revoke(api_key=api_key)
        return Response(ApiKeyOutput(api_key).data)


class MembershipOutput(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email")

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "created_at"]


class OrganizationOutput(serializers.Serializer):
    """What `_organization_data` answers, for the schema."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()
    plan = serializers.CharField()
    allow_network = serializers.BooleanField(help_text="Sandboxes may ask for outbound network.")
    docker_runtime = serializers.CharField(
        allow_blank=True, help_text='"runsc": gVisor required; "" the default runtime.'
    )


def _organization_data(org: Organization) -> dict[str, object]:
    return {
        "id": org.pk,
        "name": org.name,
        "slug": org.slug,
        "plan": org.plan,
        "allow_network": org.allow_network,
        "docker_runtime": org.docker_runtime,
    }


class OrganizationApi(APIView):
    """The caller's organization: anyone in it reads, an owner changes settings."""

    class OrganizationUpdateInput(InputSerializer):
        allow_network = serializers.BooleanField(
            required=False,
            help_text="Whether new sandboxes may ask for outbound network "
            '(POST /sandboxes {"network": true}). Off by default; owners only.',
        )
        docker_runtime = serializers.CharField(
            required=False,
            allow_blank=True,
            help_text='Docker runtime for new docker sandboxes: "runsc" requires gVisor for '
            "every sandbox of the organization (sandboxes on other providers are refused), "
            '"runc" opts out, "" (the default) follows the installation\'s '
            "SANDPIT_DOCKER_RUNTIME. Owners only.",
        )

        def to_internal_value(self, data: Any) -> Any:
            # JSON true/false only: DRF's BooleanField would take "yes" or 1 as consent.
            value = data.get("allow_network") if isinstance(data, dict) else None
            if value is not None and not isinstance(value, bool):
                raise serializers.ValidationError({"allow_network": ["Must be true or false."]})
            runtime = data.get("docker_runtime") if isinstance(data, dict) else None
            if runtime is not None and runtime not in services.DOCKER_RUNTIMES:
                raise serializers.ValidationError(
                    {
                        "docker_runtime": [
                            'Must be "" (the installation\'s default), "runc" or "runsc" (gVisor).'
                        ]
                    }
                )
            return super().to_internal_value(data)

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if not attrs:
                raise serializers.ValidationError(
                    "Nothing to change: send allow_network, docker_runtime or both."
                )
            return attrs

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method == "PATCH":
            return [IsOrganizationManager()]
        return [HasOrganization()]

    @extend_schema(responses=OrganizationOutput)
    def get(self, request: Request) -> Response:
        return Response(_organization_data(principal_of(request).organization))

    @extend_schema(request=OrganizationUpdateInput, responses=OrganizationOutput)
    def patch(self, request: Request) -> Response:
        data = self.OrganizationUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        principal = principal_of(request)
        assert principal.user is not None  # IsOrganizationManager: a signed-in person
        organization = services.organization_settings_set(
            actor=principal.user,
            organization=principal.organization,
            allow_network=data.validated_data.get("allow_network"),
            docker_runtime=data.validated_data.get("docker_runtime"),
        )
        return Response(_organization_data(organization))


class MemberListApi(APIView):
    permission_classes = [IsSignedIn]

    @extend_schema(responses=results_of("Membership", MembershipOutput(many=True)))
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        members = Membership.objects.filter(organization=principal.organization).select_related(
            "user"
        )
        return Response({"results": MembershipOutput(members, many=True).data})


class MemberDetailApi(APIView):
    permission_classes = [IsOrganizationManager]

    class MemberUpdateInput(InputSerializer):
        role = serializers.ChoiceField(choices=Role.choices, help_text="The member's new role.")

    @extend_schema(request=MemberUpdateInput, responses=MembershipOutput)
    def patch(self, request: Request, member_id: int) -> Response:
        principal = principal_of(request)
        membership = get_object_or_404(
            Membership, pk=member_id, organization=principal.organization
        )
        data = self.MemberUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_change_role(
            actor=manager_of(request), membership=membership, role=data.validated_data["role"]
        )
        return Response(MembershipOutput(membership).data)

    def delete(self, request: Request, member_id: int) -> Response:
        principal = principal_of(request)
        membership = get_object_or_404(
            Membership, pk=member_id, organization=principal.organization
        )
        services.membership_remove(actor=manager_of(request), membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationOutput(serializers.ModelSerializer):
    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "created_at", "expires_at", "accepted_at", "revoked_at"]


class InvitationListApi(APIView):
    permission_classes = [IsOrganizationManager]

    class InvitationCreateInput(InputSerializer):
        email = serializers.EmailField(help_text="Who to invite; the link is mailed there.")
        role = serializers.ChoiceField(
            choices=Role.choices,
            default="member",
            help_text="The role on joining (default member).",
        )

    @extend_schema(
        operation_id="v1_invitations_list",
        responses=results_of("Invitation", InvitationOutput(many=True)),
    )
    def get(self, request: Request) -> Response:
        invitations = Invitation.objects.filter(
            organization=principal_of(request).organization
        ).order_by("-created_at")
        return Response({"results": InvitationOutput(invitations, many=True).data})

    @extend_schema(request=InvitationCreateInput, responses={201: InvitationOutput})
    def post(self, request: Request) -> Response:
        data = self.InvitationCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        principal = principal_of(request)
        issued = services.invitation_create(
            actor=manager_of(request),
            organization=principal.organization,
            base_url=_site(request),
            **data.validated_data,
        )
        return Response(_issued_body(request, issued), status=status.HTTP_201_CREATED)


def _site(request: Request) -> str:
    """This site's scheme and host, for links in mail."""
    return request.build_absolute_uri("/").rstrip("/")


def _issued_body(request: Request, issued: services.IssuedInvitation) -> dict[str, object]:
    body = dict(InvitationOutput(issued.invitation).data)
    # The link is also returned so a manager can share it when the mail did not go out.
    body["url"] = request.build_absolute_uri(services.invitation_path(issued.token))
    body["emailed"] = issued.emailed
    return body


class InvitationDetailApi(APIView):
    """DELETE: cancel a pending invitation (its link stops working); 204 either way."""

    permission_classes = [IsOrganizationManager]

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, invitation_id: int) -> Response:
        principal = principal_of(request)
        invitation = invitation_get_for_org(
            organization=principal.organization, invitation_id=invitation_id
        )
        services.invitation_revoke(actor=manager_of(request), invitation=invitation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationResendApi(APIView):
    """POST: mail a pending invitation again with a new link and expiry (the old link ends)."""

    permission_classes = [IsOrganizationManager]

    @extend_schema(request=None, responses=InvitationOutput)
    def post(self, request: Request, invitation_id: int) -> Response:
        principal = principal_of(request)
        invitation = invitation_get_for_org(
            organization=principal.organization, invitation_id=invitation_id
        )
        issued = services.invitation_resend(
            actor=manager_of(request), invitation=invitation, base_url=_site(request)
        )
        return Response(_issued_body(request, issued))
