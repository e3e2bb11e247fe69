"""Every ASTRAEUS_* environment variable that configures Astraeus, in one place (pydantic-settings).

Each component reads its own model once, at start, and refuses to start on a bad value with one line that
names the variable and says what it must be:

    astraeus server: ASTRAEUS_HEARTBEAT: must be a number of seconds > 0, got "abc"

  ServerSettings  `astraeus server` and `astraeus up`: the control plane's one settings object (ControlPlane.settings)
  AgentSettings   `astraeus agent` (and the agents `astraeus up` starts)
  CliSettings     `astra`
  DemoSettings    `make demo`

This module and astraeus.envvars are the only ones that read the environment (tests/test_no_environ.py); it imports
nothing of Astraeus but bottom modules (units, imageref, imagemap, users, spec, envvars), so that any part may
import it. An empty variable counts as unset. docs/configuration.md is generated from these models and the lists below:
`python -m astraeus.settings > docs/configuration.md` (a test checks that it is current).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from astraeus import envvars

PREFIX = "ASTRAEUS_"


class SettingsError(ValueError):
    """A variable has a value Astraeus cannot use; str(e) is one line per bad variable, naming it. `values`: each
    bad variable's name → the value it was given."""

    def __init__(self, message: str, values: dict[str, str] | None = None):
        super().__init__(message)
        self.values = values or {}


def setting(default: Any, description: str, must: str, **constraints) -> Any:
    """A field with its meaning (`description`) and what a value must be (`must`, for the error line)."""
    return Field(default, description=description, json_schema_extra={"must": must}, **constraints)


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError("not an http(s) URL")
    return value.rstrip("/") if value else value


def size_setting(value, name: str) -> int | None:
    """A size setting: bytes, or a size such as 10GiB (astraeus.units); None stays None."""
    if value is None or isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    from astraeus.units import UnitError, parse_memory

    try:
        return parse_memory(text, name)
    except UnitError as e:
        raise ValueError(str(e)) from None


