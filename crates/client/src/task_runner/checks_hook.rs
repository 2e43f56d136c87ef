//! Runs the checks of the task's provider "nomad" services, and its Consul services'
//! script checks (and a group service's checks that name this task) while it runs, as
//! Nomad's client does: each at its interval, its latest result kept for `GET
//! /v1/client/allocation/:id/checks`, or for a Consul service's, set on its TTL check
//! in Consul; a script check runs inside the task, in its confinement. A check with
//! `check_restart` restarts the task, under its restart policy, after `limit` unhealthy
//! results in a row once its `grace` has passed ("healthcheck: check \"x\" unhealthy",
//! Nomad's words).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::control::{TaskCommand, TaskControl};
use super::hooks::{BoxFuture, TaskHook, TaskHookContext};
use super::services_hook::service_names;
use crate::checks::{CheckResult, CheckResults, Health, Outcome};
use crate::consul::ServiceClient;
use crate::consul::build::{ServiceSource, registrations};
use berth_jobspec::{CheckKind, CheckRestart, Service, ServiceProvider};
use berth_model::events::EventKind;

#[derive(Default)]
pub struct ChecksHook {
    watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What one watcher runs.
enum Probe {
    Http { url: String, method: Option<String> },
    Tcp { address: String },
    Grpc { address: String, service: String },
    Script { argv: Vec<String> },
}

struct Watched {
    result: CheckResult,
    probe: Probe,
    interval: Duration,
    timeout: Duration,
    restart: Option<CheckRestart>,
    /// A Consul service's script check: its TTL check's ID in Consul, where each
    /// result goes (Nomad's `GET .../checks` lists provider "nomad" services' only).
    reported: Option<String>,
}

/// The checks this task's runner runs, each with where it reaches.
fn watched(ctx: &TaskHookContext) -> Result<Vec<Watched>, crate::consul::build::BuildError> {
    let lookup = service_names(ctx);
    let address = crate::consul::service_address(ctx.config.consul.as_ref());
    let alloc_address = ctx.resources.network().and_then(|n| n.address);
    // Every check of a provider "nomad" service, and a Consul service's script checks
    // (Consul has them as TTL checks, which berth updates).
    let runs_here = |service: &Service, check: &berth_jobspec::ServiceCheck| {
        service.provider == ServiceProvider::Nomad || matches!(check.kind, CheckKind::Script { .. })
    };
    let own: Vec<Service> = ctx
        .task
        .services
        .iter()
        .filter(|s| s.checks.iter().any(|c| runs_here(s, c)))
        .cloned()
        .collect();
    // A group service's checks that name this task run here, and only those.
    let group: Vec<Service> = ctx
        .group
        .services
        .iter()
        .filter(|s| {
            s.checks
                .iter()
                .any(|c| runs_here(s, c) && c.task.as_deref() == Some(ctx.task.name.as_str()))
        })
        .cloned()
        .collect();
    let mut out = Vec::new();
    for (services, task) in [(own, Some(ctx.task.name.as_str())), (group, None)] {
        let source = ServiceSource {
            alloc_id: &ctx.alloc_id,
            task,
            group: &ctx.group.name,
            ports: &ctx.group.ports,
            network_mode: ctx.group.network_mode,
            address: &address,
            alloc_address: alloc_address.as_deref(),
            lookup: &lookup,
        };
        // Built whole, as the service hook registers them: a check's ID depends on its
        // place among its service's checks.
        let built = registrations(&services, &source)?;
        for (service, (_, registration)) in services.iter().zip(built) {
            for (check, made) in service.checks.iter().zip(&registration.checks) {
                let in_group = task.is_none();
                if !runs_here(service, check)
                    || (in_group && check.task.as_deref() != Some(ctx.task.name.as_str()))
                {
                    continue;
                }
                let reported =
                    (service.provider == ServiceProvider::Consul).then(|| made.check_id.clone());
                let probe = match &check.kind {
                    CheckKind::Http { method, .. } => Probe::Http {
                        url: made.http.clone().unwrap_or_default(),
                        method: method.clone(),
                    },
                    CheckKind::Tcp => Probe::Tcp {
                        address: made.tcp.clone().unwrap_or_default(),
                    },
                    CheckKind::Grpc { .. } => {
                        let target = made.grpc.clone().unwrap_or_default();
                        // Consul's form, `host:port[/service]`; the host is an address.
                        let (address, service) = match target.split_once('/') {
                            Some((address, service)) => (address.to_string(), service.to_string()),
                            None => (target, String::new()),
                        };
                        Probe::Grpc { address, service }
                    }
                    CheckKind::Script { command, args } => Probe::Script {
                        argv: std::iter::once(command.clone())
                            .chain(args.iter().cloned())
                            .collect(),
                    },
                };
                out.push(Watched {
                    result: CheckResult {
                        id: made.check_id.clone(),
                        check: made.name.clone(),
                        service: registration.name.clone(),
                        group: ctx.group.name.clone(),
                        task: ctx.task.name.clone(),
                        outcome: Outcome {
                            health: Health::Critical,
                            output: "not run yet".into(),
                            status_code: None,
                        },
                        timestamp: 0,
                    },
                    probe,
                    interval: check.interval,
                    timeout: check.timeout,
                    restart: check.check_restart.clone().filter(|r| r.limit > 0),
                    reported,
                });
            }
        }
    }
    Ok(out)
}

impl ChecksHook {
    fn start(&self, ctx: &TaskHookContext) {
        self.stop_all();
        let watched = match watched(ctx) {
            Ok(watched) => watched,
            Err(error) => {
                ctx.report(
                    EventKind::TaskHook,
                    format!("checks: {error}; the checks are not run"),
                );
                return;
            }
        };
        let mut watchers = self.watchers.lock().unwrap();
        for check in watched {
            let watcher = Watcher {
                alloc: ctx.alloc_id.clone(),
                services: ctx.services.clone(),
                control: ctx.control.clone(),
                restart: ctx.restart.clone(),
            };
            watchers.push(tokio::spawn(watcher.run(check)));
        }
    }

