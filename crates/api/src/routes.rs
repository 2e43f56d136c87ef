//! The one table of the API's routes: each path, its methods, the handler, the token
//! scope it needs and what it answers. The router ([`router`]), the scope a TCP token
//! must have ([`scope_of`], read by `access.rs` for the route axum matched), the 404's
//! nearest path
//! ([`nomad::not_found`](crate::nomad::not_found)) and the route list of the docs
//! (`docs/api-routes.md`, [`markdown`]) all come from it, so a route is added in one
//! place.
//!
//! Nomad's paths (`/v1/...`) come first, in Nomad's shapes (`nomad/`); berth's own, for
//! what Nomad has no path for, are under `/v1/berth/` (`lib.rs`).

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};

use crate::nomad::{
    alloc_actions, alloc_fs, checks, cluster, csi, evaluations, event_stream, job_actions, metrics,
    stats, submission,
};
use berth_client::agent::Agent;

/// The token scope a route needs on a TCP listener (the Unix socket is the operator's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// No token needed: what anyone may read (the JWKS that verifies workload
    /// identities, as Nomad serves it).
    Public,
    /// Any token: the route reads and changes nothing.
    Read,
    /// A token of scope `submit` (or `alloc-exec`, or `plugin`): the route changes
    /// something.
    Submit,
    /// A token of scope `alloc-exec` (or `plugin`): the route runs commands inside
    /// allocs (Nomad's `alloc-exec` capability).
    Exec,
}

impl Scope {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scope::Public => "none",
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Exec => "alloc-exec",
        }
    }
}

/// One row of the table.
pub struct Route {
    pub methods: &'static [Method],
    /// axum's form: `{id}` for a path parameter.
    pub path: &'static str,
    pub scope: Scope,
    /// What it answers, for the docs.
    pub about: &'static str,
    handler: MethodRouter<Arc<Agent>>,
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];
const DELETE: &[Method] = &[Method::DELETE];
/// Nomad's writes take PUT and POST alike.
const WRITE: &[Method] = &[Method::PUT, Method::POST];

fn route<H, T>(
    methods: &'static [Method],
    path: &'static str,
    scope: Scope,
    about: &'static str,
    handler: H,
) -> Route
where
    H: Handler<T, Arc<Agent>>,
    T: 'static,
{
    // The table is ours and fixed: a method axum cannot route is a bug the router's
    // test finds, never a request's doing.
    let filter = methods
        .iter()
        .map(|method| {
            MethodFilter::try_from(method.clone())
                .unwrap_or_else(|_| panic!("the route table names method {method}"))
        })
        .reduce(MethodFilter::or)
        .unwrap_or_else(|| panic!("the route {path} names no method"));
    Route {
        methods,
        path,
        scope,
        about,
        handler: on(filter, handler),
    }
}