def comma_items(value) -> list[str]:
    """The entries of a comma-separated setting (or of a list given as such), stripped, empty ones left out."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return [x.strip() for x in items if x and x.strip()]


def http_urls(value: str) -> str:
    """One http(s) URL or several, comma-separated (the control plane's replicas): each checked, trailing slashes
    dropped; ValueError naming the first bad one."""
    from urllib.parse import urlsplit

    urls = [u.strip() for u in value.split(",")]
    for url in urls:
        if not url:
            raise ValueError("an empty URL in the list (two commas in a row, or one at an end)")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- raises on a port that is not a number
        except ValueError as e:
            raise ValueError(f"{url!r} is not a valid URL: {e}") from None
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host")
    return ",".join(u.rstrip("/") for u in urls)


class _Variables(PydanticBaseSettingsSource):
    """The environment's values, less the fields that are not variables (a model's NOT_VARIABLES)."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field, field_name):  # unused: __call__ asks the environment's source
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        skip = getattr(self.settings_cls, "NOT_VARIABLES", frozenset())
        return {k: v for k, v in self.env().items() if k not in skip}


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore")

    READ_BY: ClassVar[str] = ""
    # Fields given by the command line or by tests, never read from the environment (nor documented as variables).
    NOT_VARIABLES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **given: Any) -> None:
        """The environment's values, with `given` fields winning; raises SettingsError naming each bad variable,
        TypeError on a keyword that is no field (a misspelt one would otherwise be dropped)."""
        unknown = sorted(k for k in given if k not in type(self).model_fields and not k.startswith("_"))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(unknown)}")
        try:
            super().__init__(**given)
        except ValidationError as e:
            errors = e.errors()
            raise SettingsError("\n".join(self._explain(err) for err in errors),
                                dict(self._raw(err) for err in errors)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return init_settings, _Variables(settings_cls, env_settings), dotenv_settings, file_secret_settings

    @classmethod
    def load(cls, **given: Any) -> Self:
        """Read the environment, with the `given` fields that are not None winning (a command line's options);
        raises SettingsError naming each bad variable."""
        return cls(**{k: v for k, v in given.items() if v is not None})

    @classmethod
    def variables(cls) -> dict[str, Any]:
        """field → its FieldInfo, for the fields read from the environment."""
        return {f: info for f, info in cls.model_fields.items() if f not in cls.NOT_VARIABLES}

    @classmethod
    def env_name(cls, field: str) -> str:
        return PREFIX + field.upper()

    @classmethod
    def _raw(cls, err: dict) -> tuple[str, str]:
        """(the variable's name, the value it was given) of one validation error."""
        field = str(err["loc"][0]) if err.get("loc") else ""
        name = cls.env_name(field) if field else PREFIX + "*"
        raw = next((v for k, v in envvars.prefixed(name) if k.upper() == name), err.get("input"))
        return name, str(raw)

    @classmethod
    def _explain(cls, err: dict) -> str:
        field = str(err["loc"][0]) if err.get("loc") else ""
        info = cls.model_fields.get(field)
        if info is None:
            return f"{PREFIX}*: {err.get('msg', 'invalid')}"
        name, raw = cls._raw(err)
        must = (info.json_schema_extra or {}).get("must") or err.get("msg", "invalid")
        return f"{name}: must be {must}, got {json.dumps(raw)}"


class HomeSettings(_Settings):
    home: Path = setting(Path("~/.astraeus"), "Where the control plane keeps its SQLite database and the `env` file "
                         "with fresh tokens, and where an agent keeps its state (`<home>/agents/<name>`) unless "
                         "ASTRAEUS_STATE_DIR is set. `--home` overrides it.", "a directory path")

    @field_validator("home")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()


class ServerSettings(HomeSettings):
    """The control plane: what one control-plane process runs with (ControlPlane.settings). Read from the
    environment; `astraeus server` gives host, port (and --home, --replica-id) as keywords, tests any field."""

    READ_BY: ClassVar[str] = "`astraeus server`, `astraeus up`"
    NOT_VARIABLES: ClassVar[frozenset[str]] = frozenset({"host", "port", "schedule_debounce"})

    host: str = "127.0.0.1"  # where the API listens (--host)
    port: int = 8420  # --port
    # A burst of submits within this many seconds is scheduled in one cycle.
    schedule_debounce: float = 0.005

    database_url: str | None = setting(
        None, "The database, as a SQLAlchemy URL (`postgresql+psycopg://user@host:5432/astraeus`). Unset: SQLite "
        "in `<home>/astraeus.db`. The schema is migrated at start. Alembic's own command line (its env.py in "
        "server/migrations) reads it too.",
        "a database URL such as postgresql+psycopg://user@host:5432/astraeus or sqlite:///path")
    public_url: str | None = setting(
        None, "The control plane's URL as users reach it (`https://console.example.com`), for the links it prints "
        "and shows. Unset: `http://<host>:<port>`.", "an http:// or https:// URL")
    schedule_interval: float = setting(
        15.0, "The longest the scheduler sleeps between looks at every waiting run, in seconds; any change (a "
        "submit, an exit, a machine joining) wakes it at once.", "a number of seconds > 0", gt=0, le=86400)
    heartbeat: float = setting(
        5.0, "How often an agent reports, in seconds, at least (told to each agent when it registers).",
        "a number of seconds > 0", gt=0, le=3600)
    console_session_hours: float = setting(
        12.0, "How long a console sign-in lasts, in hours; signing out, or revoking the API token it signed in "
        "with, ends it sooner.", "a number of hours > 0", gt=0, le=24 * 365)
    restart_backoff_base: float = setting(
        10.0, "Crash-loop backoff: a failed worker that restarts waits this many seconds, doubling with each "
        "failure in a row up to 5 minutes (10 s, 20 s, 40 s, …); the count starts again once an attempt has run "
        "for 10 minutes. A preemption never waits.", "a number of seconds from 0 to 300", ge=0, le=300)
    audit_retention_days: float = setting(
        365.0, "How long the audit log keeps an entry (who changed what, allowed or refused), in days; older "
        "entries are trimmed, nothing else ever removes one.", "a number of days from 1 to 36500", ge=1, le=36500)
    max_body_bytes: int = setting(
        4 * 1024 * 1024, "The largest request body the control plane reads, in bytes (every route, before "
        "authentication); a larger one is answered 413 before it is read. A run's configs may hold 1 MiB.",
        "a whole number of bytes from 65536 to 1073741824", ge=65536, le=1 << 30)
    log_max_bytes_per_worker: int = setting(
        8 * 1024 * 1024, "The most log text kept per worker (all its attempts), in bytes; beyond it the oldest "
        "lines are dropped and reading the log starts with `… N earlier lines dropped (log limit 8 MiB)`.",
        "a whole number of bytes from 1024 to 1073741824", ge=1024, le=1 << 30)
    log_max_lines_per_worker: int = setting(
        100_000, "The most log lines kept per worker (all its attempts), as ASTRAEUS_LOG_MAX_BYTES_PER_WORKER.",
        "a whole number from 100 to 100000000", ge=100, le=100_000_000)
    log_stores_at_once: int = setting(
        1, "How many batches of log lines the control plane stores at once (each parsed in a process of the "
        "server's own, and on PostgreSQL stored there too); 4 more wait, and past that an agent is told to send its batch again later (429 with "
        "Retry-After) and keeps its lines. 2 or more store a "
        "flood of lines faster on a control plane with cores to spare, at the cost of the API's answers and "
        "scheduling while the flood lasts (benchmarks/README.md, logs at scale).",
        "a whole number from 1 to 64", ge=1, le=64)
    log_store_share: float = setting(
        0.5, "The most of its time the control plane spends storing a flood of log lines: after a big batch (past "
        "64 KiB) took t seconds to store, the next big one starts t × (1/share − 1) seconds later (0.5: as long "
        "again), and the agents keep their lines meanwhile; the quiet workers' small batches never wait for it. 1 "
        "stores a flood as fast as the control plane can, at the cost of the API's answers while the flood lasts "
        "(benchmarks/README.md, logs at scale).", "a number from 0.05 to 1", ge=0.05, le=1.0)
    leader_lease_seconds: float = setting(
        4.0, "Several replicas on one PostgreSQL database: how long the scheduling leader's lease lasts, in "
        "seconds, by the database's clock; the leader renews it every third of that, and another replica takes "
        "over within about this long after the leader dies or stops answering.",
        "a number of seconds from 0.5 to 600", ge=0.5, le=600)
    disk_pressure_free_percent: float = setting(
        5.0, "Disk pressure: a machine whose agent's state dir (worker folders, logs, container layers) has less "
        "than this share of its filesystem free takes no new workers, and says so as the machine's reason "
        "(`Disk pressure: 3% free on /var/lib/astraeus`) until it has more again; its running workers go on. 0: "
        "never.", "a percentage from 0 to 100", ge=0, le=100)
    default_ephemeral_storage_bytes: Annotated[int | None, NoDecode] = setting(
        None, "The most disk a worker may use (its work folder, container layer, own /tmp and /dev/shm) when its run "
        "sets no `requested_resources.ephemeral_storage_bytes`; its agent measures it and evicts a worker over it "
        "(`Evicted: disk use over its limit (10 GiB)`). A size such as `10GiB`, or bytes. Unset: no limit.",
        "a size such as 10GiB or a whole number of bytes > 0")
    replica_id: str | None = setting(
        None, "This replica's name in the scheduling lease, `/healthz` and the logs; `--replica-id` overrides "
        "it. Unset: `<host>:<port>` (the machine's name for a wildcard host).",
        "a name of 1 to 150 characters", min_length=1, max_length=150)

    @field_validator("database_url")
    @classmethod
    def _db_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(v)
        except ArgumentError:
            raise ValueError("not a database URL") from None
        return v

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        return _http_url(v)

    def url(self) -> str:
        """The database's URL: ASTRAEUS_DATABASE_URL, else SQLite in the home (made, mode 0700)."""
        if self.database_url:
            return self.database_url
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)  # the database, the env file with tokens, the agents' state
        return f"sqlite:///{self.home / 'astraeus.db'}"

    def console_base(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @field_validator("default_ephemeral_storage_bytes", mode="before")
    @classmethod
    def _ephemeral(cls, v):
        n = size_setting(v, cls.env_name("default_ephemeral_storage_bytes"))
        if n is not None and n <= 0:
            raise ValueError("must be more than 0")
        return n


class AgentSettings(HomeSettings):
    """A machine's agent."""

    READ_BY: ClassVar[str] = "`astraeus agent`"

    server: str | None = setting(
        None, "The control plane's URL (`http://cp-host:8420`), or several replicas' URLs, comma-separated "
        "(`http://cp1:8420,http://cp2:8420,http://cp3:8420`): the agent uses one at a time and moves to the next "
        "when it stops answering; `--server` overrides it. `astraeus up` and `astraeus server` write it to "
        "`<home>/env`.", "an http:// or https:// URL, or several comma-separated")
    machine_token: str | None = setting(
        None, "A machine token (an organisation admin issues one with `POST /api/v1/o/<org>/tokens "
        "{\"kind\": \"machine\", \"cluster\": ...}`; `astraeus up` and `astraeus server` write a fresh one to "
        "`<home>/env`); `--token` overrides it. Prefer this variable to `--token`: a command line is visible in "
        "`ps`.",
        "a machine token", repr=False)
    state_dir: Path | None = setting(
        None, "Where the agent records its workers (adopted again after a restart). Unset: "
        "`<home>/agents/<name>`; `--state-dir` overrides it.", "a directory path")
    worker_uid_base: int = setting(
        200000, "Workers run as an unprivileged user, one per workspace: uid = gid = this base + the workspace's "
        "number in the control plane (unique: no two workspaces share a uid). Never root, no capabilities.", "a whole number from 1000 to 4000000000", ge=1000, le=4_000_000_000)
    worker_uid_range: int = setting(
        65536, "How many uids are kept for workspaces (from ASTRAEUS_WORKER_UID_BASE); a workspace whose number "
        "is outside it cannot start workers on this machine (its worker's reason says so).",
        "a whole number from 1 to 100000000", ge=1, le=100_000_000)
    worker_user: str | None = setting(
        None, "Run every worker as this existing user (a name or a uid; its primary group) instead of one uid per "
        "workspace. It must not be root.", "the name or uid of an existing user other than root")
    stop_grace: float = setting(
        30.0, "Seconds between SIGTERM and SIGKILL when this machine stops a worker (0: at once). Declared to the "
        "control plane, which counts it when it promises when a run starts.",
        "a number of seconds >= 0", ge=0, le=86400)
    health_check_command: str | None = setting(
        None, "A site health check (as Slurm's HealthCheckProgram), run by `sh -c` every "
        "ASTRAEUS_HEALTH_CHECK_INTERVAL seconds: a non-zero exit drains this machine with the command's first line of "
        "output as the reason; passing again resumes a drain it made (never an admin's). Unset: none (docs/health.md).",
        "a shell command line")
    health_check_interval: float = setting(
        300.0, "Seconds between two runs of ASTRAEUS_HEALTH_CHECK_COMMAND (each may take at most this long).",
        "a number of seconds from 1 to 86400", ge=1, le=86400)
    worker_pids_max: int = setting(
        4096, "The most processes and threads one worker may have at once (its cgroup's pids.max; a fork bomb "
        "stops there). 0: no limit.", "a whole number >= 0", ge=0, le=4194304)
    image_map: str | None = setting(
        None, "Image → local environment for the process runtime, first match wins: a JSON object "
        "`{\"pytorch/*\": \"/opt/envs/torch\", \"*\": \"host\"}` or the path of a file holding one. `host` is the "
        "agent's own PATH. Unset, or no match: the agent's own Python environment.",
        "a JSON object {\"image glob\": \"environment dir\"} or the path of a file holding one")
    image_map_file: Path | None = setting(
        None, "The path of a JSON file holding the image map (as ASTRAEUS_IMAGE_MAP).",
        "the path of a readable JSON file holding an object {\"image glob\": \"environment dir\"}")
    log_lines_per_second: int = setting(
        1000, "The most log lines per second (by the lines' own times) that the agent ships for one worker; it "
        "drops the rest and ships one line saying how many it dropped, so a flood cannot slow the control plane.",
        "a whole number from 1 to 1000000", ge=1, le=1_000_000)
    worker_log_file_bytes: int = setting(
        64 * 1024**2, "The most bytes of output one worker attempt keeps on its machine: the shim writes it to two "
        "files of half this size in turn (log.jsonl, then log.jsonl.1), so a flood cannot fill the machine's disk; "
        "lines the agent had not shipped when their file was dropped are lost.",
        "a whole number of bytes from 65536 to 1099511627776", ge=65536, le=1024**4)

    runtime: Literal["auto", "container", "process"] = setting(
        "auto", "How the agent runs workers: `container` (each worker in its image, run by runc; needs root and "
        "the Debian packages runc, skopeo and umoci), `process` (the command on the host, with the image map), or "
        "`auto`: container when those tools are installed and the machine has NVIDIA GPUs (NVML finds some), else "
        "process. `--runtime` overrides it; the agent logs which it uses.", "auto, container or process")
    insecure_registries: Annotated[list[str], NoDecode] = setting(
        [], "Registries the container runtime may reach over plain HTTP (or HTTPS without a verified "
        "certificate), comma-separated `host:port` (`127.0.0.1:5000,registry.lan:5000`). Any other is HTTPS only.",
        "comma-separated host[:port] entries, such as 127.0.0.1:5000,registry.lan:5000")
    image_cache_dir: Path | None = setting(
        None, "Where the container runtime keeps pulled images (one copy per digest, shared by the machine's "
        "workers). Unset: `<state dir>/images`.", "a directory path")
    image_cache_bytes: Annotated[int, NoDecode] = setting(
        100 * 1024**3, "The most bytes of images the container runtime keeps; beyond it, the least recently used "
        "images no worker uses are removed. A size such as `50GiB` or `500G`, or bytes; 0: no limit.",
        "a size such as 50GiB, 500M or a whole number of bytes (0: no limit)")
    worker_shm_bytes: Annotated[int | None, NoDecode] = setting(
        None, "The size of `/dev/shm` in a container worker (data loaders share batches there). Unset: half the "
        "worker's memory request, or 8 GiB without one.", "a size such as 16GiB or a whole number of bytes > 0")

    address: str | None = setting(
        None, "The address other machines and the control plane reach this machine at (a gang's rank 0 address, "
        "the address NFS exports are granted to); `--address` overrides it. Unset: the source address of this "
        "machine's route to the control plane.", "an IPv4 or IPv6 address")
    shared_fs: Annotated[dict[str, str], NoDecode] = setting(
        {}, "Shared filesystems this machine has mounted (NFS, Lustre, …), comma-separated `NAME=/mnt/path`: a "
        "drive on filesystem NAME is placed only on machines that declare it. `--shared-fs` (repeatable) adds "
        "to it.", "comma-separated NAME=/absolute/path entries, such as lab=/mnt/lab,scratch=/lustre/scratch")

    nfs_port: int = setting(
        2049, "The port this machine's NFS server (its own NFS-Ganesha, started while it exports a drive it keeps to "
        "workers on other machines) listens on.", "a port from 1 to 65535", ge=1, le=65535)
    nfs_client: Literal["auto", "true", "false"] = setting(
        "auto", "Whether this machine can mount NFS (a drive kept on another machine is placed here only if so): "
        "`auto` finds out (nfs4 in /proc/filesystems, or mount.nfs4 and a loadable nfsv4 module); `true`/`false` "
        "say so.", "auto, true or false")

    worker_network: Literal["isolated", "host"] = setting(
        "isolated", "`isolated`: every worker gets a network namespace of its own with an address of its own, "
        "reaching nothing of the machine nor other workers but its gang's (docs/fleet.md, \"Networks\"); needs root, "
        "iproute2 and nftables, without which workers share the machine's network and the agent says so at start. "
        "`host`: every worker shares the machine's network.", "isolated or host")
    worker_egress: Literal["internet", "none", "all"] = setting(
        "internet", "Where workers with networks of their own may connect beyond their gang: `internet` (not to "
        "private, shared, link-local or loopback addresses, so neither to other machines nor to a cloud's metadata "
        "service; the resolvers of /etc/resolv.conf on port 53 and ASTRAEUS_WORKER_EGRESS_ALLOW excepted), `none`, "
        "or `all` (anything but the machine itself and the control plane).", "internet, none or all")
    worker_egress_allow: Annotated[list[str], NoDecode] = setting(
        [], "Addresses or networks workers may reach although `internet` egress leaves them out (a site's package "
        "mirror, object store), comma-separated.", "comma-separated IPv4 addresses or networks, such as "
        "10.0.5.0/24,10.0.9.7")

    @field_validator("server")
    @classmethod
    def _server_url(cls, v: str | None) -> str | None:
        return http_urls(v) if v is not None else v

    @field_validator("worker_egress_allow", mode="before")
    @classmethod
    def _egress_allow(cls, v) -> list[str]:
        import ipaddress

        out = []
        for item in comma_items(v):
            try:
                out.append(str(ipaddress.IPv4Network(item, strict=False)))
            except ValueError:
                raise ValueError(f"{item!r} is not an IPv4 address or network") from None
        return out

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        from astraeus.spec import check_address

        return None if v is None else check_address(v)

    @field_validator("shared_fs", mode="before")
    @classmethod
    def _shared_fs(cls, v) -> dict[str, str]:
        from astraeus.spec import parse_shared_filesystems

        items = [x for x in v.split(",")] if isinstance(v, str) else v
        if isinstance(items, dict):
            items = [f"{k}={p}" for k, p in items.items()]
        return parse_shared_filesystems(items or [])

    @field_validator("insecure_registries", mode="before")
    @classmethod
    def _insecure(cls, v) -> list[str]:
        out = []
        for item in comma_items(v):
            from astraeus.imageref import ImageRef

            try:
                ok = ImageRef.parse(f"{item}/probe:1").registry == item and ("." in item or ":" in item
                                                                              or item == "localhost")
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{item!r} is not a host[:port]")
            out.append(item)
        return out

    @field_validator("image_cache_bytes", "worker_shm_bytes", mode="before")
    @classmethod
    def _size(cls, v, info):
        n = size_setting(v, cls.env_name(info.field_name))
        if info.field_name == "worker_shm_bytes" and n is not None and n <= 0:
            raise ValueError("must be more than 0")
        return n

    @field_validator("worker_user")
    @classmethod
    def _worker_user(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from astraeus.users import resolve_user

        resolve_user(v)  # a ValueError names what is wrong
        return v

    @field_validator("image_map", "image_map_file")
    @classmethod
    def _image_map(cls, v, info):
        if v is None:
            return v
        from astraeus.imagemap import ImageMap

        raw = str(v).strip()
        try:
            if info.field_name == "image_map":
                ImageMap.load(raw, None)
            else:
                ImageMap.load(None, raw)
        except (OSError, ValueError) as e:
            raise ValueError(str(e)) from None
        return v

    def state_dir_for(self, name: str) -> Path:
        return (self.state_dir or self.home / "agents" / name).expanduser()

    def images(self):
        """The image map (an astraeus.imagemap.ImageMap)."""
        from astraeus.imagemap import ImageMap

        return ImageMap.load(self.image_map, str(self.image_map_file) if self.image_map_file else None)


class CliSettings(_Settings):
    """`astra`, the command line for users."""

    READ_BY: ClassVar[str] = "`astra`"

    api: str | None = setting(
        None, "The workspace's API URL (`http://cp-host:8420/api/v1/o/<org>/w/<workspace>`); wins over the one "
        "`astra login` saved.", "an http:// or https:// URL")
    token: str | None = setting(
        None, "A user token for that workspace; wins over the one `astra login` saved.", "a token", repr=False)
    config: Path | None = setting(
        None, "Where `astra login` saves the API URL and token. Unset: `~/.config/astraeus/config.json`.",
        "a file path")
    squeue_min_job_age: float = setting(
        envvars.SQUEUE_MIN_JOB_AGE, "Seconds `astra slurm squeue` keeps showing a job after it ended, as Slurm's MinJobAge (`sacct` "
        "shows ended jobs for good).", "a number of seconds >= 0", ge=0)


class DemoSettings(_Settings):
    """`make demo`."""

    READ_BY: ClassVar[str] = "`make demo`"

    demo_home: Path | None = setting(
        None, "The demo's home (its cluster, logs and recipe). Unset: a new temporary directory.", "a directory path")


MODELS: tuple[type[_Settings], ...] = (ServerSettings, AgentSettings, CliSettings, DemoSettings)

_loaded: dict[type[_Settings], tuple[tuple, _Settings]] = {}


def _cached(model: type[_Settings]):
    """`model.load()`, read again only when an ASTRAEUS_ variable changed (tests change them): a model's read
    costs pydantic's parsing of every variable, too dear for each worker start or each failure."""
    key = envvars.prefixed(PREFIX)
    cached = _loaded.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    s = model.load()
    _loaded[model] = (key, s)
    return s


def agent_settings() -> AgentSettings:
    """This agent's settings (AgentSettings), read once; raises SettingsError naming a bad variable."""
    return _cached(AgentSettings)


def server_settings() -> ServerSettings:
    """The control plane's settings as the environment gives them (ServerSettings), read once: for code with no
    ControlPlane at hand (the lifecycle's backoff, alembic's command line)."""
    return _cached(ServerSettings)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment, a copy, with `extra` variables set: for a child process (an agent that
    `astraeus up` starts, a worker's base PATH and HOME)."""
    return envvars.copy(**extra)


def internal(name: str) -> str | None:
    """An internal variable's value (INTERNAL_ENV: set by the agent for its own processes, or `0` to turn a
    mechanism off); None when unset."""
    if name not in INTERNAL_ENV:
        raise KeyError(f"{name} is not an internal variable (astraeus.settings.INTERNAL_ENV)")
    return envvars.get(name)

# Variables that are not settings: Astraeus sets them.
WORKER_ENV = {
    "ASTRAEUS_JOB_NAME": "`<workspace ns>.<run name>`",
    "ASTRAEUS_RUN_NAME": "the run's name",
    "ASTRAEUS_WORKER_NAME": "the worker's name (`<run>-<index>`)",
    "ASTRAEUS_WORKER_INDEX": "the worker's index in its run, from 0",
    "ASTRAEUS_NUM_WORKERS": "the run's number of workers",
    "ASTRAEUS_GPU_COUNT": "the GPUs this worker holds",
    "ASTRAEUS_ATTEMPT": "the attempt number (each restart or requeue is a new attempt)",
    "ASTRAEUS_WORKER_ID": "`<agent>:<worker>.<attempt>`: how the agent finds the worker's processes again",
    "CUDA_VISIBLE_DEVICES": "the GPUs this worker holds: the machine's indices with the process runtime; numbered "
                            "from 0 in a container, which sees only its own GPUs",
    "NVIDIA_VISIBLE_DEVICES": "in a container: the machine's indices of the GPUs this worker holds (`void` for none)",
    "ASTRAEUS_STOP_REASON_FILE": "a file that, before SIGTERM, holds why the worker is stopped and its grace: "
                                 "`{\"reason\": \"Preempted by higher-priority work (urgent)\", \"grace_seconds\": 30, "
                                 "\"requested_at\": 1764400000.5}` (`/run/astraeus/stop-reason` in a container; "
                                 "docs/api.md, \"What a worker gets\")",
    "SLURM_JOB_NAME": "the run's name, for scripts written for Slurm",
    "ASTRAEUS_PROGRESS_FILE": "a file the worker touches (or writes `step 1234` to) as it makes progress: a run with "
                              "`progress.stall_seconds` is caught when it stops (docs/progress.md)",
    "ASTRAEUS_CHECKPOINT_FILE": "a file the worker writes after each checkpoint's save: least-work-lost preemption "
                                "reads its time (docs/progress.md)",
    "ASTRAEUS_GPU_FRACTION": "a worker that shares one GPU: its share (`0.5`), beside the CUDA MPS variables "
                             "(docs/gpu-sharing.md)",
    "ASTRAEUS_MIG_DEVICE": "a worker that asked MIG devices: their profile (`1g.10gb`); its CUDA_VISIBLE_DEVICES "
                           "is then their UUIDs (`MIG-sim-<gpu>-<slot>` on simulated GPUs; docs/gpu-sharing.md)",
    "ASTRAEUS_NODE_RANK": "a gang of two workers or more (astraeus.rendezvous, docs/fleet.md): this worker's rank, its "
                          "index (also `PET_NODE_RANK`, `NODE_RANK`, `SLURM_NODEID`)",
    "ASTRAEUS_NUM_NODES": "a gang: its number of workers (also `PET_NNODES`, `SLURM_NNODES`, `SLURM_JOB_NUM_NODES`)",
    "ASTRAEUS_MASTER_ADDR": "a gang: rank 0's own address (its machine's with `network: host`; also "
                            "`PET_MASTER_ADDR`, `MASTER_ADDR`)",
    "ASTRAEUS_MASTER_PORT": "a gang: the port the control plane picked for this attempt on rank 0 (also "
                            "`PET_MASTER_PORT`, `MASTER_PORT`)",
    "ASTRAEUS_NODE_ADDRS": "a gang: every worker's own address in rank order, comma-separated (their machines' with "
                           "`network: host`)",
    "ASTRAEUS_WORKER_ADDR": "a gang's worker with a network of its own: its address, which only its gang's workers "
                            "reach",
    "PET_NPROC_PER_NODE": "a gang: the worker's GPUs (1 without GPUs), which torchrun reads as --nproc-per-node; "
                          "`WORLD_SIZE` is the sum over the gang, `SLURM_GPUS_ON_NODE` the worker's GPUs, "
                          "`SLURM_JOB_NODELIST` the machines' names",
    "ASTRAEUS_ARRAY_JOB": "a job array's run (`sbatch --array`, `spec.array`): the array's name (also "
                          "`SLURM_ARRAY_JOB_ID`)",
    "ASTRAEUS_ARRAY_INDEX": "a job array's run: its index in the array (also `SLURM_ARRAY_TASK_ID`; "
                            "`SLURM_ARRAY_TASK_COUNT`, `SLURM_ARRAY_TASK_MIN`, `SLURM_ARRAY_TASK_MAX` describe the array)",
    "GLOO_SOCKET_IFNAME": "a gang, unless the run sets it: the network interface holding the machine's address (also "
                          "`NCCL_SOCKET_IFNAME`), so that gloo and NCCL reach the other machines on it",
}
INTERNAL_ENV = {
    "ASTRAEUS_SHIM_OWNER": "set by the agent for each worker's supervisor (shim): the agent it belongs to",
    "ASTRAEUS_SHIM_ID": "set by the agent for each shim: `<worker>.<attempt>`",
    "ASTRAEUS_SHIM_DIR": "set by the agent for each shim: the attempt's folder in the state dir",
    "ASTRAEUS_INIT": "set by a container worker's shim for the worker's PID 1 (a reaper that holds its PID "
                     "namespace): its program",
    "ASTRAEUS_NATIVE_SHIM": "`0` in the agent's environment: every worker gets the Python shim "
                            "(astraeus.agent.runtime.shim) instead of the per-worker supervisor in C (`astraeus-shim` "
                            "beside it, built by `make install` from `shim_native.c`; used for isolated workers that "
                            "are not containers when the agent runs as root and the binary is there); in the "
                            "launcher, the binary's path",
    "ASTRAEUS_SHIM_LAUNCHER": "`0` in the agent's environment: start each worker's shim with a Python interpreter of "
                              "its own instead of forking it from the agent's pre-started launcher "
                              "(astraeus.agent.runtime.launcher); in the launcher, a blank slot its forked shims "
                              "write their variables over",
}
WRITTEN_ENV = {
    "ASTRAEUS_SERVER": "the control plane's URL (read by `astraeus agent`)",
    "ASTRAEUS_MACHINE_TOKEN": "a machine token (read by `astraeus agent`)",
    "ASTRAEUS_API": "the default workspace's API URL (read by `astra`)",
    "ASTRAEUS_TOKEN": "an editor token for that workspace (read by `astra`; send it as `Authorization: Bearer`)",
    "ASTRAEUS_ADMIN_TOKEN": "an organisation-admin token (for the organisation API and console settings)",
}
EXAMPLE_ENV = {
    "ASTRAEUS_OFFLINE": "`1`: the fine-tune example (and `make demo`) trains on synthetic CIFAR-shaped data with a "
                        "small CNN, without downloading anything",
}


def _default(info) -> str:
    d = info.default
    if d is None:
        return "(unset)"
    if isinstance(d, Path):
        return f"`{d}`"
    if isinstance(d, float) and d.is_integer():
        return f"`{int(d)}`"
    return f"`{d}`"


def markdown() -> str:
    """docs/configuration.md."""
    rows: dict[str, list] = {}
    for model in MODELS:
        for field, info in model.variables().items():
            name = model.env_name(field)
            if name in rows:
                rows[name][2].append(model.READ_BY)
            else:
                rows[name] = [_default(info), info.description, [model.READ_BY]]
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m astraeus.settings > docs/configuration.md` from src/astraeus/settings.py;",
        "     edit the models there, not this file. -->",
        "",
        "Astraeus reads these environment variables. Each program checks the ones it reads when it starts and "
        "refuses to start on a bad value, with one line naming the variable, e.g. "
        "`astraeus server: ASTRAEUS_HEARTBEAT: must be a number of seconds > 0, got \"abc\"`. An empty variable "
        "counts as unset. A command-line option, where there is one, wins over its variable.",
        "",
        "## Settings",
        "",
        "| variable | default | read by | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, (default, desc, readers) in rows.items():
        out.append(f"| `{name}` | {default} | {', '.join(readers)} | {desc} |")
    for title, intro, table in (
        ("Set for workers", "Astraeus sets these in every worker's environment (a run cannot override them):",
         WORKER_ENV),
        ("Written by `astraeus up` and `astraeus server`",
         "Both write `<home>/env` (mode 0600) with fresh tokens; `source` it to use them:", WRITTEN_ENV),
        ("Internal", "Set by the agent for its own processes; not for users:", INTERNAL_ENV),
        ("Examples", "Read by the example programs, not by Astraeus:", EXAMPLE_ENV),
    ):
        out += ["", f"## {title}", "", intro, "", "| variable | meaning |", "| --- | --- |"]
        out += [f"| `{k}` | {v} |" for k, v in table.items()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
