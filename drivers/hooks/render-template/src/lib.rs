//! Example hook: renders a template into the task's `local/` directory.
//!
//! The template is the hook config's `template`, or a file the job put in `local/`
//! (config `source`, read through the sandbox's only preopened directory, `/local`).
//! Placeholders: `{{ job }}`, `{{ group }}`, `{{ task }}`, `{{ alloc_id }}`,
//! `{{ env.NAME }}`, `{{ meta.NAME }}`. The result goes to config `destination`
//! (default `rendered.conf`), written by the host beneath `local/`.

use berth_plugin_sdk::export_hook;
use berth_plugin_sdk::hook::{self, File, Hook, PrestartResponse, TaskContext};

struct RenderTemplate;

impl Hook for RenderTemplate {
    fn prestart(context: TaskContext) -> Result<PrestartResponse, String> {
        let template = match hook::lookup(&context.hook_config, "source") {
            Some(source) => std::fs::read_to_string(format!("/local/{source}"))
                .map_err(|e| format!("reading the template local/{source}: {e}"))?,
            None => hook::lookup(&context.hook_config, "template")
                .ok_or("the hook config has neither `template` nor `source`")?
                .to_string(),
        };
        let destination = hook::lookup(&context.hook_config, "destination")
            .unwrap_or("rendered.conf")
            .to_string();
        let rendered = render(&template, &context)?;
        let mut response = hook::response();
        response.files.push(File {
            path: destination,
            contents: rendered.into_bytes(),
        });
        Ok(response)
    }
}

fn render(template: &str, context: &TaskContext) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or("a `{{` in the template is never closed")?;
        let key = after[..end].trim();
        out.push_str(&lookup(key, context)?);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn lookup(key: &str, context: &TaskContext) -> Result<String, String> {
    let value = match key {
        "job" => Some(context.job_name.as_str()),
        "group" => Some(context.group_name.as_str()),
        "task" => Some(context.task_name.as_str()),
        "alloc_id" => Some(context.alloc_id.as_str()),
        _ => match key.split_once('.') {
            Some(("env", name)) => hook::lookup(&context.env, name),
            Some(("meta", name)) => hook::lookup(&context.meta, name),
            _ => return Err(format!("unknown placeholder {{{{ {key} }}}}")),
        },
    };
    Ok(value.unwrap_or_default().to_string())
}

export_hook!(RenderTemplate);
