//! What a driver declares about itself (world 0.2.1), checked before the host relies on
//! it: how its spawns are confined, and the fields of its config as `driver inspect`
//! shows them.

use berth_model::driver::{FsIsolation, SpawnIsolation};
use berth_model::text::clip;

use crate::bindings::driver_types as wit;

/// The driver's `spawn-isolation` list, checked against its `fs-isolation`: a driver whose
/// tasks have a root of their own cannot spawn in the host's. Sorted, without repeats.
pub(super) fn spawn_isolation(
    listed: &[wit::Isolation],
    fs_isolation: FsIsolation,
) -> Result<Vec<SpawnIsolation>, SpawnIsolationProblem> {
    // Two kinds exist; a longer list is a driver's mistake, not something to hold.
    if listed.len() > 16 {
        return Err(SpawnIsolationProblem::TooLong(listed.len()));
    }
    let mut spawns: Vec<SpawnIsolation> = (listed.iter())
        .map(|isolation| match isolation {
            wit::Isolation::None => SpawnIsolation::None,
            wit::Isolation::Chroot => SpawnIsolation::Chroot,
        })
        .collect();
    spawns.sort();
    spawns.dedup();
    if fs_isolation.confines() && spawns.contains(&SpawnIsolation::None) {
        return Err(SpawnIsolationProblem::Contradicts(fs_isolation.as_str()));
    }
    Ok(spawns)
}

/// Why a driver's `spawn-isolation` is unusable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum SpawnIsolationProblem {
    #[error("spawn isolation: a list of {0} (there are two kinds)")]
    TooLong(usize),
    #[error(
        "spawn isolation: it lists \"none\" but declares fs-isolation {0:?}, whose tasks \
         have a root of their own"
    )]
    Contradicts(&'static str),
}

/// Whether `name` can be an attribute of a jobspec's `config` block.
pub(super) fn is_attribute_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && (name.chars()).all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `text` on one line, its controls escaped, each run of whitespace one space, clipped.
pub(super) fn one_spaced_line(text: &str, max: usize) -> String {
    let spaced: Vec<&str> = text.split_whitespace().collect();
    clip(&berth_model::text::one_line(&spaced.join(" ")), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_isolation_list_is_sorted_without_repeats_and_bounded() {
        let listed = [
            wit::Isolation::Chroot,
            wit::Isolation::None,
            wit::Isolation::Chroot,
        ];
        assert_eq!(
            spawn_isolation(&listed, FsIsolation::None),
            Ok(vec![SpawnIsolation::None, SpawnIsolation::Chroot])
        );
        assert_eq!(spawn_isolation(&[], FsIsolation::Chroot), Ok(vec![]));
        let long = vec![wit::Isolation::Chroot; 17];
        assert_eq!(
            spawn_isolation(&long, FsIsolation::Chroot),
            Err(SpawnIsolationProblem::TooLong(17))
        );
    }

    /// What a driver says of its config is shown on a terminal: a name is an attribute
    /// name, and a type one line with its whitespace runs collapsed, so neither can
    /// draw rows of its own under `driver inspect`.
    #[test]
    fn a_described_config_field_cannot_draw_rows_of_its_own() {
        assert!(is_attribute_name("image_pull-timeout2"));
        for forged in ["", "a b", "a\nSpawns  chroot", &"x".repeat(65), "caf\u{e9}"] {
            assert!(!is_attribute_name(forged), "{forged:?}");
        }
        let padded = format!("string{}Spawns         chroot\u{1b}[2J", " ".repeat(200));
        assert_eq!(
            one_spaced_line(&padded, 1024),
            "string Spawns chroot\\u{1b}[2J"
        );
        assert!(one_spaced_line(&"list(".repeat(1000), 1024).chars().count() <= 1100);
    }

    /// A driver whose tasks have a root of their own cannot say it spawns in the host's:
    /// the two declarations contradict each other, and the driver is refused at load.
    #[test]
    fn unconfined_spawns_contradict_a_root_of_the_tasks_own() {
        for fs_isolation in [FsIsolation::Chroot, FsIsolation::Image] {
            let refused = spawn_isolation(&[wit::Isolation::None], fs_isolation).unwrap_err();
            assert!(
                (refused.to_string()).contains("lists \"none\" but declares fs-isolation"),
                "{refused}"
            );
        }
    }
}
