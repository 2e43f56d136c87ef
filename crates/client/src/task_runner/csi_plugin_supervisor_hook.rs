//! `csi_plugin_supervisor`: runs a task with a `csi_plugin` block as a CSI plugin.
//!
//! - prestart: makes `<data_dir>/csi` a shared mount, gives the task its socket dir at
//!   `mount_dir` and its staging root at `stage_publish_base_dir` (both bidirectional, so
//!   what the plugin mounts shows on the host), and sets `CSI_ENDPOINT`.
//! - poststart (and after an agent restart, recovered): probes every half second until
//!   the plugin is healthy, then registers it (node and/or controller) and keeps a
//!   heartbeat. Events are emitted only when health changes. A plugin not healthy
//!   within `health_timeout` is restarted, with the reason.
//! - exited: marks the plugin unhealthy. stop: deregisters it and removes its socket dir.
//!
//! A task whose driver does not chroot sees host paths: it gets the host paths in
//! `CSI_ENDPOINT` and in the paths the manager sends, and no mounts.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::hooks::{BoxFuture, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use berth_csi::client::CsiClient;
use berth_csi::layout::{self, PluginDirs};
use berth_csi::registry::PluginRegistration;
use berth_jobspec::{CsiPlugin, CsiPluginType};
use berth_model::csi::{PluginKind, Timeouts, check_plugin_id};
use berth_model::driver::ExitResult;
use berth_model::events::EventKind;
use berth_model::mount::{HandedMount, Propagation};

/// How often a plugin is probed until it is healthy, and afterwards.
const PROBE_STARTING: Duration = Duration::from_millis(500);
const HEARTBEAT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct CsiPluginSupervisorHook {
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The health last reported in an event (`None`: never registered).
    health: Arc<Mutex<Option<bool>>>,
}

/// Where this plugin task's things are, on the host and as the task sees them.
struct PluginPlaces {
    socket_dir: PathBuf,
    /// The socket as the task sees it.
    endpoint: PathBuf,
    dirs: PluginDirs,
    chrooted: bool,
}

fn places(ctx: &TaskHookContext, plugin: &CsiPlugin) -> PluginPlaces {
    let socket_dir = layout::socket_dir(&ctx.csi.root, &ctx.alloc_id);
    let chrooted = ctx.driver.capabilities().fs_isolation.confines();
    let mut dirs = PluginDirs::new(&ctx.csi.root, &plugin.id, &plugin.stage_publish_base_dir);
    let endpoint = if chrooted {
        PathBuf::from(&plugin.mount_dir).join(layout::SOCKET_NAME)
    } else {
        dirs.plugin = dirs.host.clone();
        socket_dir.join(layout::SOCKET_NAME)
    };
    PluginPlaces {
        socket_dir,
        endpoint,
        dirs,
        chrooted,
    }
}

fn kinds(plugin: &CsiPlugin) -> &'static [PluginKind] {
    match plugin.plugin_type {
        CsiPluginType::Node => &[PluginKind::Node],
        CsiPluginType::Controller => &[PluginKind::Controller],
        CsiPluginType::Monolith => &[PluginKind::Node, PluginKind::Controller],
    }
}

impl CsiPluginSupervisorHook {
    fn start_supervising(&self, ctx: &TaskHookContext) {
        let Some(plugin) = ctx.task.csi_plugin.clone() else {
            return;
        };
        let places = places(ctx, &plugin);
        let registrations: Vec<PluginRegistration> = kinds(&plugin)
            .iter()
            .map(|&kind| PluginRegistration {
                id: plugin.id.clone(),
                kind,
                alloc_id: ctx.alloc_id.clone(),
                task: ctx.task.name.clone(),
                socket: places.socket_dir.join(layout::SOCKET_NAME),
                dirs: places.dirs.clone(),
                healthy: true,
                health: "probe succeeded".into(),
            })
            .collect();
        let supervisor = Supervisor {
            registrations,
            client: CsiClient::new(
                &plugin.id,
                &places.socket_dir.join(layout::SOCKET_NAME),
                Timeouts::PROBE,
            )
            .measured(ctx.csi.metrics.clone()),
            registry: ctx.csi.registry.clone(),
            events: ctx.events.clone(),
            restart: ctx.restart.clone(),
            health: self.health.clone(),
            health_timeout: plugin.health_timeout,
            mount_refusals: ctx.alloc_dir.mount_refusals(&ctx.task.name),
        };
        let handle = tokio::spawn(supervisor.run());
        if let Some(old) = self.supervisor.lock().unwrap().replace(handle) {
            old.abort();
        }
    }

    fn stop_supervising(&self) {
        if let Some(handle) = self.supervisor.lock().unwrap().take() {
            handle.abort();
        }
    }
}

