"""Settings for `collectstatic` at image build time only.

Identical to production except the static storage tolerates a vendored file that
references a source map it does not ship (static/vendor/xterm/5.5.0/xterm.js ->
xterm.js.map): Django's manifest storage would abort the whole collection on it. The
manifest written is the same format the production storage reads at run time.
Delete this file once the vendored source maps are shipped (or the storage is fixed in
playground/settings.py).
"""

from __future__ import annotations

from playground.settings import *  # noqa: F403
from playground.settings import STORAGES

STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "build_storage.LenientManifestStorage"},
}
