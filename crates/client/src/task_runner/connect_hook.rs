//! The Connect sidecar of a group service (`connect { sidecar_service {} }`), before it
//! starts, as Nomad's sids and envoy bootstrap hooks:
//!
//! 1. With Consul ACLs on (a `consul { token }`), a **service identity token** for the
//!    service, derived through Consul's ACL API (`PUT /v1/acl/token` with
//!    `ServiceIdentities`), retried with backoff (5 s × attempt, at most 3 min) until
//!    `service_identity_timeout` (5 min); a refusal by the ACL system fails at once. It is
//!    written to `secrets/si_token` (0440, the task's user) and its accessor recorded
//!    beside the alloc's tasks, so that it is revoked when the alloc ends, also by an agent
//!    restarted meanwhile.
//! 2. **Envoy's bootstrap**: `consul connect envoy -bootstrap` for the sidecar's proxy ID,
//!    with `-token` exactly when there is a token, written to
//!    `secrets/envoy_bootstrap.json`; retried for up to 60 s (Consul may not know the
//!    sidecar service yet), 1 s apart.
//!
//! A failure is the task's setup failure, with the reason in its event.

use std::io::Write as _;
use std::time::{Duration, Instant};

use super::hooks::{HookError, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::template_render::write_beneath_for;
use crate::consul::api::{AclToken, ConsulError};
use berth_model::driver::TaskUser;

pub struct ConnectHook;

/// How long the bootstrap command is retried, and how far apart.
const BOOTSTRAP_FOR: Duration = Duration::from_secs(60);
const BOOTSTRAP_GAP: Duration = Duration::from_secs(1);
/// The most Envoy bootstrap text kept (it is a few KiB).
const MAX_BOOTSTRAP: usize = 1 << 20;

fn failure(message: String) -> HookError {
    HookError {
        hook: "connect".into(),
        message,
    }
}

impl TaskHook for ConnectHook {
    fn name(&self) -> &'static str {
        "connect"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let Some(service) = &ctx.task.connect_proxy_for else {
                return Ok(());
            };
            let (Some(settings), Some(api)) = (ctx.config.consul.as_ref(), ctx.services.api())
            else {
                return Err(failure(format!(
                    "the sidecar of service {service:?} needs Consul, and this agent has no \
                     consul block"
                )));
            };
            // The user the task will run as (for exec when the job names none: its own
            // dynamic uid).
            let user: Option<TaskUser> = ctx.task_user().map_err(|e| failure(e.to_string()))?;
            let Some(service_id) = ctx.services.group_service_id(&ctx.alloc_id, service) else {
                return Err(failure(format!(
                    "service {service:?} is not registered for this alloc"
                )));
            };
            let token = match settings.token().map_err(|e| failure(e.to_string()))? {
                None => None,
                Some(_) => {
                    let token = derive_token(
                        api,
                        service,
                        &format!("_berth_si_token {} {}", ctx.alloc_id, ctx.task.name),
                        settings.service_identity_timeout,
                    )
                    .await?;
                    record_accessor(&ctx.alloc_dir.si_token_accessors(), &token.accessor_id)
                        .map_err(|e| {
                            failure(format!(
                                "recording the token's accessor for revocation: {e}"
                            ))
                        })?;
                    write_beneath_for(
                        &prepare.task_dir,
                        "secrets/si_token",
                        token.secret_id.as_bytes(),
                        0o440,
                        user.map(|user| (user, &*ctx.sys)),
                    )
                    .map_err(|e| failure(format!("writing secrets/si_token: {e}")))?;
                    Some(token)
                }
            };
            let args = bootstrap_args(
                settings,
                &crate::consul::sidecar_id(&service_id),
                token.as_ref().map(|t| t.secret_id.as_str()),
            );
            let bootstrap = run_bootstrap(&settings.binary, &args).await?;
            write_beneath_for(
                &prepare.task_dir,
                "secrets/envoy_bootstrap.json",
                &bootstrap,
                0o440,
                user.map(|user| (user, &*ctx.sys)),
            )
            .map_err(|e| failure(format!("writing secrets/envoy_bootstrap.json: {e}")))?;
            Ok(())
        })
    }
}