impl TaskHook for CsiPluginSupervisorHook {
    fn name(&self) -> &'static str {
        "csi_plugin_supervisor"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let Some(plugin) = &ctx.task.csi_plugin else {
                return Ok(());
            };
            let fail = |message: String| self.fail(message);
            check_plugin_id(&plugin.id).map_err(|why| fail(why.to_string()))?;
            // Checked at submit too; again here for a job accepted under an earlier config.
            if let Some(jobs) = ctx.config.csi_plugin_reserved_for(&plugin.id)
                && !ctx.config.csi_plugin_allowed(&plugin.id, &ctx.job)
            {
                return Err(fail(format!(
                    "CSI plugin {:?} is reserved by this agent's operator for job(s) {} \
                     submitted by the operator: job {:?} may not provide it",
                    plugin.id,
                    jobs.join(", "),
                    ctx.job.name
                )));
            }
            if !ctx.config.csi_privileged(&plugin.id, &ctx.job)
                && plugin.plugin_type != CsiPluginType::Controller
            {
                ctx.report(
                    EventKind::TaskHook,
                    format!(
                        "CSI plugin {:?} runs confined, without the capabilities to mount volumes; \
                         an operator allows it for this job with csi {{ privileged_plugin {:?} \
                         {{ jobs = [{:?}] }} }} in the agent config",
                        plugin.id, plugin.id, ctx.job.name
                    ),
                );
            }
            let places = places(ctx, plugin);
            berth_sys::mount::shared::ensure_shared(&ctx.csi.root).map_err(|e| {
                fail(format!(
                    "making {} a shared mount for the plugin's volumes: {e}",
                    ctx.csi.root.display()
                ))
            })?;
            for dir in [&places.socket_dir, &places.dirs.host] {
                std::fs::create_dir_all(dir)
                    .map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
            }
            // A socket left by an earlier run of the task would answer nothing.
            let _ = std::fs::remove_file(places.socket_dir.join(layout::SOCKET_NAME));
            if places.chrooted {
                for (host_path, task_path) in [
                    (&places.socket_dir, &plugin.mount_dir),
                    (&places.dirs.host, &plugin.stage_publish_base_dir),
                ] {
                    prepare.mounts.push(HandedMount {
                        host_path: host_path.clone(),
                        task_path: task_path.into(),
                        read_only: false,
                        propagation: Propagation::Bidirectional,
                        allow_setuid: false,
                        source_below: None,
                    });
                }
            }
            prepare.env.retain(|(key, _)| key != "CSI_ENDPOINT");
            prepare.env.push((
                "CSI_ENDPOINT".into(),
                format!("unix://{}", places.endpoint.display()),
            ));
            Ok(())
        })
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.start_supervising(ctx) })
    }

    fn recovered<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // A plugin task started before the operator reserved its id is not registered
            // under it again (it would be sent the id's calls); the task is left alone.
            if let Some(plugin) = &ctx.task.csi_plugin
                && !ctx.config.csi_plugin_allowed(&plugin.id, &ctx.job)
            {
                ctx.report(
                    EventKind::TaskHook,
                    format!(
                        "CSI plugin {:?} is now reserved by this agent's operator for other \
                         jobs: this task is not registered as the plugin; stop it",
                        plugin.id
                    ),
                );
                return;
            }
            self.start_supervising(ctx)
        })
    }

    fn exited<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        _exit: Option<&'a ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(plugin) = &ctx.task.csi_plugin else {
                return;
            };
            self.stop_supervising();
            let why = "the plugin task exited";
            for &kind in kinds(plugin) {
                ctx.csi
                    .registry
                    .set_health(kind, &plugin.id, &ctx.alloc_id, false, why);
            }
            let mut health = self.health.lock().unwrap();
            if *health == Some(true) {
                *health = Some(false);
                ctx.report(
                    EventKind::PluginUnhealthy,
                    format!("Plugin became unhealthy: {why}"),
                );
            }
        })
    }

    fn stop<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(plugin) = &ctx.task.csi_plugin else {
                return;
            };
            self.stop_supervising();
            for &kind in kinds(plugin) {
                if ctx.csi.registry.deregister(kind, &plugin.id, &ctx.alloc_id) {
                    tracing::info!(plugin = %plugin.id, %kind, alloc = %ctx.alloc_id,
                        "deregistered the CSI plugin: its task is stopping");
                }
            }
            let places = places(ctx, plugin);
            if let Err(error) =
                berth_sys::blocking::run(|| std::fs::remove_dir_all(&places.socket_dir))
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %places.socket_dir.display(), %error,
                        "removing the plugin's socket dir");
            }
            if ctx.csi.registry.list().is_empty()
                && let Err(error) =
                    berth_sys::mount::shared::release_shared_if_unused(&ctx.csi.root)
            {
                tracing::warn!(%error, "releasing the shared CSI mount");
            }
        })
    }
}

