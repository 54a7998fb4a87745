"""What a template's Dockerfile may ask of the build (sandboxes/dockerfiles.py): Sandpit's
own bases only, pinned; nothing that reaches the host, a registry or later builds."""

from __future__ import annotations

import pytest

from common.errors import PayloadTooLarge
from sandboxes.dockerfiles import MAX_DOCKERFILE_BYTES, DockerfileRefused, dockerfile_check

LOCAL = {"sandpit": "sandpit-sandbox:abc", "python": "sandpit-template:builtin-python-1"}


def check(text: str) -> str:
    return dockerfile_check(text, resolve_base=LOCAL.get).text


def test_bases_are_pinned_and_continuations_joined():
    text = (
        "# a comment\n"
        "FROM python AS build\n"
        "RUN echo one \\\n"
        "  # a comment inside\n"
        " && echo two\n"
        "FROM sandpit\n"
        "COPY --from=build /opt/x /opt/x\n"
        "COPY --from=0 /opt/y /opt/y\n"
    )
    checked = dockerfile_check(text, resolve_base=LOCAL.get)
    assert checked.bases == ("python", "sandpit")
    assert checked.text.splitlines() == [
        "FROM sandpit-template:builtin-python-1 AS build",
        "RUN echo one && echo two",
        "FROM sandpit-sandbox:abc",
        "COPY --from=build /opt/x /opt/x",
        "COPY --from=0 /opt/y /opt/y",
    ]


def test_a_stage_may_build_on_an_earlier_stage():
    assert "FROM base" in check("FROM sandpit AS base\nFROM base\nRUN true\n")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("FROM debian:bookworm\n", "FROM debian:bookworm is not available"),
        ("FROM registry.example.com/evil:latest\n", "is not available"),
        ("FROM scratch\n", "is not available"),
        ("FROM sandpit-template:tpl-other-org\n", "is not available"),
        ("ARG IMG=debian\nFROM $IMG\n", "build arguments"),
        ("FROM --platform=linux/arm64 sandpit\n", "no flags"),
        ("RUN true\n", "starts with FROM"),
        ("FROM sandpit\nVOLUME /data\n", "VOLUME"),
        ("FROM sandpit\nONBUILD RUN rm -rf /\n", "ONBUILD"),
        ('FROM sandpit\nENTRYPOINT ["/bin/sh"]\n', "ENTRYPOINT"),
        (
            "FROM sandpit\nRUN --mount=type=bind,source=/,target=/host cat /host/etc/shadow\n",
            "RUN takes no flags",
        ),
        ("FROM sandpit\nRUN --network=host true\n", "RUN takes no flags"),
        ("FROM sandpit\nCOPY --from=debian:bookworm /etc/shadow /x\n", "earlier stage"),
        ("FROM sandpit\nCOPY --from=0 /x /y\n", "earlier stage"),  # itself, not earlier
        ("FROM sandpit\nADD http://169.254.169.254/latest/meta-data /m\n", "URL"),
        ("# escape=`\nFROM sandpit\n", "parser directives"),
        ("# syntax=docker/dockerfile:1\nFROM sandpit\n", "parser directives"),
        ("FROM sandpit\nFROBNICATE x\n", "unknown instruction"),
        ("", "empty"),
        ("FROM sandpit\x00\n", "NUL"),
    ],
)
def test_refused(text, fragment):
    with pytest.raises(DockerfileRefused, match=fragment.replace("[", r"\[")):
        check(text)


def test_a_huge_dockerfile_is_too_large():
    with pytest.raises(PayloadTooLarge):
        check("FROM sandpit\n" + "RUN true\n" * (MAX_DOCKERFILE_BYTES // 9 + 1))
