//! consul-template's language, as Nomad's `template` blocks use it: Go's
//! `text/template` syntax (`{{ }}` actions, pipelines, `if`/`with`/`range`, variables,
//! `define`/`template`/`block`, trims and comments) with consul-template's functions.
//!
//! Written here rather than taken from a crate: the one Rust crate of Go's template
//! syntax (gtmpl) has no budget, so a template from a job author could loop forever or
//! render gigabytes inside the agent; it has no `missingkey=error`, no custom
//! delimiters and no `break`/`continue`; and it cannot refuse at submit time a
//! function berth does not have, naming why. Here a template is parsed once (at
//! submit, every function checked against [`functions::FUNCTIONS`]) and rendered
//! within [`Limits`] of steps, time, nesting and bytes.
//!
//! What a template reads from outside (the task's env, its files, services, Consul's
//! keys) comes through the caller's [`Data`]; this crate reads nothing itself, so it
//! is the caller that confines a `file` read and knows which values to watch.

mod budget;
mod compute;
mod exec;
mod format;
pub mod functions;
mod key_trees;
mod lex;
mod operands;
mod parse;
mod value;

#[cfg(test)]
mod functions_tests;
#[cfg(test)]
mod tests;

pub use exec::{Data, Limits, MissingKey, RenderError};
pub use functions::{FUNCTIONS, Support};
pub use parse::{Delimiters, ParseError, Parsed};
pub use value::{Object, Value};

/// Why a function, or the caller's [`Data`], could not answer; shown after the
/// template's line and the function's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CallError(pub String);

impl From<String> for CallError {
    fn from(message: String) -> Self {
        CallError(message)
    }
}

impl From<&str> for CallError {
    fn from(message: &str) -> Self {
        CallError(message.to_string())
    }
}

/// A template read and checked, ready to render any number of times.
#[derive(Debug, Clone)]
pub struct Template {
    parsed: Parsed,
}

/// How a template renders.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub missing_key: MissingKey,
    pub limits: Limits,
}

impl Template {
    /// Reads `text`; the error names the line and what is wrong there, including a
    /// function berth does not have and why.
    pub fn parse(text: &str, delimiters: &Delimiters) -> Result<Template, ParseError> {
        Ok(Template {
            parsed: parse::parse(text, delimiters)?,
        })
    }

    /// The functions it calls, each once.
    pub fn functions(&self) -> &[&'static str] {
        self.parsed.functions()
    }

    /// Renders it, asking `data` for what comes from outside.
    pub fn render(
        &self,
        data: &mut dyn Data,
        options: &RenderOptions,
    ) -> Result<String, RenderError> {
        let mut exec = exec::Exec::new(&self.parsed, data, &options.limits, options.missing_key);
        exec.run()?;
        Ok(std::mem::take(&mut exec.out))
    }
}
