"""What the API does, as plain functions over a session, one module per resource; routers are thin and call these.

This package re-exports its modules' names (`services.run_view`), for the routers and the console above it;
the server's own modules below the routers (submits, pools, reservations...) import the module they need, so
that no import goes round a loop."""

from astraeus.server.services.auth import (  # noqa: F401
    _USER_CALLER,
    _USER_CALLER_LOCKING,
    CONSOLE_COOKIE,
    ROLES,
    TOKEN_BY_DIGEST,
    Caller,
    ConsoleCredential,
    _bearer,
    _in_workspace,
    _valid,
    authenticate,
    console_token,
    console_ws_caller,
    create_token,
    digest,
    live_console_session,
    new_ns,
    org_admin_caller,
    own_origins,
    require,
    system_caller,
    user_caller,
    workspace_caller,
)
from astraeus.server.services.bootstrap import ensure_cluster, ensure_org, ensure_workspace, set_access  # noqa: F401
from astraeus.server.services.drives import (  # noqa: F401
    _machine_facts,
    check_drive_place,
    check_grants,
    create_drive,
    delete_drive,
    drive_out,
    get_drive,
    list_drives,
)
from astraeus.server.services.errors import ApiError, InvalidBody  # noqa: F401
from astraeus.server.services.events import list_events  # noqa: F401
from astraeus.server.services.logs import (  # noqa: F401
    DROPPED,
    INT32,
    LOG_LINES_PER_REQUEST,
    _log_bytes,
    delete_logs,
    dialect_insert,
    last_log_id,
    logs_dropped_line,
    mib,
    over_log_limits,
    read_logs,
    trim_logs,
)
from astraeus.server.services.machines import (  # noqa: F401
    _disk_view,
    granted_cluster_ids,
    list_machines,
    machines_view,
    workspace_view,
)
from astraeus.server.services.named import find_named, get_named, list_named  # noqa: F401
from astraeus.server.services.runs import (  # noqa: F401
    _CLUSTER_NAMED,
    _CLUSTERS,
    _FIRST_CLUSTER,
    _cluster_for,
    cluster_for,
    delete_run,
    get_run,
    get_worker,
    list_runs,
    list_workers,
    name_holder_deleting,
    name_taken,
    parse_label_selector,
    run_history,
    update_run,
)
from astraeus.server.services.transactions import (  # noqa: F401
    STEP_ASIDE_MAX,
    _ended,
    _wrote,
    hand_back_connection,
    let_state_changes_in,
    side_tx,
    tx,
)
from astraeus.server.services.views import (  # noqa: F401
    HIDDEN,
    PAUSED,
    access_view,
    console_url,
    drive_view,
    event_view,
    iso,
    made_by,
    run_view,
    shown_template,
    worker_view,
)
