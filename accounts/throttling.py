from __future__ import annotations

from rest_framework.throttling import SimpleRateThrottle

from .authentication import Principal


class PerKeyRateThrottle(SimpleRateThrottle):
    """One bucket per API key, sandbox token or user; anonymous callers per IP."""

    scope = "per_key"

    def get_cache_key(self, request, view):  # type: ignore[no-untyped-def]
        auth = getattr(request, "auth", None)
        if isinstance(auth, Principal):
            if auth.api_key is not None:
                ident = f"key:{auth.api_key.pk}"
            elif auth.token is not None:
                ident = f"tok:{auth.token.token_id}"
            else:
                ident = f"user:{auth.user.pk if auth.user else 'none'}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
