//! A task's templates as one run renders them: each rendered with the task's answers
//! (`template_data`) within the agent's limits, written beneath the task's directory
//! through no link the task planted, owned by the task's user (or the template's ids).
//! The template hook renders them before the task starts; the watcher again while it
//! runs.
//!
//! The task's directory is the task's to write, and a task restarts: by then a
//! destination may be a symlink it planted to a host file. So each file is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the task's directory: the
//! agent, as root, never writes outside it, whatever the task did there.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::template_consul::ConsulReads;
use super::template_data::{TaskTemplateData, Watched};
use berth_jobspec::Template;
use berth_jobspec::template::{TemplateError, env_lines};
use berth_model::driver::TaskUser;

/// Why the renderer's thread gave no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum RenderThreadError {
    #[error("no thread for the renderer: {0}")]
    Spawn(std::io::Error),
    #[error("the renderer stopped without an answer (a bug in berth's template engine)")]
    Ended,
}

/// The stack of a renderer's thread: room for the engine's nesting limit (200 levels)
/// in a debug build, with much to spare.
const RENDER_STACK: usize = 32 << 20;

/// Runs `work` (renders: blocking, and recursive to the engine's nesting limit) on a
/// thread of its own with a stack to match, and waits for it without blocking the
/// runtime. A render ends within its time budget, so the thread does too.
pub(super) async fn on_render_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RenderThreadError> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("template-render".into())
        .stack_size(RENDER_STACK)
        .spawn(move || {
            let _ = answer.send(work());
        })
        .map_err(RenderThreadError::Spawn)?;
    answered.await.map_err(|_| RenderThreadError::Ended)
}

/// Why an `env = true` template's text is not an environment.
#[derive(Debug, thiserror::Error)]
pub(super) enum TemplateEnvError {
    #[error(transparent)]
    Line(#[from] TemplateError),
    #[error("{0:?} is not an environment variable name")]
    Name(String),
    /// A rendered line may carry another writer's data (a Consul key), so it may not
    /// replace what berth tells the task about itself, its identity's token included.
    #[error("{0:?}: NOMAD_* and BERTH_* variables are set by berth; a template may not set them")]
    Reserved(String),
}

/// What a render may use: a template is the job author's, rendered by the agent.
pub(super) fn render_limits() -> berth_template::Limits {
    berth_template::Limits {
        max_output: 4 << 20,
        max_steps: 5_000_000,
        max_time: std::time::Duration::from_secs(2),
        max_memory: 64 << 20,
        max_depth: 200,
    }
}

/// The templates of one run of a task, as the watcher needs them: how they render and
/// what each last wrote.
pub(super) struct Rendering {
    pub templates: Vec<Template>,
    /// Each template read once per run (it was checked at submit).
    pub parsed: Vec<berth_template::Template>,
    pub env: Arc<BTreeMap<String, String>>,
    pub task_dir: PathBuf,
    /// The task's user, who owns what is written unless a template names its ids.
    pub user: Option<TaskUser>,
    pub services: Arc<crate::consul::ServiceClient>,
    pub node_address: String,
    /// The agent's runtime, which Consul is asked on from the render thread.
    pub runtime: tokio::runtime::Handle,
    /// Each template's last text, and what it read that may change.
    pub last: Mutex<Vec<(String, BTreeSet<Watched>)>>,
    /// What Consul last said to each question a render asked (a digest).
    pub consul_seen: Mutex<BTreeMap<super::template_consul::ConsulRead, u64>>,
}

/// Reads a task's templates, each with its delimiters; the error names the template.
pub(super) fn parse_all(
    templates: &[Template],
) -> Result<Vec<berth_template::Template>, (String, berth_template::ParseError)> {
    templates
        .iter()
        .map(|template| {
            let delimiters = berth_template::Delimiters {
                left: template.left_delimiter.clone(),
                right: template.right_delimiter.clone(),
            };
            berth_template::Template::parse(&template.data, &delimiters)
                .map_err(|e| (template.destination.clone(), e))
        })
        .collect()
}

impl Rendering {
    /// Renders template `index` (blocking: the catalog is read with blocking calls).
    pub fn render(
        &self,
        index: usize,
    ) -> Result<(String, BTreeSet<Watched>), berth_template::RenderError> {
        let template = &self.templates[index];
        let mut data = TaskTemplateData {
            env: self.env.clone(),
            task_dir: self.task_dir.clone(),
            services: self.services.clone(),
            node_address: self.node_address.clone(),
            watched: BTreeSet::new(),
            services_read: BTreeMap::new(),
            consul: ConsulReads::new(self.services.api().cloned(), self.runtime.clone()),
        };
        let options = berth_template::RenderOptions {
            missing_key: if template.error_on_missing_key {
                berth_template::MissingKey::Error
            } else {
                berth_template::MissingKey::NoValue
            },
            limits: render_limits(),
        };
        let rendered = self.parsed[index].render(&mut data, &options);
        // What Consul said, even to a render that failed: the watcher looks again from
        // there (a refusal that ends becomes a change).
        self.consul_seen.lock().unwrap().extend(
            data.consul
                .seen
                .iter()
                .map(|(read, seen)| (read.clone(), *seen)),
        );
        let text = rendered?;
        let mut watched = data.watched;
        watched.extend(data.consul.seen.into_keys().map(Watched::Consul));
        Ok((text, watched))
    }

