"""Fixtures shared by the platform tests.

`database_url`: each test that asks for it runs on a fresh SQLite file and on a throwaway
PostgreSQL database (`postgres_database_url`: PostgreSQL only); `session_factory`: the same, migrated. `s3_server`: a real S3-compatible server (moto's standalone server
over HTTP), one per session.

PostgreSQL comes from LORALOOM_TEST_POSTGRES_URL (default: the local trust-auth server's
`test` database). Each test creates its own database next to it and drops it afterwards,
so parallel or repeated runs never see each other's tables.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from postgres_databases import POSTGRES_URL, throwaway_postgres_database

from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database
from loraloom.platform.storage.s3 import make_s3_client



@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    try:
        with engine.connect():
            pass
    except OperationalError as error:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL} (set LORALOOM_TEST_POSTGRES_URL): {error}")
    finally:
        engine.dispose()
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'loraloom.db'}"
        return
    with throwaway_postgres_database(request.getfixturevalue("postgres_admin_url")) as url:
        yield url


@pytest.fixture
def postgres_database_url(postgres_admin_url: str) -> Iterator[str]:
    """A throwaway PostgreSQL database only, for tests of what PostgreSQL does (a server going away)."""
    with throwaway_postgres_database(postgres_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session: a test's migrated SQLite database starts as a copy of it."""
    path = tmp_path_factory.mktemp("migrated-template") / "loraloom.db"
    upgrade_database(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def migrated_postgres_template(postgres_admin_url: str) -> Iterator[str]:
    """A PostgreSQL database migrated once per session (its name): a test's migrated PostgreSQL database
    is created from it as a template, a file copy, instead of running every migration again."""
    with throwaway_postgres_database(postgres_admin_url) as url:
        upgrade_database(url)  # disposes its connections: a template must have none when it is copied
        yield make_url(url).database


def migrate_from_template(url: str, request: pytest.FixtureRequest) -> None:
    """Bring the empty database at `url` to the latest revision: a copy of the session's migrated template
    where the database is still untouched, else the migrations themselves."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(request.getfixturevalue("migrated_sqlite_template"), path)
            return
    elif parsed.get_backend_name() == "postgresql":
        template = request.getfixturevalue("migrated_postgres_template")
        database = create_engine(url)
        try:
            with database.connect() as connection:
                untouched = connection.scalar(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")) == 0
        finally:
            database.dispose()
        if untouched:
            admin = create_engine(request.getfixturevalue("postgres_admin_url"), isolation_level="AUTOCOMMIT")
            try:
                with admin.connect() as connection:
                    connection.execute(text(f'DROP DATABASE "{parsed.database}" WITH (FORCE)'))
                    connection.execute(text(f'CREATE DATABASE "{parsed.database}" TEMPLATE "{template}"'))
            finally:
                admin.dispose()
            return
    upgrade_database(url)


def migrated_session_factory(url: str, request: pytest.FixtureRequest) -> Iterator[sessionmaker[Session]]:
    migrate_from_template(url, request)
    engine = create_db_engine(url)
    try:
        yield create_session_factory(engine)
    finally:
        engine.dispose()


@pytest.fixture
def session_factory(database_url: str, request: pytest.FixtureRequest) -> Iterator[sessionmaker[Session]]:
    """A migrated database: SQLite and PostgreSQL."""
    yield from migrated_session_factory(database_url, request)


@pytest.fixture
def sqlite_session_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[sessionmaker[Session]]:
    """A migrated SQLite database, for tests whose subject is not the database."""
    yield from migrated_session_factory(f"sqlite:///{tmp_path / 'migrated.db'}", request)


REGION = "us-east-1"
BUCKET = "loraloom-test"
STARTUP_TIMEOUT_S = 30


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    region: str


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_server_command() -> str:
    beside_python = Path(sys.executable).with_name("moto_server")
    found = str(beside_python) if beside_python.exists() else shutil.which("moto_server")
    if found is None:
        pytest.skip("moto_server not installed; pip install 'moto[server]'")
    return found


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    port = _free_loopback_port()
    process = subprocess.Popen(
        [_moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()
    log: list[str] = []

    def drain_log() -> None:
        # Werkzeug announces "Running on http://..." once it listens; keep reading after that
        # so the per-request log lines never fill the pipe and block the server.
        for line in process.stderr:
            log.append(line)
            if "Running on" in line:
                ready.set()
        ready.set()  # the server exited: stop waiting

    drainer = threading.Thread(target=drain_log, daemon=True)
    drainer.start()
    try:
        if not ready.wait(STARTUP_TIMEOUT_S) or process.poll() is not None:
            raise RuntimeError("moto_server did not start:\n" + "".join(log))
        with pytest.MonkeyPatch.context() as env:
            # boto3 reads credentials from the environment; moto accepts any.
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            server = S3Server(endpoint_url=f"http://127.0.0.1:{port}", bucket=BUCKET, region=REGION)
            make_s3_client(endpoint_url=server.endpoint_url, region=REGION).create_bucket(Bucket=BUCKET)
            yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        drainer.join()  # it stops at the end of the closed pipe
        process.stderr.close()
