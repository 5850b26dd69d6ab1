"""Atomic cell claims: every cell of a study is trained by one submission at a time, exactly once.

A cell is claimed in a transactional store (SQLite with its write lock on one machine, PostgreSQL on a
cluster) before it trains. A claim holds a lease whose expiry is computed by the store's clock (never a
client's), renewed while its submission lives, and a fencing token that grows with every claim. A result is
written only by the holder of the current token: ``finish`` marks the cell done in the same statement that
checks the token, and only then is the MLflow run ended as a result. A submission that died loses its leases
when they expire; another submission then claims its cells (token + 1), and the dead one's late writes are
refused.

States: ``open`` (anyone may claim), ``claimed`` (held until ``lease_until``), ``done`` (its result is
``run_id``; ``lease_until`` is the window in which the holder writes that run to MLflow). A ``done`` cell whose
run never reached MLflow is reopened once that window has passed (``reopen_lost``).

The key is (study, cell id, code fingerprint): a cell trained by other code is another cell. A submission that
takes any code's results (``reuse_results: any_code``) claims under ``ANY_CODE`` instead, and a claim is refused
while a rival holds the cell: for ``ANY_CODE`` a live claim under any fingerprint (its result will count), for a
fingerprint a live ``ANY_CODE`` claim (its result may be this code's). Without that, two such submissions of other
code, or one beside a submission of its own code, both trained the cell.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    case,
    create_engine,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy.engine import Engine

from ablations.stores import patiently

ANY_CODE = "any"  # the code key of a submission whose results may be any code's (reuse_results: any_code)
LEASE_S = 60.0  # a claim held this long without renewal is free again
RENEW_S = 15.0  # how often a live submission renews its leases
# a database briefly away (a PostgreSQL restart) costs a transaction a wait, within a lease's margin over its renewal
PATIENCE_S = LEASE_S - RENEW_S - 5.0
WRITE_WINDOW_S = 600.0  # a done cell whose run is not in MLflow after this long is reopened

metadata = MetaData()
CLAIMS = Table(
    "ablate_claims",
    metadata,
    Column("study", String(250), primary_key=True),
    Column("cell_id", String(64), primary_key=True),
    Column("code", String(64), primary_key=True),
    Column("owner", String(250), nullable=False),
    Column("token", Integer, nullable=False),
    Column("lease_until", Float, nullable=False),  # seconds since the epoch, by the store's clock
    Column("state", String(16), nullable=False),  # open | claimed | done
    Column("run_id", String(64), nullable=True),
)


# a study's registration and its amendments (ablations.register): one row per version, inserted atomically, so two
# submissions registering one new study at once end with one registration
REGISTRATIONS = Table(
    "ablate_registrations",
    metadata,
    Column("study", String(250), primary_key=True),
    Column("store", String(250), primary_key=True),  # the MLflow experiment (id@creation time): each store its own
    Column("version", Integer, primary_key=True),  # 0: the registration; 1, 2, ...: amendments
    Column("hash", String(64), nullable=False),
    Column("created", Float, nullable=False),  # the store's clock
    Column("record", Text, nullable=False),  # JSON: the declaration, the reason, the cells finished by then, ...
)


def patient(method):
    """A method whose transaction is tried again while the database is briefly away (stores.patiently): each is one
    transaction, so a retry either finds it undone or, after a commit whose answer was lost, finds its own effect."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return patiently(lambda: method(self, *args, **kwargs), PATIENCE_S)

    return wrapper


def host_name() -> str:
    """This machine's name in claims: ABLATE_HOST (containers' host names may mean nothing), else the hostname."""
    return os.environ.get("ABLATE_HOST") or socket.gethostname()


def owner_id() -> str:
    """This process: host, pid and a random part (pids repeat across machines and restarts)."""
    return f"{host_name()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def claims_url(tracking_uri: str, explicit: str | None = None) -> str:
    """Where claims live: ``--claims``/ABLATE_CLAIMS_URL; else beside a SQLite MLflow store; else the shared
    Optuna storage when it is a database server (PostgreSQL on a cluster); else this machine's .ablate/."""
    url = explicit or os.environ.get("ABLATE_CLAIMS_URL")
    if url:
        return url
    if tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).with_name('claims.db')}"
    storage = os.environ.get("ABLATE_OPTUNA_STORAGE", "")
    if storage.startswith(("postgresql", "mysql")):
        return storage
    from ablations import tracking

    return f"sqlite:///{tracking.home() / 'claims.db'}"


