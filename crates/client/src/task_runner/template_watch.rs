//! Templates rendered again while their task runs, as consul-template does for Nomad:
//! when a service the template read changes in the cluster's catalog (or, polled, a
//! file it read or an answer of Consul's), the watcher waits for the change to settle
//! (`wait.min`, at most `wait.max`), renders again, and only when a file's text changed
//! writes it and acts on the task by the template's `change_mode`: a restart (outside
//! the restart policy, as Nomad's), a signal, a script run inside the task (its
//! `fail_on_error` kills and fails the task when it fails), or nothing; after a random
//! `splay`, so that the tasks that read one service do not all restart at once. A
//! render that fails leaves the file as it was and says why in a task event.
//!
//! One watcher per run of the task: started by the template hook once the task runs
//! (or once it is recovered after an agent restart), aborted when the run ends (the
//! next run renders afresh in prestart).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::control::{TaskCommand, TaskControl};
use super::events::TaskEvents;
use super::template_consul::{self, ConsulRead};
use super::template_data::{Watched, file_fingerprint};
use super::template_render::{Rendering, on_render_thread, write_beneath_for};
use berth_jobspec::{ChangeMode, ChangeScript};
use berth_model::events::EventKind;

/// How often files a template read are looked at again (consul-template polls them).
const FILE_POLL: Duration = Duration::from_secs(2);

/// The most Consul questions one poll asks again (the rest in the next polls).
const CONSUL_WINDOW: usize = 16;

/// The least time between two renders of one task's templates.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Watches a task's templates while it runs: those of one `wait` settle together, each
/// set of them on its own wait, as consul-template waits per template.
pub(super) async fn watch(
    rendering: Arc<Rendering>,
    control: TaskControl,
    events: TaskEvents,
    sys: Arc<dyn berth_sys::Sys>,
) {
    let mut by_wait: BTreeMap<(Duration, Duration), Vec<usize>> = BTreeMap::new();
    {
        let last = rendering.last.lock().unwrap();
        for (index, template) in rendering.templates.iter().enumerate() {
            // A template that read nothing outside itself never changes.
            if !template.once && !last[index].1.is_empty() {
                let wait = (template.wait.min, template.wait.max.max(template.wait.min));
                by_wait.entry(wait).or_default().push(index);
            }
        }
    }
    // Dropped with this future when the run ends: the set aborts every watcher.
    let mut watchers = tokio::task::JoinSet::new();
    for ((min, max), watched) in by_wait {
        let settle = Settle { min, max };
        watchers.spawn(watch_templates(
            rendering.clone(),
            watched,
            settle,
            control.clone(),
            events.clone(),
            sys.clone(),
        ));
    }
    while watchers.join_next().await.is_some() {}
}

/// How long a change must settle before the templates that read it render again.
#[derive(Debug, Clone, Copy)]
struct Settle {
    /// Without another change for this long.
    min: Duration,
    /// Or this long since the first change, however many came.
    max: Duration,
}