/// Every route the API serves.
pub fn table() -> Vec<Route> {
    use crate::nomad as n;
    use Scope::{Exec, Public, Read, Submit};
    vec![
        // Jobs.
        route(
            GET,
            "/v1/jobs",
            Read,
            "the jobs (`?prefix=`)",
            cluster::list_jobs,
        ),
        route(
            WRITE,
            "/v1/jobs",
            Submit,
            "register `{\"Job\": {...}}`",
            n::register,
        ),
        route(
            WRITE,
            "/v1/jobs/parse",
            // It changes nothing, but evaluating an untrusted jobspec costs the agent's
            // evaluation threads: only a token that may submit may ask.
            Submit,
            "a jobspec (`JobHCL`, `Variables`) as Nomad's job JSON; changes nothing",
            submission::parse,
        ),
        route(
            WRITE,
            "/v1/validate/job",
            Submit,
            "whether a job JSON would register; changes nothing",
            n::validate_job,
        ),
        route(GET, "/v1/job/{id}", Read, "a job", cluster::read_job),
        route(WRITE, "/v1/job/{id}", Submit, "register", n::register_at),
        route(
            DELETE,
            "/v1/job/{id}",
            Submit,
            "stop a job (`?purge=true`: and forget it)",
            n::deregister_job,
        ),
        route(
            GET,
            "/v1/job/{id}/allocations",
            Read,
            "a job's allocs",
            cluster::job_allocations,
        ),
        route(
            WRITE,
            "/v1/job/{id}/plan",
            Submit,
            "what a register would do (`{\"Job\": {...}, \"Diff\": true}`), as a dry run",
            job_actions::plan,
        ),
        route(
            WRITE,
            "/v1/job/{id}/dispatch",
            Submit,
            "a child of a parameterized job (`{\"Payload\": base64, \"Meta\": {...}}`)",
            job_actions::dispatch,
        ),
        route(
            GET,
            "/v1/job/{id}/summary",
            Read,
            "a job's allocs per group and status",
            n::job_summary,
        ),
        route(
            GET,
            "/v1/job/{id}/versions",
            Read,
            "a job's versions (berth keeps the last)",
            n::job_versions,
        ),
        route(
            GET,
            "/v1/job/{id}/evaluations",
            Read,
            "a job's evaluations, newest first",
            evaluations::of_job,
        ),
        route(
            GET,
            "/v1/job/{id}/deployments",
            Read,
            "a job's deployments (always none: berth has no deployments)",
            n::job_none,
        ),
        // Evaluations.
        route(
            GET,
            "/v1/evaluations",
            Read,
            "evaluations (`prefix`, `job`, `status`)",
            evaluations::list,
        ),
        route(
            GET,
            "/v1/evaluation/{id}",
            Read,
            "an evaluation",
            evaluations::read,
        ),
        route(
            GET,
            "/v1/evaluation/{id}/allocations",
            Read,
            "the allocs an evaluation left its job with",
            evaluations::allocations,
        ),
        // Allocs.
        route(
            GET,
            "/v1/allocations",
            Read,
            "the allocs (`?prefix=`)",
            cluster::list_allocations,
        ),
        route(
            GET,
            "/v1/allocation/{id}",
            Read,
            "an alloc",
            n::read_allocation,
        ),
        route(
            WRITE,
            "/v1/allocation/{id}/stop",
            Submit,
            "stop an alloc",
            n::stop_allocation,
        ),
        route(
            WRITE,
            "/v1/client/allocation/{id}/restart",
            Submit,
            "restart an alloc's tasks (`TaskName` or `AllTasks`)",
            alloc_actions::restart,
        ),
        route(
            WRITE,
            "/v1/client/allocation/{id}/signal",
            Submit,
            "signal an alloc's tasks (`Signal`, `Task`)",
            alloc_actions::signal,
        ),
        route(
            GET,
            "/v1/client/allocation/{id}/exec",
            Exec,
            "a websocket: a command run inside an alloc's task (`task`, `command`, `tty`)",
            n::alloc_exec::exec,
        ),
        route(
            GET,
            "/v1/client/allocation/{id}/checks",
            Read,
            "the latest result of each check berth runs for an alloc (`nomad alloc checks`)",
            checks::alloc_checks,
        ),
        route(
            GET,
            "/v1/client/allocation/{id}/stats",
            Read,
            "an alloc's resource usage, from its tasks' cgroups",
            stats::alloc_stats,
        ),
        route(
            GET,
            "/v1/client/fs/logs/{alloc}",
            Read,
            "a task's log (`task`, `type`, `origin`, `offset`, `plain`, `follow`: a stream)",
            n::task_logs,
        ),
        route(
            GET,
            "/v1/client/fs/ls/{alloc}",
            Read,
            "a directory of the alloc (`path`), no link followed",
            alloc_fs::list,
        ),
        route(
            GET,
            "/v1/client/fs/stat/{alloc}",
            Read,
            "a file of the alloc (`path`)",
            alloc_fs::stat,
        ),
        route(
            GET,
            "/v1/client/fs/cat/{alloc}",
            Read,
            "a file's bytes (`path`)",
            alloc_fs::cat,
        ),
        route(
            GET,
            "/v1/client/fs/readat/{alloc}",
            Read,
            "a file's bytes (`path`, `offset`, `limit`)",
            alloc_fs::read_at,
        ),
        route(
            GET,
            "/v1/event/stream",
            Read,
            "the event stream (`topic=Topic:Key`, `index`)",
            event_stream::stream,
        ),
        // Nodes.
        route(
            GET,
            "/v1/nodes",
            Read,
            "the cluster's nodes (`?prefix=`)",
            cluster::list_nodes,
        ),
        route(GET, "/v1/node/{id}", Read, "a node", cluster::read_node),
        route(
            GET,
            "/v1/node/{id}/allocations",
            Read,
            "a node's allocs",
            cluster::node_allocations,
        ),
        route(
            WRITE,
            "/v1/node/{id}/eligibility",
            Submit,
            "a node's scheduling eligibility (the operator's)",
            cluster::node_eligibility,
        ),
        route(
            WRITE,
            "/v1/node/{id}/drain",
            Submit,
            "start or end a node's drain (the operator's)",
            cluster::node_drain,
        ),
        route(
            GET,
            "/v1/client/stats",
            Read,
            "the node's resource usage, from `/proc`",
            stats::host_stats,
        ),
        // CSI.
        route(
            GET,
            "/v1/volumes",
            Read,
            "CSI volumes (`type=csi`, `plugin_id`, `prefix`)",
            csi::list_volumes,
        ),
        route(
            GET,
            "/v1/volume/csi/{id}",
            Read,
            "a CSI volume",
            csi::read_volume,
        ),
        route(
            WRITE,
            "/v1/volume/csi/{id}",
            Submit,
            "register a CSI volume (`{\"Volumes\": [{...}]}`)",
            csi::register_volume,
        ),
        route(
            DELETE,
            "/v1/volume/csi/{id}",
            Submit,
            "deregister a CSI volume (`?force=true`: drop finished allocs' claims first)",
            csi::deregister_volume,
        ),
        route(
            WRITE,
            "/v1/volume/csi/{id}/create",
            Submit,
            "create a volume through its plugin, then register it",
            csi::create_volume,
        ),
        route(
            GET,
            "/v1/plugins",
            Read,
            "CSI plugins (`type=csi`)",
            csi::list_plugins,
        ),
        route(
            GET,
            "/v1/plugin/csi/{id}",
            Read,
            "a CSI plugin",
            csi::read_plugin,
        ),
        // The agent.
        route(
            GET,
            "/v1/metrics",
            Read,
            "metrics (go-metrics JSON; `?format=prometheus`: Prometheus' text)",
            metrics::metrics,
        ),
        route(GET, "/v1/agent/self", Read, "this agent", n::agent_self),
        route(
            GET,
            "/.well-known/jwks.json",
            Public,
            "the keys that verify workload identities, with no token (as Nomad serves them)",
            n::jwks,
        ),
        route(
            GET,
            "/v1/agent/health",
            Read,
            "this agent's health",
            n::agent_health,
        ),
        route(
            GET,
            "/v1/agent/members",
            Read,
            "the server members",
            n::agent_members,
        ),
        route(
            GET,
            "/v1/status/leader",
            Read,
            "the agent that schedules the cluster",
            cluster::status_leader,
        ),
        route(
            GET,
            "/v1/status/peers",
            Read,
            "the server peers",
            n::status_peers,
        ),
        route(GET, "/v1/regions", Read, "the regions", n::regions),
        // berth's own paths: what Nomad has none for.
        route(
            GET,
            "/v1/berth/agent/self",
            Read,
            "berth's view of this agent: drivers, hooks, facts",
            crate::agent_self,
        ),
        route(
            GET,
            "/v1/berth/agent/log-drops",
            Read,
            "log messages dropped per plugin",
            metrics::log_drops,
        ),
        route(
            GET,
            "/v1/berth/jobs",
            Read,
            "the jobs, berth's shape",
            crate::list_jobs,
        ),
        route(
            POST,
            "/v1/berth/jobs",
            Submit,
            "submit a jobspec",
            crate::submit_job,
        ),
        route(
            GET,
            "/v1/berth/job/{id}",
            Read,
            "a job, berth's shape",
            crate::job,
        ),
        route(
            DELETE,
            "/v1/berth/job/{id}",
            Submit,
            "stop a job",
            crate::stop_job,
        ),
        route(
            POST,
            "/v1/berth/job/{id}/dispatch",
            Submit,
            "dispatch, answering berth's shape",
            crate::dispatch_job,
        ),
        route(
            POST,
            "/v1/berth/job/{id}/periodic/force",
            Submit,
            "launch a periodic job's child now",
            crate::force_periodic,
        ),
        route(
            GET,
            "/v1/berth/allocations",
            Read,
            "the allocs, berth's shape",
            crate::list_allocs,
        ),
        route(
            GET,
            "/v1/berth/allocation/{id}",
            Read,
            "an alloc with its dir, disk use and mounts",
            crate::alloc,
        ),
        route(
            GET,
            "/v1/berth/client/fs/logs/{alloc}",
            Read,
            "a task's log, berth's shape",
            crate::task_log,
        ),
        route(
            POST,
            "/v1/berth/system/gc",
            Submit,
            "collect finished allocs now",
            crate::system_gc,
        ),
        route(
            GET,
            "/v1/services",
            Read,
            "Nomad's service catalog (provider \"nomad\"): each name with its tags",
            n::services::list,
        ),
        route(
            GET,
            "/v1/service/{name}",
            Read,
            "the instances of a service of provider \"nomad\", on every node",
            n::services::read,
        ),
        route(
            GET,
            "/v1/berth/services",
            Read,
            "the services",
            crate::list_services,
        ),
        route(
            GET,
            "/v1/berth/volumes",
            Read,
            "volumes, berth's shape",
            crate::list_volumes,
        ),
        route(
            POST,
            "/v1/berth/volumes/register",
            Submit,
            "register a volume spec",
            crate::register_volume,
        ),
        route(
            POST,
            "/v1/berth/volumes/create",
            Submit,
            "create a volume from a spec",
            crate::create_volume,
        ),
        route(
            GET,
            "/v1/berth/volumes/snapshot",
            Read,
            "a plugin's snapshots",
            crate::list_snapshots,
        ),
        route(
            POST,
            "/v1/berth/volumes/snapshot",
            Submit,
            "snapshot a volume",
            crate::create_snapshot,
        ),
        route(
            DELETE,
            "/v1/berth/volumes/snapshot",
            Submit,
            "delete a snapshot",
            crate::delete_snapshot,
        ),
        route(
            GET,
            "/v1/berth/volume/{id}",
            Read,
            "a volume",
            crate::volume,
        ),
        route(
            DELETE,
            "/v1/berth/volume/{id}",
            Submit,
            "deregister a volume",
            crate::deregister_volume,
        ),
        route(
            DELETE,
            "/v1/berth/volume/{id}/delete",
            Submit,
            "delete a volume through its plugin",
            crate::delete_volume,
        ),
        route(
            DELETE,
            "/v1/berth/volume/{id}/detach",
            Submit,
            "give a volume back (`?force=true`)",
            crate::detach_volume,
        ),
        route(
            GET,
            "/v1/berth/plugins",
            Read,
            "CSI plugins, berth's shape",
            crate::list_plugins,
        ),
        route(
            GET,
            "/v1/berth/plugin/{id}",
            Read,
            "a CSI plugin",
            crate::plugin,
        ),
    ]
}