def is_local(url: str) -> bool:
    """A store only this machine can reach (a multi-node cluster needs a database server)."""
    return url.startswith("sqlite")


@functools.lru_cache(maxsize=8)
def engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        # BEGIN IMMEDIATE: a transaction takes SQLite's write lock before it reads, so two claims serialise
        # (SQLAlchemy's recipe for pysqlite: the driver's own transaction handling off, ours on)
        eng = create_engine(url, connect_args={"timeout": 60, "isolation_level": None})

        from sqlalchemy import event

        @event.listens_for(eng, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        metadata.create_all(eng, checkfirst=True)  # under SQLite's write lock: one creator at a time
    else:
        eng = create_engine(url, pool_pre_ping=True)
        with eng.begin() as conn:  # ten submissions at once must not race to CREATE TABLE: one at a time
            if eng.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_CREATE_LOCK})")
            metadata.create_all(conn, checkfirst=True)
    return eng


_CREATE_LOCK = 0x61626C61  # "abla": the advisory lock that serialises creating the claims table on PostgreSQL


def _now(eng: Engine):
    """The store's clock, in seconds since the epoch (an SQL expression: never the client's clock)."""
    if eng.dialect.name == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)
    if eng.dialect.name == "postgresql":
        return literal_column("extract(epoch from clock_timestamp())", Float)
    raise ValueError(f"claims need SQLite or PostgreSQL (got {eng.dialect.name}); set ABLATE_CLAIMS_URL")


def _insert(eng: Engine):
    if eng.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(CLAIMS)