/// Watches the templates `watched` (indexes in `rendering`), which share one wait.
async fn watch_templates(
    rendering: Arc<Rendering>,
    watched: Vec<usize>,
    Settle { min, max }: Settle,
    control: TaskControl,
    events: TaskEvents,
    sys: Arc<dyn berth_sys::Sys>,
) {
    let mut changes = rendering.services.subscribe();
    changes.mark_unchanged();
    // The files the watched templates read, and how each looked when last rendered.
    let files_read = || {
        rendering.reads(&watched, |w| match w {
            Watched::File(path) => Some(path.clone()),
            Watched::Services | Watched::Consul(_) => None,
        })
    };
    // The questions the watched templates asked Consul, asked again on each poll.
    let consul_asked = || {
        rendering.reads(&watched, |w| match w {
            Watched::Consul(read) => Some(read.clone()),
            Watched::Services | Watched::File(_) => None,
        })
    };
    let consul_api = rendering.services.api().cloned();
    // Whether Consul now answers any of the next few questions otherwise than the last
    // render saw: a window of them a poll, in turn, so that a task that asks much asks
    // Consul no faster.
    let mut consul_cursor = 0usize;
    let mut consul_changed = async |asked: &BTreeSet<ConsulRead>| -> bool {
        let Some(api) = &consul_api else {
            return false;
        };
        let window: Vec<&ConsulRead> = asked
            .iter()
            .cycle()
            .skip(consul_cursor % asked.len().max(1))
            .take(CONSUL_WINDOW.min(asked.len()))
            .collect();
        consul_cursor = consul_cursor.wrapping_add(window.len());
        for read in window {
            let now = template_consul::digest(&template_consul::answer(api, read).await);
            let seen = rendering.consul_seen.lock().unwrap().get(read).copied();
            if seen != Some(now) {
                return true;
            }
        }
        false
    };
    // Looked at on a blocking thread: up to MAX_FILES a template, each an openat2.
    let fingerprints = |files: &BTreeSet<String>| {
        let files = files.clone();
        let task_dir = rendering.task_dir.clone();
        tokio::task::spawn_blocking(move || {
            files
                .iter()
                .map(|f| (f.clone(), file_fingerprint(&task_dir, f)))
                .collect::<BTreeMap<_, _>>()
        })
    };
    let mut files = files_read();
    let Ok(mut seen_files) = fingerprints(&files).await else {
        return;
    };
    let mut asked = consul_asked();
    let mut last_render: Option<Instant> = None;
    // A change between the first render and this watcher's start is caught by a first
    // look at once.
    let mut look_now = true;
    loop {
        if !look_now {
            // A reason to look: the catalog changed, or a file read did (polled; a
            // file that did not change renders nothing again).
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    _ = tokio::time::sleep(FILE_POLL), if !files.is_empty() || !asked.is_empty() => {
                        // Seen again after the render.
                        match fingerprints(&files).await {
                            Ok(now) if now != seen_files => break,
                            Ok(_) => {}
                            Err(_) => return,
                        }
                        if consul_changed(&asked).await {
                            break;
                        }
                    }
                }
            }
            // The change settles: `min` without another, or `max` since the first.
            let first = Instant::now();
            loop {
                let quiet = min.min(max.saturating_sub(first.elapsed()));
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if first.elapsed() >= max {
                            break;
                        }
                    }
                    _ = tokio::time::sleep(quiet) => break,
                }
            }
            // However often the catalog changes, the templates of one wait render at
            // most once a MIN_INTERVAL (a template with `timestamp` and change_mode
            // "restart" would otherwise restart its task at every change anywhere).
            if let Some(at) = last_render {
                tokio::time::sleep(MIN_INTERVAL.saturating_sub(at.elapsed())).await;
            }
        }
        look_now = false;
        last_render = Some(Instant::now());
        let renderer = rendering.clone();
        let indexes = watched.clone();
        let results = match on_render_thread(move || {
            indexes
                .into_iter()
                .map(|i| (i, renderer.render(i)))
                .collect::<Vec<_>>()
        })
        .await
        {
            Ok(results) => results,
            Err(error) => {
                events.emit(
                    EventKind::TaskHook,
                    format!("template: {error}; its files keep their last text"),
                );
                return;
            }
        };
        let mut changed = Vec::new();
        for (index, result) in results {
            let template = &rendering.templates[index];
            let (text, read) = match result {
                Ok(rendered) => rendered,
                Err(error) => {
                    events.emit(
                        EventKind::TaskHook,
                        format!(
                            "template {}: {error}; the file keeps its last text",
                            template.destination
                        ),
                    );
                    continue;
                }
            };
            let same = rendering.last.lock().unwrap()[index].0 == text;
            if same {
                rendering.last.lock().unwrap()[index].1 = read;
                continue;
            }
            let owner = rendering.owner(index).map(|user| (user, &*sys));
            if let Err(error) = write_beneath_for(
                &rendering.task_dir,
                &template.destination,
                text.as_bytes(),
                template.perms,
                owner,
            ) {
                events.emit(
                    EventKind::TaskHook,
                    format!("template {}: {error}", template.destination),
                );
                continue;
            }
            rendering.last.lock().unwrap()[index] = (text, read);
            changed.push(index);
        }
        files = files_read();
        let Ok(now) = fingerprints(&files).await else {
            return;
        };
        seen_files = now;
        asked = consul_asked();
        rendering.forget_unasked();
        if changed.is_empty() {
            continue;
        }
        let names: Vec<&str> = changed
            .iter()
            .map(|&i| rendering.templates[i].destination.as_str())
            .collect();
        events.emit(
            EventKind::TaskHook,
            format!("Template re-rendered: {}", names.join(", ")),
        );
        let modes: Vec<&ChangeMode> = changed
            .iter()
            .map(|&i| &rendering.templates[i].change_mode)
            .collect();
        let splay = changed
            .iter()
            .map(|&i| rendering.templates[i].splay)
            .max()
            .unwrap_or_default();
        tokio::time::sleep(random_below(splay)).await;
        // A restart covers the rest, as in Nomad: the task starts again with every
        // template rendered afresh.
        if modes.iter().any(|m| matches!(m, ChangeMode::Restart)) {
            let _ = control
                .restart_for("Template with change_mode restart re-rendered")
                .await;
            return;
        }
        let signals: BTreeSet<&str> = modes
            .iter()
            .filter_map(|m| match m {
                ChangeMode::Signal(signal) => Some(signal.as_str()),
                _ => None,
            })
            .collect();
        for signal in signals {
            if let Err(error) = control.signal(signal).await {
                events.emit(
                    EventKind::TaskHook,
                    format!("template: sending {signal} after a re-render: {error}"),
                );
            }
        }
        let mut scripts: Vec<&ChangeScript> = Vec::new();
        for mode in &modes {
            if let ChangeMode::Script(script) = mode
                && !scripts.contains(&script)
            {
                scripts.push(script);
            }
        }
        for script in scripts {
            if !run_script(script, &control, &events).await {
                let _ = control
                    .kill_failed("Template script failed, task is being killed")
                    .await;
                return;
            }
        }
    }
}