    fn stop_all(&self) {
        for watcher in self.watchers.lock().unwrap().drain(..) {
            watcher.abort();
        }
    }
}

struct Watcher {
    alloc: String,
    services: Arc<ServiceClient>,
    control: Option<TaskControl>,
    restart: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl Watcher {
    async fn run(self, mut check: Watched) {
        let started = Instant::now();
        let mut unhealthy_in_a_row = 0;
        loop {
            let outcome = self.probe(&check).await;
            check.result.timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            check.result.outcome = outcome.clone();
            match &check.reported {
                None => self.results().record(&self.alloc, check.result.clone()),
                Some(check_id) => self.report(check_id, &outcome, check.interval).await,
            }
            if let Some(restart) = &check.restart
                && started.elapsed() >= restart.grace
            {
                let unhealthy = match outcome.health {
                    Health::Passing => false,
                    Health::Warning => !restart.ignore_warnings,
                    Health::Critical => true,
                };
                unhealthy_in_a_row = if unhealthy { unhealthy_in_a_row + 1 } else { 0 };
                if unhealthy_in_a_row >= restart.limit {
                    if let Some(sender) = &self.restart {
                        let _ = sender.send(format!(
                            "healthcheck: check {:?} unhealthy",
                            check.result.check
                        ));
                    }
                    // The task's next start runs its checks anew.
                    return;
                }
            }
            tokio::time::sleep(check.interval).await;
        }
    }

    fn results(&self) -> &CheckResults {
        self.services.checks()
    }

    /// Sets a Consul service's TTL check to a script check's outcome, once Consul holds
    /// the check: the first run ends before the service is registered, and a restarted
    /// task's before it is registered again. Waits at most `patience` (the check's
    /// interval: the next run brings a newer outcome). An update that finds no such
    /// check has the service registered again and is sent once more. A failed update
    /// is logged: the TTL turns the check critical if none gets through.
    async fn report(&self, check_id: &str, outcome: &Outcome, patience: Duration) {
        let Some(consul) = self.services.api() else {
            return;
        };
        let status = match outcome.health {
            Health::Passing => "passing",
            Health::Warning => "warning",
            Health::Critical => "critical",
        };
        for attempt in 0..2 {
            if !self.services.check_registered(check_id, patience).await {
                tracing::debug!(alloc = %self.alloc, check_id, "a script check's service is not registered yet; its outcome waits for the next run");
                return;
            }
            match consul.update_ttl(check_id, status, &outcome.output).await {
                Ok(()) => return,
                Err(error) if error.is_unknown_check() && attempt == 0 => {
                    self.services.check_missing(check_id);
                }
                Err(error) => {
                    tracing::warn!(alloc = %self.alloc, check_id, %error, "updating a script check in Consul");
                    return;
                }
            }
        }
    }

    async fn probe(&self, check: &Watched) -> Outcome {
        match &check.probe {
            Probe::Http { url, method } => {
                crate::checks::http(url, method.as_deref(), check.timeout).await
            }
            Probe::Tcp { address } => crate::checks::tcp(address, check.timeout).await,
            Probe::Grpc { address, service } => {
                crate::checks::grpc(address, service, check.timeout).await
            }
            Probe::Script { argv } => {
                let Some(control) = &self.control else {
                    return crate::checks::script_not_run("the task cannot be entered");
                };
                let ran = control
                    .exec(TaskCommand {
                        argv: argv.clone(),
                        timeout: check.timeout,
                    })
                    .await;
                match ran {
                    Ok(ran) => crate::checks::script(&ran, check.timeout),
                    Err(error) => crate::checks::script_not_run(error),
                }
            }
        }
    }
}

impl TaskHook for ChecksHook {
    fn name(&self) -> &'static str {
        "checks"
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.start(ctx) })
    }

    fn recovered<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.start(ctx) })
    }

    fn stop<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.stop_all();
            ctx.services
                .checks()
                .forget_task(&ctx.alloc_id, &ctx.task.name);
        })
    }

    fn exited<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        _exit: Option<&'a berth_model::driver::ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.stop_all();
            ctx.services
                .checks()
                .forget_task(&ctx.alloc_id, &ctx.task.name);
        })
    }
}

impl Drop for ChecksHook {
    fn drop(&mut self) {
        self.stop_all();
    }
}