def _dead_here(owner: str, host: str) -> bool:
    """Whether ``owner`` (host:pid:random) is a process of this machine that has exited."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class Claim:
    study: str
    cell_id: str
    code: str
    token: int


class Registry:
    """The registrations of studies in the claims store at ``url`` (``ablations.register``)."""

    def __init__(self, url: str) -> None:
        self.url, self.engine = url, engine(url)

    @patient
    def entries(self, study: str, store: str) -> list[dict]:
        """The versions recorded for a study in a store, oldest first: version, hash, created, record."""
        query = select(REGISTRATIONS).where(REGISTRATIONS.c.study == study, REGISTRATIONS.c.store == store)
        with self.engine.begin() as conn:
            rows = conn.execute(query.order_by(REGISTRATIONS.c.version)).all()
        return [dict(r._mapping) for r in rows]

    @patient
    def add(self, study: str, store: str, version: int, hash: str, record: str) -> float | None:
        """Record a version if none has that number yet; its time by the store's clock, or None when another
        submission recorded that version first (the caller reads it back and decides again)."""
        from sqlalchemy.exc import IntegrityError

        values = dict(study=study, store=store, version=version, hash=hash, record=record)
        try:
            with self.engine.begin() as conn:
                now = conn.execute(select(_now(self.engine))).scalar_one()
                conn.execute(REGISTRATIONS.insert().values(**values, created=now))
        except IntegrityError:
            return None
        return float(now)


class Claims:
    """The claims of one submission (``owner``) in the store at ``url``."""

    def __init__(self, url: str, owner: str | None = None, lease_s: float = LEASE_S) -> None:
        self.url, self.owner, self.lease_s = url, owner or owner_id(), lease_s
        self.engine = engine(url)

    def _key(self, study: str, cell_id: str, code: str):
        return and_(CLAIMS.c.study == study, CLAIMS.c.cell_id == cell_id, CLAIMS.c.code == code)

    def _rival(self, conn, study: str, cell_id: str, code: str):
        """Another owner's live claim that stands for this one: under a fingerprint if ``code`` is ``ANY_CODE``,
        under ``ANY_CODE`` otherwise (module docstring)."""
        other = CLAIMS.c.code != ANY_CODE if code == ANY_CODE else CLAIMS.c.code == ANY_CODE
        live = and_(CLAIMS.c.state == "claimed", CLAIMS.c.lease_until >= _now(self.engine))
        query = select(CLAIMS).where(CLAIMS.c.study == study, CLAIMS.c.cell_id == cell_id, other, live)
        return conn.execute(query.where(CLAIMS.c.owner != self.owner).limit(1)).first()

    @patient
    def rival(self, study: str, cell_id: str, code: str) -> dict | None:
        """The row of a live rival claim (``_rival``), or None."""
        with self.engine.begin() as conn:
            row = self._rival(conn, study, cell_id, code)
        return dict(row._mapping) if row else None

    @patient
    def claim(self, study: str, cell_id: str, code: str) -> Claim | None:
        """Take the cell if it is open, its lease has expired, or this owner holds it; None if another holds it, a
        rival holds it (``_rival``), or it is done. Atomic: of any number of concurrent claims, one gets the cell
        (the rival check and the claim are one transaction: under SQLite's write lock, or PostgreSQL's advisory
        lock on the cell)."""
        now = _now(self.engine)
        stmt = _insert(self.engine).values(
            study=study, cell_id=cell_id, code=code, owner=self.owner, token=1, lease_until=now + self.lease_s,
            state="claimed", run_id=None,
        )  # fmt: skip
        stmt = stmt.on_conflict_do_update(
            index_elements=[CLAIMS.c.study, CLAIMS.c.cell_id, CLAIMS.c.code],
            set_={
                "owner": stmt.excluded.owner,
                "token": CLAIMS.c.token + 1,
                "lease_until": stmt.excluded.lease_until,
                "state": "claimed",
                "run_id": None,
            },
            where=and_(
                CLAIMS.c.state != "done",
                or_(CLAIMS.c.state == "open", CLAIMS.c.lease_until < now, CLAIMS.c.owner == self.owner),
            ),
        ).returning(CLAIMS.c.token)
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":  # the rival check and the claim, one at a time per cell
                conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"claim {study} {cell_id}"))))
            if self._rival(conn, study, cell_id, code) is not None:
                return None
            row = conn.execute(stmt).first()
        return Claim(study, cell_id, code, row[0]) if row else None

    @patient
    def next_number(self, study: str, at_least: int = 1, store: str = "") -> int:
        """The next submission number of ``study``, atomically (ten submissions at once get ten numbers), and at
        least ``at_least`` (the numbers MLflow already holds from before). ``store`` names the MLflow experiment
        the submissions go to: each store beside the same claims counts its own submissions from 1."""
        stmt = _insert(self.engine).values(
            study=study, cell_id="#submissions", code=f"counter {store}".strip()[:64], owner="-", token=at_least,
            lease_until=0.0, state="done", run_id=None,
        )  # fmt: skip
        stmt = stmt.on_conflict_do_update(
            index_elements=[CLAIMS.c.study, CLAIMS.c.cell_id, CLAIMS.c.code],
            set_={"token": case((CLAIMS.c.token + 1 < at_least, at_least), else_=CLAIMS.c.token + 1)},
        ).returning(CLAIMS.c.token)
        with self.engine.begin() as conn:
            return int(conn.execute(stmt).scalar_one())

    @patient
    def renew(self, claims: list[Claim]) -> tuple[list[Claim], list[Claim]]:
        """Extend the leases still held. Returns (lost, ended): claims another holder took over after they
        expired, and claims that ended (their cell done, or given back) and need no lease any more."""
        lost, ended = [], []
        with self.engine.begin() as conn:
            for c in claims:
                key = self._key(c.study, c.cell_id, c.code)
                result = conn.execute(
                    CLAIMS.update()
                    .where(key, CLAIMS.c.token == c.token, CLAIMS.c.state == "claimed")
                    .values(lease_until=_now(self.engine) + self.lease_s)
                )
                if result.rowcount == 0:
                    row = conn.execute(select(CLAIMS.c.token).where(key)).first()
                    (ended if row is not None and row.token == c.token else lost).append(c)
        return lost, ended

    @patient
    def finish(self, claim: Claim, run_id: str) -> bool:
        """Mark the cell done with ``run_id`` if ``claim`` still holds it (its token is current): the fencing
        check. Leaves ``WRITE_WINDOW_S`` to write the run to MLflow. False: another took it over; write no
        result. A retry of this holder's own trial after it passed the fence (its run then failed to end, and its
        result never reached MLflow) passes again with the same token: it was refused, its run marked killed as
        "taken over", and the cell held for the write window by nobody."""
        with self.engine.begin() as conn:
            result = conn.execute(
                CLAIMS.update()
                .where(
                    self._key(claim.study, claim.cell_id, claim.code),
                    CLAIMS.c.token == claim.token,
                    or_(CLAIMS.c.state == "claimed", and_(CLAIMS.c.state == "done", CLAIMS.c.owner == self.owner)),
                )
                .values(state="done", run_id=run_id, lease_until=_now(self.engine) + WRITE_WINDOW_S)
            )
        return result.rowcount == 1

    @patient
    def release(self, claim: Claim) -> None:
        """Give the cell back (it failed or was interrupted): anyone may claim it again."""
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.update()
                .where(self._key(claim.study, claim.cell_id, claim.code), CLAIMS.c.token == claim.token)
                .where(CLAIMS.c.state == "claimed")
                .values(state="open", lease_until=_now(self.engine))
            )

    @patient
    def reopen_lost(self, study: str, cell_id: str, code: str, run_id: str | None, *, at_once: bool = False) -> bool:
        """A done cell whose run (``run_id``) never reached MLflow as a result, after its write window: open it.
        ``at_once``: the run is not in the MLflow store at all (another store beside the same claims, or a store
        deleted and started again), so no holder is still writing it there: open it without waiting."""
        with self.engine.begin() as conn:
            update = CLAIMS.update().where(
                self._key(study, cell_id, code), CLAIMS.c.state == "done", CLAIMS.c.run_id == run_id
            )
            if not at_once:
                update = update.where(CLAIMS.c.lease_until < _now(self.engine))
            result = conn.execute(update.values(state="open"))
        return result.rowcount == 1

    @patient
    def expire_dead_local_owners(self, study: str) -> int:
        """Free now the claims held by processes of this machine that no longer exist (a killed driver), instead
        of waiting for their leases to expire. Owners on other machines are judged by their leases only."""
        host = host_name()
        with self.engine.begin() as conn:
            owners = conn.execute(
                select(CLAIMS.c.owner).distinct().where(CLAIMS.c.study == study, CLAIMS.c.state == "claimed")
            ).scalars()
            dead = [o for o in owners if _dead_here(o, host)]
            for owner in dead:
                conn.execute(
                    CLAIMS.update()
                    .where(CLAIMS.c.study == study, CLAIMS.c.owner == owner, CLAIMS.c.state == "claimed")
                    .values(lease_until=_now(self.engine))
                )
        return len(dead)

    @patient
    def cell_rows(self, study: str, cell_id: str) -> list[dict]:
        """The cell's rows under every code (as ``state`` gives one)."""
        left = (CLAIMS.c.lease_until - _now(self.engine)).label("left")
        with self.engine.begin() as conn:
            rows = conn.execute(select(CLAIMS, left).where(CLAIMS.c.study == study, CLAIMS.c.cell_id == cell_id))
            return [dict(row._mapping) for row in rows]

    @patient
    def state(self, study: str, cell_id: str, code: str) -> dict | None:
        """The cell's row (state, owner, token, run_id, seconds left on the lease), or None if never claimed."""
        with self.engine.begin() as conn:
            row = conn.execute(
                select(CLAIMS, (CLAIMS.c.lease_until - _now(self.engine)).label("left")).where(
                    self._key(study, cell_id, code)
                )
            ).first()
        return dict(row._mapping) if row else None


@dataclass(frozen=True)
class Fence:
    """The check a trial makes before it writes a result: picklable, so it travels to Ray workers (and to rank 0
    of a data-parallel trial)."""

    url: str
    owner: str
    claim: Claim

    def __call__(self, run_id: str) -> bool:
        return Claims(self.url, self.owner).finish(self.claim, run_id)
