//! Task lifecycle order within an alloc, as in Nomad:
//!
//! ```text
//!   prestart tasks ─(all succeeded)─► main tasks ─(all running)─► poststart tasks
//!   prestart sidecars ─────────── run beside the main tasks ──────────────┐
//!                                    main tasks all dead ─► stop sidecars ─┴─► poststop tasks
//! ```
//!
//! A prestart task that fails keeps the main tasks from starting. Poststop tasks run
//! even when the alloc was stopped: they are the cleanup step.

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::AllocRunner;
use crate::task_runner::Outcome;
use berth_jobspec::{LifecycleHook, Task};
use berth_model::events::TaskStateKind;

/// Where a task sits in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prestart,
    PrestartSidecar,
    Main,
    Poststart,
    PoststartSidecar,
    Poststop,
}

fn phase(task: &Task) -> Phase {
    match task.lifecycle {
        None => Phase::Main,
        Some(l) => match (l.hook, l.sidecar) {
            (LifecycleHook::Prestart, false) => Phase::Prestart,
            (LifecycleHook::Prestart, true) => Phase::PrestartSidecar,
            (LifecycleHook::Poststart, false) => Phase::Poststart,
            (LifecycleHook::Poststart, true) => Phase::PoststartSidecar,
            // Nothing runs after poststop tasks, so a sidecar one is just a poststop task.
            (LifecycleHook::Poststop, _) => Phase::Poststop,
        },
    }
}

/// Collects outcomes; a stopped task is not a failure.
async fn join_all(set: &mut JoinSet<Outcome>) -> bool {
    let mut failed = false;
    while let Some(outcome) = set.join_next().await {
        failed |= !matches!(outcome, Ok(Outcome::Succeeded | Outcome::Stopped));
    }
    failed
}

impl AllocRunner {
    fn tasks_in(&self, wanted: &[Phase]) -> Vec<Task> {
        let group = self.group.clone();
        group
            .tasks
            .iter()
            .filter(|t| wanted.contains(&phase(t)))
            .cloned()
            .collect()
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Runs every task in lifecycle order; returns whether any that had to succeed
    /// failed.
    pub(super) async fn run_tasks(&self) -> bool {
        let mut failed = false;
        // Sidecars stop when the main tasks are done, or when the alloc is stopped.
        let (sidecar_stop, _) = watch::channel(false);
        let mut sidecars = JoinSet::new();
        let mut alloc_stop = self.stop.subscribe();
        let forward = {
            let sidecar_stop = sidecar_stop.clone();
            async move {
                let _ = alloc_stop.wait_for(|stop| *stop).await;
                sidecar_stop.send_replace(true);
            }
        };
        let forwarder = tokio::spawn(forward);

        let mut prestart = JoinSet::new();
        for task in self.tasks_in(&[Phase::PrestartSidecar]) {
            failed |= !self.spawn_task(&task, sidecar_stop.subscribe(), &mut sidecars);
        }
        for task in self.tasks_in(&[Phase::Prestart]) {
            failed |= !self.spawn_task(&task, self.stop.subscribe(), &mut prestart);
        }
        failed |= join_all(&mut prestart).await;
        let sidecar_names: Vec<String> = self
            .tasks_in(&[Phase::PrestartSidecar])
            .into_iter()
            .map(|t| t.name)
            .collect();
        self.wait_until_started(&sidecar_names).await;

        if !failed && !self.stopping() {
            let mut main = JoinSet::new();
            let main_tasks = self.tasks_in(&[Phase::Main]);
            for task in &main_tasks {
                failed |= !self.spawn_task(task, self.stop.subscribe(), &mut main);
            }
            let names: Vec<String> = main_tasks.into_iter().map(|t| t.name).collect();
            self.wait_until_started(&names).await;
            let mut poststart = JoinSet::new();
            if !self.stopping() {
                for task in self.tasks_in(&[Phase::PoststartSidecar]) {
                    failed |= !self.spawn_task(&task, sidecar_stop.subscribe(), &mut sidecars);
                }
                for task in self.tasks_in(&[Phase::Poststart]) {
                    failed |= !self.spawn_task(&task, self.stop.subscribe(), &mut poststart);
                }
            }
            failed |= join_all(&mut main).await;
            failed |= join_all(&mut poststart).await;
        }
        sidecar_stop.send_replace(true);
        forwarder.abort();
        failed |= join_all(&mut sidecars).await;

        // Poststop tasks are not stopped by an alloc stop: they are the cleanup.
        let (_never, never_stop) = watch::channel(false);
        let mut poststop = JoinSet::new();
        for task in self.tasks_in(&[Phase::Poststop]) {
            failed |= !self.spawn_task(&task, never_stop.clone(), &mut poststop);
        }
        failed |= join_all(&mut poststop).await;
        failed
    }

    /// Waits until none of `names` is pending any more (running, or already dead), or
    /// the alloc is stopped.
    async fn wait_until_started(&self, names: &[String]) {
        let mut stop = self.stop.subscribe();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let all_started = names
                .iter()
                .all(|name| self.task_states[name].lock().unwrap().state != TaskStateKind::Pending);
            if all_started || self.stopping() {
                return;
            }
            tokio::select! {
                _ = changed => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_hook_and_sidecar() {
        let source = r#"
job "j" {
  group "g" {
    task "main" { driver = "mock" }
    task "pre" {
      driver = "mock"
      lifecycle { hook = "prestart" }
    }
    task "pre_side" {
      driver = "mock"
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
    }
    task "post" {
      driver = "mock"
      lifecycle { hook = "poststart" }
    }
    task "post_side" {
      driver = "mock"
      lifecycle {
        hook    = "poststart"
        sidecar = true
      }
    }
    task "cleanup" {
      driver = "mock"
      lifecycle { hook = "poststop" }
    }
  }
}
"#;
        let job = berth_jobspec_hcl::parse("j.hcl", source).unwrap();
        let phases: Vec<(&str, Phase)> = job.groups[0]
            .tasks
            .iter()
            .map(|t| (t.name.as_str(), phase(t)))
            .collect();
        assert_eq!(
            phases,
            vec![
                ("main", Phase::Main),
                ("pre", Phase::Prestart),
                ("pre_side", Phase::PrestartSidecar),
                ("post", Phase::Poststart),
                ("post_side", Phase::PoststartSidecar),
                ("cleanup", Phase::Poststop),
            ]
        );
    }
}
