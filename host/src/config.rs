//! The agent's configuration file (HCL), in Nomad's shape:
//!
//! ```hcl
//! data_dir   = "/var/lib/berth"
//! plugin_dir = "/etc/berth/plugins"
//!
//! host_volume "shared-data" {
//!   path      = "/srv/data"
//!   read_only = false
//! }
//! ```

use std::path::{Path, PathBuf};

use crate::jobspec::fields::Fields;
use crate::jobspec::hcl::{self, Location};
use crate::jobspec::{JobspecError, Problem};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentConfig {
    pub data_dir: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    pub host_volumes: Vec<HostVolume>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostVolume {
    pub name: String,
    pub path: PathBuf,
    pub read_only: bool,
}

impl AgentConfig {
    pub fn host_volume(&self, name: &str) -> Option<&HostVolume> {
        self.host_volumes.iter().find(|v| v.name == name)
    }

    /// Parses an agent config; errors have the same shape as jobspec errors.
    pub fn parse(file: &str, source: &str) -> Result<AgentConfig, JobspecError> {
        let fail = |problems| JobspecError {
            file: file.to_string(),
            problems,
        };
        let tree = hcl::parse(source).map_err(|found| {
            fail(
                found
                    .into_iter()
                    .map(|p| Problem {
                        path: "config".into(),
                        at: Some(p.at),
                        message: p.message,
                    })
                    .collect(),
            )
        })?;
        let mut problems = Vec::new();
        let mut fields = Fields::new(
            &tree,
            "config".into(),
            Location::default(),
            &["data_dir", "plugin_dir", "host_volume"],
        );
        let data_dir = fields.string("data_dir", &mut problems).map(PathBuf::from);
        let plugin_dir = fields
            .string("plugin_dir", &mut problems)
            .map(PathBuf::from);
        let mut host_volumes = Vec::new();
        for (name, block) in fields.labeled_blocks("host_volume", &mut problems) {
            let mut volume = Fields::new(
                &block.body,
                format!("config.host_volume.{name}"),
                block.at,
                &["path", "read_only"],
            );
            let path = volume.required_string("path", &mut problems);
            let read_only = volume.bool("read_only", &mut problems).unwrap_or(false);
            if let Some(path) = path.as_ref().filter(|p| !Path::new(p).is_absolute()) {
                let at = volume.attr("path").map(|v| v.at).unwrap_or(block.at);
                volume.problem(
                    &mut problems,
                    "path",
                    at,
                    format!("{path:?} must be an absolute path"),
                );
            }
            volume.finish(&mut problems);
            if let Some(path) = path {
                host_volumes.push(HostVolume {
                    name,
                    path: PathBuf::from(path),
                    read_only,
                });
            }
        }
        fields.finish(&mut problems);
        if !problems.is_empty() {
            return Err(fail(problems));
        }
        Ok(AgentConfig {
            data_dir,
            plugin_dir,
            host_volumes,
        })
    }

    pub fn parse_file(path: &Path) -> Result<AgentConfig, JobspecError> {
        let file = path.display().to_string();
        let source = std::fs::read_to_string(path).map_err(|e| JobspecError {
            file: file.clone(),
            problems: vec![Problem {
                path: "config".into(),
                at: None,
                message: format!("cannot read the file: {e}"),
            }],
        })?;
        Self::parse(&file, &source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_volumes() {
        let config = AgentConfig::parse(
            "agent.hcl",
            "plugin_dir = \"/p\"\nhost_volume \"data\" {\n  path = \"/srv/data\"\n  read_only = true\n}\n",
        )
        .unwrap();
        assert_eq!(config.plugin_dir, Some(PathBuf::from("/p")));
        assert_eq!(
            config.host_volume("data"),
            Some(&HostVolume {
                name: "data".into(),
                path: "/srv/data".into(),
                read_only: true
            })
        );
    }

    #[test]
    fn relative_host_volume_paths_are_refused() {
        let error = AgentConfig::parse("agent.hcl", "host_volume \"d\" {\n  path = \"srv\"\n}\n")
            .unwrap_err();
        assert_eq!(
            error.problems[0].to_string(),
            "2:10: config.host_volume.d.path: \"srv\" must be an absolute path"
        );
    }
}
