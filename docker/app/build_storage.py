"""The production static storage, minus the abort on a missing source map (build only)."""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class LenientManifestStorage(CompressedManifestStaticFilesStorage):
    def url_converter(self, name, hashed_files, template=None):  # type: ignore[no-untyped-def]
        convert = super().url_converter(name, hashed_files, template)

        def lenient(matchobj):  # type: ignore[no-untyped-def]
            try:
                return convert(matchobj)
            except ValueError:
                if ".map" in matchobj.group(0):
                    return matchobj.group(0)
                raise

        return lenient