    /// The owner of template `index`'s file: its `uid`/`gid`, else the task's user's.
    pub fn owner(&self, index: usize) -> Option<TaskUser> {
        let template = &self.templates[index];
        if self.user.is_none() && template.uid.is_none() && template.gid.is_none() {
            return None;
        }
        let user = self.user.unwrap_or(TaskUser { uid: 0, gid: 0 });
        Some(TaskUser {
            uid: template.uid.unwrap_or(user.uid),
            gid: template.gid.unwrap_or(user.gid),
        })
    }

    /// What templates `indexes` last read, as `pick` takes it from each read.
    pub fn reads<T: Ord>(
        &self,
        indexes: &[usize],
        pick: impl Fn(&Watched) -> Option<T>,
    ) -> BTreeSet<T> {
        let last = self.last.lock().unwrap();
        indexes
            .iter()
            .filter_map(|&i| last.get(i))
            .flat_map(|(_, watched)| watched.iter())
            .filter_map(pick)
            .collect()
    }

    /// Forgets what Consul said to questions no template asks any more.
    pub fn forget_unasked(&self) {
        let all: Vec<usize> = (0..self.templates.len()).collect();
        let asked = self.reads(&all, |w| match w {
            Watched::Consul(read) => Some(read.clone()),
            _ => None,
        });
        self.consul_seen
            .lock()
            .unwrap()
            .retain(|read, _| asked.contains(read));
    }

    /// Whether anything it rendered may change while the task runs.
    pub fn watches(&self) -> bool {
        let last = self.last.lock().unwrap();
        self.templates
            .iter()
            .zip(last.iter())
            .any(|(template, (_, watched))| !template.once && !watched.is_empty())
    }
}

/// An `env = true` template's variables, each name checked.
pub(super) fn template_env(text: &str) -> Result<Vec<(String, String)>, TemplateEnvError> {
    let mut added = Vec::new();
    for (key, value) in env_lines(text)? {
        let valid = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid || value.contains('\0') {
            return Err(TemplateEnvError::Name(key));
        }
        if berth_model::task_env::set_by_berth(&key).is_some() {
            return Err(TemplateEnvError::Reserved(key));
        }
        added.push((key, value));
    }
    Ok(added)
}

/// Writes `bytes` to `relative` under `root`, never through a symlink or out of `root`;
/// the file then given to `owner` (the task's user) through `sys`.
pub(super) fn write_beneath_for(
    root: &std::path::Path,
    relative: &str,
    bytes: &[u8],
    perms: u32,
    owner: Option<(berth_model::driver::TaskUser, &dyn berth_sys::Sys)>,
) -> std::io::Result<()> {
    let not_a_file = || {
        std::io::Error::other(
            "the destination is not a regular file (the task left a FIFO, a device or a \
             socket there); berth writes regular files only",
        )
    };
    let refused = |e: rustix::io::Errno| -> std::io::Error {
        if e == rustix::io::Errno::XDEV || e == rustix::io::Errno::LOOP {
            std::io::Error::other(
                "the path leads out of the task's directory or through a symlink; berth \
                 does not follow it",
            )
        } else {
            e.into()
        }
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    // The directories on the way are made as Nomad makes them, one at a time from the
    // one before, never through a symlink.
    let mut current: std::os::fd::OwnedFd = std::fs::File::open(root)?.into();
    let parts: Vec<&str> = relative.split('/').collect();
    let Some((name, parents)) = parts.split_last() else {
        return Err(std::io::Error::other("an empty destination"));
    };
    for part in parents {
        match rustix::fs::mkdirat(&current, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(refused(error)),
        }
        current = rustix::fs::openat2(
            &current,
            *part,
            OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            resolve,
        )
        .map_err(refused)?;
    }
    use berth_sys::mount::beneath::{WriteOpenError, open_file_for_writing};
    let fd = open_file_for_writing(current.as_fd(), *name, perms).map_err(|e| match e {
        WriteOpenError::NotAFile => not_a_file(),
        WriteOpenError::Open(e) => refused(e),
    })?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(perms))?;
    if let Some((user, sys)) = owner {
        sys.give_file(fd.as_fd(), user)?;
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_env_template_sets_its_own_names_and_never_berths() {
        let added = template_env("APP_DB=db.internal\n# a comment\nAPP_PORT=\"5432\"\n").unwrap();
        assert_eq!(
            added,
            [
                ("APP_DB".to_string(), "db.internal".to_string()),
                ("APP_PORT".to_string(), "5432".to_string())
            ]
        );
        // A Consul value with a line break of its own: the second line would replace the
        // identity's token (in the task's env and in its driver config).
        let injected = "DB=x\nNOMAD_TOKEN=';id>/alloc/p;'\n";
        let refused = template_env(injected).unwrap_err().to_string();
        assert_eq!(
            refused,
            "\"NOMAD_TOKEN\": NOMAD_* and BERTH_* variables are set by berth; a template may not set them"
        );
        assert!(template_env("berth_data=1\n").is_err());
        assert!(template_env("Nomad_Alloc_Dir=/etc\n").is_err());
    }
}
