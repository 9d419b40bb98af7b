"""The JSON Schemas of report.json and compare.json (leaktrace/schemas/), and the check against them.

The schema files are the published contract: other tools validate what leaktrace writes with them.
``validate_report`` / ``validate_compare`` raise :class:`SchemaViolation` naming the first offending
property. The writers of report.json and compare.json call :func:`check_before_write`, which validates
only when ``LEAKTRACE_SCHEMA_CHECK=1`` is set (the test suite sets it), so a change that breaks the
contract fails there, loudly, instead of writing a report other tools cannot read. The check needs the
``jsonschema`` package (the ``dev`` extra); a user's hunt neither needs it nor pays for it. An installation
without it (a wheel installed in a fresh environment, under a test run that set the variable) says once on
stderr that it cannot check and writes unchecked: tests/test_schemas.py imports jsonschema itself, so a
development environment that lacks it fails there rather than passing unchecked.
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from leaktrace.errors import LeaktraceError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
SCHEMA_FILES = {"report": "report.schema.json", "compare": "compare.schema.json"}
ENV = "LEAKTRACE_SCHEMA_CHECK"


class SchemaViolation(LeaktraceError):
    """A report about to be written does not match its schema: a bug in leaktrace, never the user's."""


def schema_path(kind: str) -> Path:
    return SCHEMA_DIR / SCHEMA_FILES[kind]


@cache
def load_schema(kind: str) -> dict[str, Any]:
    return json.loads(schema_path(kind).read_text())


@cache
def _validator(kind: str) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema(kind))


@cache
def _have_jsonschema() -> bool:
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        print(f"leaktrace: warning: {ENV} is set but the jsonschema package is not installed: reports are "
              "written unchecked (pip install jsonschema)", file=sys.stderr)
        return False
    return True


def validate(kind: str, obj: Any) -> None:
    """Raise SchemaViolation when ``obj`` (a JSON-ready object) does not match the ``kind`` schema.
    Needs the jsonschema package."""
    errors = sorted(_validator(kind).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaViolation(f"{kind} does not match {SCHEMA_FILES[kind]} at {where}: {e.message}{more}",
                              "this is a bug in leaktrace: please report it with the session")


def validate_report(obj: Any) -> None:
    validate("report", obj)


def validate_compare(obj: Any) -> None:
    validate("compare", obj)


def check_enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def check_before_write(kind: str, text: str) -> None:
    """Validate the JSON text about to be written (what readers will parse), when the check is enabled."""
    if check_enabled() and _have_jsonschema():
        validate(kind, json.loads(text))