/// A service identity token, retried while Consul cannot answer, until `timeout`.
async fn derive_token(
    api: &crate::consul::api::ConsulApi,
    service: &str,
    description: &str,
    timeout: Duration,
) -> Result<AclToken, HookError> {
    let deadline = Instant::now() + timeout;
    let mut attempt: u32 = 0;
    loop {
        let error = match api
            .create_service_identity_token(service, description)
            .await
        {
            Ok(token) => return Ok(token),
            Err(error) if error.is_permission() => {
                return Err(failure(format!(
                    "deriving the service identity token of {service:?}: {error} (the \
                     consul token needs acl:write)"
                )));
            }
            Err(error) => error,
        };
        attempt += 1;
        let backoff = (Duration::from_secs(5) * attempt).min(Duration::from_secs(180));
        if Instant::now() + backoff > deadline {
            return Err(timed_out(service, timeout, &error));
        }
        tracing::warn!(%error, attempt, "deriving a service identity token; retrying");
        tokio::time::sleep(backoff).await;
    }
}

fn timed_out(service: &str, timeout: Duration, error: &ConsulError) -> HookError {
    failure(format!(
        "deriving the service identity token of {service:?} timed out after {}s \
         (service_identity_timeout): {error}",
        timeout.as_secs()
    ))
}

/// Appends a token's accessor to the alloc's list, durably: the token is revoked from
/// it when the alloc ends.
fn record_accessor(path: &std::path::Path, accessor: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(file, "{accessor}")?;
    file.sync_all()
}

/// Revokes every service identity token derived for an alloc, then forgets them.
pub async fn revoke_tokens(api: &crate::consul::api::ConsulApi, accessors: &std::path::Path) {
    let Ok(text) = std::fs::read_to_string(accessors) else {
        return;
    };
    let mut kept = Vec::new();
    for accessor in text.lines().filter(|l| !l.is_empty()) {
        if let Err(error) = api.delete_token(accessor).await {
            tracing::warn!(%error, accessor, "revoking a service identity token");
            // Kept, and tried again when the alloc is collected or the agent restarts.
            // Consul answers 200 for a token already gone; a 404 means berth's own
            // token is unknown (rotated or deleted), and the token is still live.
            kept.push(accessor.to_string());
        }
    }
    let _ = if kept.is_empty() {
        std::fs::remove_file(accessors)
    } else {
        std::fs::write(accessors, kept.join("\n") + "\n")
    };
}

/// `consul connect envoy -bootstrap`'s arguments, as Nomad's envoy bootstrap hook passes
/// them; `-token` only with a token.
pub fn bootstrap_args(
    settings: &crate::config::ConsulSettings,
    proxy_id: &str,
    token: Option<&str>,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "connect",
        "envoy",
        "-grpc-addr",
        &settings.grpc_address,
        "-http-addr",
        &settings.address,
        "-admin-access-log-path",
        "/dev/null",
        "-admin-bind",
        "127.0.0.2:19000",
        "-address",
        "127.0.0.1:19100",
        "-proxy-id",
        proxy_id,
        "-bootstrap",
    ]
    .map(String::from)
    .into();
    if let Some(token) = token {
        args.extend(["-token".to_string(), token.to_string()]);
    }
    args
}

/// Runs the bootstrap command until it succeeds or [`BOOTSTRAP_FOR`] has passed; its
/// output. A missing program fails at once.
async fn run_bootstrap(program: &str, args: &[String]) -> Result<Vec<u8>, HookError> {
    let deadline = Instant::now() + BOOTSTRAP_FOR;
    loop {
        let output = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await;
        let why = match output {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(failure(format!(
                    "the consul program ({program:?}) is not on this node: berth runs `consul \
                     connect envoy -bootstrap` to write Envoy's bootstrap (set consul {{ binary \
                     }} in the agent config)"
                )));
            }
            Err(error) => format!("running {program:?}: {error}"),
            Ok(output) if output.status.success() && output.stdout.len() <= MAX_BOOTSTRAP => {
                return Ok(output.stdout);
            }
            Ok(output) if output.status.success() => {
                format!("its output is over {MAX_BOOTSTRAP} bytes")
            }
            Ok(output) => format!(
                "{} ({})",
                berth_model::text::clip(String::from_utf8_lossy(&output.stderr).trim(), 512),
                output.status
            ),
        };
        if Instant::now() + BOOTSTRAP_GAP > deadline {
            return Err(failure(format!(
                "writing Envoy's bootstrap failed for {}s: {why}",
                BOOTSTRAP_FOR.as_secs()
            )));
        }
        tokio::time::sleep(BOOTSTRAP_GAP).await;
    }
}
