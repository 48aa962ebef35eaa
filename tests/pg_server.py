"""The PostgreSQL server the tests may write to: SPECSCOPE_TEST_DATABASE_URL, e.g.

    SPECSCOPE_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/specscope_test

`.ci/run` starts a throwaway server and sets it; without it these tests skip. `fresh_schema`
gives each test a schema of its own (dropped afterwards), so tests and reruns never see each
other's runs, and a run left 'running' by one test is not recovered by another.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

URL = os.environ.get("SPECSCOPE_TEST_DATABASE_URL")
SKIP_REASON = (
    "SPECSCOPE_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one when it can)"
)
requires_server = pytest.mark.skipif(not URL, reason=SKIP_REASON)


@contextmanager
def fresh_schema(label: str = "t") -> Iterator[str]:
    """A new schema on the server; yields the URL whose connections use it (search_path)."""
    pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install -e '.[postgres]')")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    assert URL, SKIP_REASON
    schema = f"specscope_{label}_{uuid.uuid4().hex[:10]}".lower()
    admin = create_engine(URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        try:
            with admin.begin() as conn:  # a leaked connection holding a lock fails the test, not hangs it
                conn.execute(text("SET LOCAL lock_timeout = '20s'"))
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        finally:
            admin.dispose()
