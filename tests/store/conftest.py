"""Fixtures for the store tests: every store test runs on a real SQLite file and on a real PostgreSQL database.

PostgreSQL comes from ``FITEVICT_TEST_POSTGRES_URL`` (``scripts/test-postgres.sh`` starts a private server and sets it;
``./run.sh test`` goes through that script). Each test gets a schema of its own (``db_url``) or a database of its own
(``pg_url``), dropped afterwards. Without the variable the Postgres cases skip, with the reason the script recorded.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from fitevict.store import Store

PG_URL_ENV = "FITEVICT_TEST_POSTGRES_URL"
BACKENDS = ("sqlite", "postgres")


def _skip_reason() -> str:
    why = os.environ.get("FITEVICT_TEST_POSTGRES_SKIP")
    if why:
        return f"no PostgreSQL for the store tests: {why}"
    return (
        f"no PostgreSQL for the store tests: {PG_URL_ENV} is not set; run them through ./run.sh test or "
        "scripts/test-postgres.sh, or set it to a server where the role may CREATE DATABASE"
    )


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An autocommit engine on the test server's maintenance database (creates and drops per-test databases)."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(_skip_reason())
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as e:
        engine.dispose()
        pytest.fail(f"{PG_URL_ENV} is set but the server does not answer: {e}")
    yield engine
    engine.dispose()


@pytest.fixture
def pg_database(pg_admin: Engine) -> Iterator[Callable[[str], str]]:
    """``make(options)``: creates a fresh database (``CREATE DATABASE ... TEMPLATE template0 <options>``) and returns
    its URL; every database made is dropped after the test, connections and all."""
    made: list[str] = []

    def make(options: str = "") -> str:
        name = f"fitevict_t_{uuid.uuid4().hex[:16]}"  # generated here, never user input
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE template0 {options}')
        made.append(name)
        return make_url(os.environ[PG_URL_ENV]).set(database=name).render_as_string(hide_password=False)

    try:
        yield make
    finally:
        with pg_admin.connect() as conn:
            for name in made:
                conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: Callable[[str], str]) -> str:
    """The URL of a fresh, empty PostgreSQL database."""
    return pg_database("")


@pytest.fixture
def pg_schema_url(pg_admin: Engine) -> Iterator[str]:
    """A fresh, empty schema in the test database, as a store URL that puts it first on the search_path
    (``?options=-csearch_path=...``, as a deployment keeping fitevict in its own schema would). A schema costs
    milliseconds where a database costs a quarter second, so the tests run on every backend use this."""
    name = f"fitevict_t_{uuid.uuid4().hex[:16]}"  # generated here, never user input
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    try:
        yield make_url(os.environ[PG_URL_ENV]).update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
    finally:
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'data' / 'fitevict.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty store URL on each backend in turn: ``[sqlite]`` and ``[postgres]``."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_schema_url")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    try:
        yield s
    finally:
        s.close()