/// Runs a template's change script inside the task and says how it went in a task
/// event (Nomad's words). `false` when it failed and its `fail_on_error` fails the task.
async fn run_script(script: &ChangeScript, control: &TaskControl, events: &TaskEvents) -> bool {
    let argv: Vec<String> = std::iter::once(script.command.clone())
        .chain(script.args.iter().cloned())
        .collect();
    let started = Instant::now();
    let ran = control
        .exec(TaskCommand {
            argv,
            timeout: script.timeout,
        })
        .await;
    let (command, args) = (&script.command, &script.args);
    let failure = match ran {
        Err(error) => {
            format!("Template failed to run script {command} with arguments {args:?}: {error}")
        }
        Ok(ran) if ran.timed_out => format!(
            "Template ran script {command} with arguments {args:?} on change but it did not end \
             within its timeout of {:?}, and was killed{}",
            script.timeout,
            said(&ran.output)
        ),
        Ok(ran) if ran.status.code == Some(0) => {
            tracing::debug!(took = ?started.elapsed(), command, "template change script ran");
            events.emit(
                EventKind::TaskHook,
                format!(
                    "Template successfully ran script {command} with arguments: {args:?}. Exit \
                     code: 0"
                ),
            );
            return true;
        }
        Ok(ran) => {
            let how = match (ran.status.code, ran.status.signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(signal)) => format!("was killed by signal {signal}"),
                (None, None) => "ended without a status".to_string(),
            };
            format!(
                "Template ran script {command} with arguments {args:?} on change but it {how}{}",
                said(&ran.output)
            )
        }
    };
    events.emit(EventKind::TaskHook, failure);
    !script.fail_on_error
}

/// The end of a script's output, for its event: `": <last words>"`, or nothing.
fn said(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    // The last lines say why, most often.
    let tail: String = text
        .chars()
        .rev()
        .take(512)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!(": {}", tail.replace('\n', " / "))
}

/// A random wait from zero up to (not including) `limit`.
fn random_below(limit: Duration) -> Duration {
    let nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    Duration::from_nanos(u64::from_le_bytes(bytes) % nanos)
}
