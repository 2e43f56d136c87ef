//! `alloc exec`'s websocket frames (Go's `api.ExecStreamingInput` and
//! `api.ExecStreamingOutput`): JSON text frames, bytes in base64 as Go writes a `[]byte`.
//! An input frame with nothing set (`{}`) is a heartbeat.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Some bytes of a stream, or its end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStreamingIoOperation {
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub data: Vec<u8>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub close: bool,
}

/// A terminal's size, in characters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    #[serde(default)]
    pub height: u16,
    #[serde(default)]
    pub width: u16,
}

/// What the client sends: at most one field set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStreamingInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<ExecStreamingIoOperation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty_size: Option<TerminalSize>,
}

/// How the command exited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStreamingExitResult {
    pub exit_code: i32,
}

/// What the agent sends: some output, or (last) the exit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStreamingOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<ExecStreamingIoOperation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<ExecStreamingIoOperation>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exited: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ExecStreamingExitResult>,
}

mod base64_bytes {
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(from: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(from)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_gos_json() {
        let input: ExecStreamingInput =
            serde_json::from_str(r#"{"stdin":{"data":"aWQK"}}"#).unwrap();
        assert_eq!(input.stdin.unwrap().data, b"id\n");
        let input: ExecStreamingInput =
            serde_json::from_str(r#"{"tty_size":{"height":24,"width":80}}"#).unwrap();
        assert_eq!(
            input.tty_size,
            Some(TerminalSize {
                height: 24,
                width: 80
            })
        );
        let heartbeat: ExecStreamingInput = serde_json::from_str("{}").unwrap();
        assert_eq!(heartbeat, ExecStreamingInput::default());
        let exited = ExecStreamingOutput {
            exited: true,
            result: Some(ExecStreamingExitResult { exit_code: 3 }),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&exited).unwrap(),
            r#"{"exited":true,"result":{"exit_code":3}}"#
        );
        let closed = ExecStreamingOutput {
            stdout: Some(ExecStreamingIoOperation {
                data: Vec::new(),
                close: true,
            }),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&closed).unwrap(),
            r#"{"stdout":{"close":true}}"#
        );
        assert!(serde_json::from_str::<ExecStreamingInput>(r#"{"stdin":{"data":"!"}}"#).is_err());
    }
}