struct Supervisor {
    registrations: Vec<PluginRegistration>,
    client: CsiClient,
    registry: Arc<berth_csi::registry::PluginRegistry>,
    events: Option<super::events::TaskEvents>,
    restart: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    health: Arc<Mutex<Option<bool>>>,
    health_timeout: Duration,
    /// The file the task's mount warden writes its refusals to, if it may mount.
    mount_refusals: Option<PathBuf>,
}

/// How often the mount warden's refusals are read for events.
const REFUSALS_EVERY: Duration = Duration::from_millis(500);

/// The longest refusal shown in an event (the paths in it are the plugin's).
const MAX_REFUSAL_EVENT: usize = 512;

/// Aborts a spawned task when dropped: the supervisor's helpers end with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports each line the mount warden appends to `path` as a task event, from where
/// the file ends when it starts (a restarted agent does not report old refusals again).
async fn report_mount_refusals(path: PathBuf, events: super::events::TaskEvents) {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    let mut offset = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let mut partial = Vec::new();
    loop {
        tokio::time::sleep(REFUSALS_EVERY).await;
        let Ok(mut file) = tokio::fs::File::open(&path).await else {
            continue;
        };
        if file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
            continue;
        }
        let mut read = Vec::new();
        let Ok(count) = file.read_to_end(&mut read).await else {
            continue;
        };
        offset += count as u64;
        partial.extend_from_slice(&read);
        while let Some(end) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]);
            let line = line.strip_prefix("berth: ").unwrap_or(&line);
            let mut message: String = line.chars().take(MAX_REFUSAL_EVENT).collect();
            if let Some(first) = message.get(..1) {
                let upper = first.to_uppercase();
                message.replace_range(..1, &upper);
            }
            events.emit(EventKind::TaskHook, message);
        }
    }
}

/// Why a health probe failed; shown in the "Plugin became unhealthy" event.
#[derive(Debug, thiserror::Error)]
enum ProbeFailure {
    #[error("the plugin has not created its socket {} yet", .0.display())]
    NoSocket(std::path::PathBuf),
    #[error("the plugin says it is not ready yet")]
    NotReady,
    #[error(transparent)]
    Rpc(berth_csi::client::CsiError),
}

impl Supervisor {
    async fn probe(&self) -> Result<(), ProbeFailure> {
        if !self.client.socket().exists() {
            return Err(ProbeFailure::NoSocket(self.client.socket().to_path_buf()));
        }
        match self.client.probe().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ProbeFailure::NotReady),
            Err(error) => Err(ProbeFailure::Rpc(error)),
        }
    }

    fn emit(&self, kind: EventKind, message: String) {
        if let Some(events) = &self.events {
            events.emit(kind, message);
        }
    }

    /// Records and reports a health change; quiet when nothing changed.
    fn set_health(&self, healthy: bool, why: &str) {
        let first = self.registrations[0].clone();
        let known = self
            .registry
            .get(first.kind, &first.id)
            .is_some_and(|r| r.alloc_id == first.alloc_id);
        for registration in &self.registrations {
            if known {
                self.registry.set_health(
                    registration.kind,
                    &registration.id,
                    &registration.alloc_id,
                    healthy,
                    why,
                );
            } else {
                self.registry.register(PluginRegistration {
                    healthy,
                    health: why.to_string(),
                    ..registration.clone()
                });
            }
        }
        let mut reported = self.health.lock().unwrap();
        if *reported == Some(healthy) {
            return;
        }
        *reported = Some(healthy);
        drop(reported);
        if healthy {
            self.emit(EventKind::PluginHealthy, "Plugin became healthy".into());
        } else {
            self.emit(
                EventKind::PluginUnhealthy,
                format!("Plugin became unhealthy: {why}"),
            );
        }
    }

    async fn run(self) {
        let _refusals = match (&self.mount_refusals, &self.events) {
            (Some(path), Some(events)) => Some(AbortOnDrop(tokio::spawn(report_mount_refusals(
                path.clone(),
                events.clone(),
            )))),
            _ => None,
        };
        let deadline = Instant::now() + self.health_timeout;
        loop {
            match self.probe().await {
                Ok(()) => break,
                Err(why) if Instant::now() >= deadline => {
                    let reason = format!(
                        "CSI plugin did not become healthy within {:?}: {why}",
                        self.health_timeout
                    );
                    if let Some(restart) = &self.restart {
                        let _ = restart.send(reason);
                    }
                    return;
                }
                Err(_) => tokio::time::sleep(PROBE_STARTING).await,
            }
        }
        self.set_health(true, "probe succeeded");
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            match self.probe().await {
                Ok(()) => self.set_health(true, "probe succeeded"),
                Err(why) => self.set_health(false, &why.to_string()),
            }
        }
    }
}