/// The router of every route in [`table`]: the rows of one path share a method router.
pub(crate) fn router() -> Router<Arc<Agent>> {
    let mut by_path: Vec<(&'static str, MethodRouter<Arc<Agent>>)> = Vec::new();
    for row in table() {
        match by_path.iter_mut().find(|(path, _)| *path == row.path) {
            Some((_, methods)) => *methods = std::mem::take(methods).merge(row.handler),
            None => by_path.push((row.path, row.handler)),
        }
    }
    by_path
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
}

/// Each row's methods, path and scope, without the handlers: what the access check and
/// the 404 read on every request.
struct Row {
    methods: &'static [Method],
    path: &'static str,
    scope: Scope,
}

static ROWS: LazyLock<Vec<Row>> = LazyLock::new(|| {
    table()
        .into_iter()
        .map(|r| Row {
            methods: r.methods,
            path: r.path,
            scope: r.scope,
        })
        .collect()
});

/// The scope a request needs: the scope of the row of `method` and `matched`, the path
/// pattern axum matched (its `MatchedPath`, the table's own text), so the check and the
/// router cannot disagree. A request no row serves (a 404 or 405, `matched` `None`)
/// needs `read` to read and `submit` for anything else.
pub fn scope_of(method: &Method, matched: Option<&str>) -> Scope {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let fallback = if method == Method::GET {
        Scope::Read
    } else {
        Scope::Submit
    };
    matched
        .and_then(|path| {
            ROWS.iter()
                .find(|row| row.path == path && row.methods.contains(method))
        })
        .map_or(fallback, |row| row.scope)
}

/// Every path of the table as Nomad's docs write it (`:id`), once each.
pub fn known_paths() -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for row in ROWS.iter() {
        let path = docs_path(row.path);
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

/// `{id}` as Nomad's docs write it, `:id`.
fn docs_path(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment.strip_prefix('{') {
            Some(name) => format!(":{}", name.trim_end_matches('}')),
            None => segment.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The table as the docs' route list (`docs/api-routes.md`).
pub fn markdown() -> String {
    let mut text = String::from(
        "# The agent's HTTP routes\n\n\
         Generated from `crates/api/src/routes.rs` (the test \
         `routes::tests::the_docs_list_every_route` checks it; \
         `BERTH_BLESS=1 cargo test -p berth-api the_docs_list_every_route` rewrites it). \
         The scope is what a token needs on a TCP listener; the Unix socket is the \
         operator's.\n\n\
         | method | path | scope | answers |\n|---|---|---|---|\n",
    );
    for row in table() {
        let methods: Vec<&str> = row.methods.iter().map(Method::as_str).collect();
        text.push_str(&format!(
            "| {} | `{}` | {} | {} |\n",
            methods.join(", "),
            docs_path(row.path),
            row.scope.as_str(),
            row.about
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_path_and_method_is_in_the_table_twice() {
        let mut seen = Vec::new();
        for row in table() {
            for method in row.methods {
                let key = (method.clone(), row.path);
                assert!(!seen.contains(&key), "{} {} twice", key.0, key.1);
                seen.push(key);
            }
        }
        // And the router builds (axum refuses two handlers for one method and path).
        let _ = router();
    }

    #[test]
    fn a_request_needs_its_routes_scope() {
        let at = |method: Method, path: &str| scope_of(&method, Some(path));
        assert_eq!(at(Method::GET, "/v1/job/{id}"), Scope::Read);
        assert_eq!(at(Method::HEAD, "/v1/jobs"), Scope::Read);
        assert_eq!(at(Method::DELETE, "/v1/job/{id}"), Scope::Submit);
        assert_eq!(at(Method::POST, "/v1/job/{id}/plan"), Scope::Submit);
        // Parsing evaluates an untrusted jobspec: a read token may not make it.
        assert_eq!(at(Method::POST, "/v1/jobs/parse"), Scope::Submit);
        // A method the matched path does not serve (a 405) and no match (a 404).
        assert_eq!(at(Method::POST, "/v1/nodes"), Scope::Submit);
        assert_eq!(scope_of(&Method::GET, None), Scope::Read);
        assert_eq!(scope_of(&Method::PATCH, None), Scope::Submit);
        // Every non-GET row needs `submit`: what a read token may do is what it may read.
        for row in ROWS.iter() {
            if row.methods.iter().any(|m| m != Method::GET) {
                assert_eq!(row.scope, Scope::Submit, "{}", row.path);
            }
        }
    }

    #[test]
    fn the_docs_list_every_route() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api-routes.md");
        let generated = markdown();
        if std::env::var_os("BERTH_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == generated,
            "docs/api-routes.md is not the route table: run \
             BERTH_BLESS=1 cargo test -p berth-api the_docs_list_every_route"
        );
    }
}
