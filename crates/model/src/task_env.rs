//! The names of a task's environment that berth owns.

/// Prefixes of the variables berth sets for a task (Nomad's `NOMAD_*`, and its own):
/// what it tells the task about itself, its identity's token included. What a hook or a
/// template produces may not set them.
pub const SET_BY_BERTH: &[&str] = &["NOMAD_", "BERTH_"];

/// The prefix that makes `name` berth's (compared without case), if one does.
pub fn set_by_berth(name: &str) -> Option<&'static str> {
    SET_BY_BERTH.iter().copied().find(|prefix| {
        name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn berths_names_are_found_whatever_their_case_and_others_are_not() {
        assert_eq!(set_by_berth("NOMAD_TOKEN"), Some("NOMAD_"));
        assert_eq!(set_by_berth("Nomad_Alloc_Dir"), Some("NOMAD_"));
        assert_eq!(set_by_berth("berth_data"), Some("BERTH_"));
        assert_eq!(set_by_berth("NOMAD"), None);
        assert_eq!(set_by_berth("APP_NOMAD_X"), None);
        assert_eq!(set_by_berth("é"), None);
    }
}
