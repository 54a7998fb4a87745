"""Build the built-in templates (python, node, polyglot), reusing what is built already."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.errors import ApplicationError
from sandboxes.template_builtins import BUILTINS, templates_builtin_build


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)


class Command(BaseCommand):
    help = (
        "Build the built-in templates (default: all) as Docker images and local root file "
        "systems, cached by content: a second run only checks they are there."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help=f"Some of {', '.join(BUILTINS)}.")
        parser.add_argument("--quiet", action="store_true", help="Do not echo build output.")
        parser.add_argument(
            "--no-db",
            action="store_true",
            help="Only build the images and root file systems (no database rows).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["names"] or list(BUILTINS)
        echo = None if options["quiet"] else _to_stderr
        started = time.monotonic()
        try:
            built = templates_builtin_build(names, record=not options["no_db"], on_output=echo)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        failed = [t for t in built if t.state != "ready"]
        for template in built:
            self.stdout.write(
                f"{template.name}: {template.state} {template.image} "
                f"({template.size_bytes // (1024 * 1024)} MiB; {', '.join(template.languages)})"
            )
        self.stdout.write(f"in {time.monotonic() - started:.1f} s")
        if failed:
            raise CommandError("; ".join(f"{t.name}: {t.error_message or t.state}" for t in failed))
