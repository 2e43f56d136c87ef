//! Volume specification files for `berth volume register` and `berth volume create`,
//! in Nomad's shape:
//!
//! ```hcl
//! id          = "data"
//! name        = "data"
//! type        = "csi"
//! plugin_id   = "hostpath"
//! external_id = "vol-0123"      # register only: the plugin's id for an existing volume
//! capacity_min = "10MiB"        # create only
//! capacity_max = "1GiB"
//!
//! capability {
//!   access_mode     = "single-node-writer"
//!   attachment_mode = "file-system"
//! }
//! parameters { }   # create: passed to CreateVolume
//! context { }      # register: the volume context the plugin expects
//! secrets { }
//! ```
//!
//! Errors are an HCL file's (`berth_hcl::FileError`): file, line, path, message; every
//! problem at once.

use std::collections::HashMap;

use super::{Capability, Volume};
use berth_hcl::FileError;
use berth_hcl::Location;
use berth_hcl::fields::Fields;
use berth_model::csi::{AccessMode, AttachmentMode, check_volume_id};

/// What the file asks for: register an existing volume, or create one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecPurpose {
    Register,
    Create,
}

/// A parsed spec; `volume.external_id` is empty for a volume still to be created.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeSpec {
    pub volume: Volume,
    /// (required, limit) bytes; (0, 0) when not given.
    pub capacity: (i64, i64),
}

pub fn parse(file: &str, source: &str, purpose: SpecPurpose) -> Result<VolumeSpec, FileError> {
    let fail = |problems| FileError {
        file: file.to_string(),
        problems,
    };
    let tree = berth_hcl::parse_tree(file, source, "volume")?;
    let mut problems = Vec::new();
    let mut fields = Fields::new(
        &tree,
        "volume".into(),
        Location::default(),
        &[
            "id",
            "name",
            "type",
            "plugin_id",
            "external_id",
            "capacity_min",
            "capacity_max",
            "capability",
            "parameters",
            "context",
            "secrets",
        ],
    );
    let id = fields.required_string("id", &mut problems);
    if let Some(Err(why)) = id.as_deref().map(check_volume_id) {
        let at = fields.attr("id").map(|a| a.at).unwrap_or_default();
        fields.problem(&mut problems, "id", at, why.to_string());
    }
    let name = fields.string("name", &mut problems);
    let volume_type = fields.required_string("type", &mut problems);
    if let Some(other) = volume_type.as_deref().filter(|t| *t != "csi") {
        let at = fields.attr("type").map(|a| a.at).unwrap_or_default();
        let message = if other == "host" {
            "host volumes are configured in the agent's host_volume blocks, not registered"
                .to_string()
        } else {
            format!("unknown volume type {other:?} (use \"csi\")")
        };
        fields.problem(&mut problems, "type", at, message);
    }
    let plugin_id = fields.required_string("plugin_id", &mut problems);
    let external_id = match purpose {
        SpecPurpose::Register => fields.required_string("external_id", &mut problems),
        SpecPurpose::Create => {
            if let Some(attr) = fields.attr("external_id") {
                let at = attr.at;
                fields.problem(
                    &mut problems,
                    "external_id",
                    at,
                    "a volume to create gets its external id from the plugin; use `berth volume register` for an existing one".into(),
                );
            }
            Some(String::new())
        }
    };
    let mut capacity = [0i64; 2];
    for (slot, field) in [(0, "capacity_min"), (1, "capacity_max")] {
        if let Some(bytes) = fields.size(field, &mut problems) {
            // parse_size stops at i64::MAX: CSI capacities are int64.
            capacity[slot] = i64::try_from(bytes).unwrap_or(i64::MAX);
        }
    }
    if capacity[1] != 0 && capacity[0] > capacity[1] {
        fields.problem(
            &mut problems,
            "capacity_min",
            Location::default(),
            "capacity_min is larger than capacity_max".into(),
        );
    }
    let mut capabilities = Vec::new();
    let blocks = fields.blocks("capability");
    for block in &blocks {
        let mut cap = Fields::new(
            &block.body,
            "volume.capability".into(),
            block.at,
            &["access_mode", "attachment_mode"],
        );
        let access = cap.required_string("access_mode", &mut problems);
        let attachment = cap.required_string("attachment_mode", &mut problems);
        let access = access.and_then(|text| {
            AccessMode::parse(&text)
                .map_err(|why| {
                    let at = cap.attr("access_mode").map(|a| a.at).unwrap_or(block.at);
                    cap.problem(&mut problems, "access_mode", at, why.to_string())
                })
                .ok()
        });
        let attachment = attachment.and_then(|text| {
            AttachmentMode::parse(&text)
                .map_err(|why| {
                    let at = cap
                        .attr("attachment_mode")
                        .map(|a| a.at)
                        .unwrap_or(block.at);
                    cap.problem(&mut problems, "attachment_mode", at, why.to_string())
                })
                .ok()
        });
        cap.finish(&mut problems);
        if let (Some(access_mode), Some(attachment_mode)) = (access, attachment) {
            capabilities.push(Capability {
                access_mode,
                attachment_mode,
            });
        }
    }
    if blocks.is_empty() {
        fields.problem(
            &mut problems,
            "capability",
            Location::default(),
            "at least one capability block is needed (access_mode and attachment_mode)".into(),
        );
    }
    let to_map =
        |pairs: Vec<(String, String)>| -> HashMap<String, String> { pairs.into_iter().collect() };
    let parameters = to_map(fields.string_map("parameters", &mut problems));
    let context = to_map(fields.string_map("context", &mut problems));
    let secrets = to_map(fields.string_map("secrets", &mut problems));
    fields.finish(&mut problems);
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    let id = id.unwrap_or_default();
    Ok(VolumeSpec {
        volume: Volume {
            name: name.unwrap_or_else(|| id.clone()),
            id,
            plugin_id: plugin_id.unwrap_or_default(),
            external_id: external_id.unwrap_or_default(),
            capabilities,
            capacity_bytes: 0,
            parameters,
            context,
            secrets,
            origin: match purpose {
                SpecPurpose::Register => "registered".into(),
                SpecPurpose::Create => "created".into(),
            },
            accessible_topology: Vec::new(),
        },
        capacity: (capacity[0], capacity[1]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_volume_to_create() {
        let spec = parse(
            "v.hcl",
            r#"
id        = "data"
type      = "csi"
plugin_id = "hostpath"
capacity_min = "10MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
parameters { speed = "fast" }
"#,
            SpecPurpose::Create,
        )
        .unwrap();
        assert_eq!(spec.volume.name, "data");
        assert_eq!(spec.capacity, (10 << 20, 0));
        assert_eq!(
            spec.volume.capabilities[0].access_mode,
            AccessMode::SingleNodeWriter
        );
        assert_eq!(spec.volume.parameters["speed"], "fast");
    }

    #[test]
    fn every_problem_is_reported_with_its_place() {
        let error = parse(
            "bad.hcl",
            r#"
id   = "a/b"
type = "csi"
capability {
  access_mode     = "single-node-scribbler"
  attachment_mode = "file-system"
}
"#,
            SpecPurpose::Register,
        )
        .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("volume id \"a/b\""), "{text}");
        assert!(text.contains("plugin_id"), "{text}");
        assert!(text.contains("external_id"), "{text}");
        assert!(
            text.contains("unknown access mode \"single-node-scribbler\""),
            "{text}"
        );
        assert!(text.contains("bad.hcl:5:"), "{text}");
    }
}
