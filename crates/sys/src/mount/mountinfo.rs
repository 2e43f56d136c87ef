//! Parses `/proc/<pid>/mountinfo` (proc(5)): which mounts a process sees and how they
//! propagate.

use std::io;
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    /// The path inside the filesystem that is mounted (`/` for a whole filesystem).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw,nosuid`.
    pub options: String,
    /// Propagation tags: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional_fields: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options: for a cgroup v1 mount, its controllers (`rw,memory`).
    pub super_options: String,
}

impl MountEntry {
    pub fn is_read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }

    /// The peer group this mount shares events with, if it is shared.
    pub fn shared_group(&self) -> Option<u32> {
        self.tag("shared:")
    }

    /// The peer group this mount receives events from, if it is a slave.
    pub fn master_group(&self) -> Option<u32> {
        self.tag("master:")
    }

    fn tag(&self, prefix: &str) -> Option<u32> {
        self.optional_fields
            .iter()
            .find_map(|f| f.strip_prefix(prefix)?.parse().ok())
    }
}

/// Parses the whole text of a mountinfo file. Malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut fields = left.split(' ');
    let mount_id = fields.next()?.parse().ok()?;
    let parent_id = fields.next()?.parse().ok()?;
    let _major_minor = fields.next()?;
    let root = PathBuf::from(unescape(fields.next()?));
    let mount_point = PathBuf::from(unescape(fields.next()?));
    let options = fields.next()?.to_string();
    let optional_fields = fields
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect();
    let mut right = right.split(' ');
    let fs_type = right.next()?.to_string();
    let source = unescape(right.next().unwrap_or(""));
    let super_options = right.next().unwrap_or("").to_string();
    Some(MountEntry {
        mount_id,
        parent_id,
        root,
        mount_point,
        options,
        optional_fields,
        fs_type,
        source,
        super_options,
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let (b'\\', Some(digits)) = (bytes[i], octal) {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |acc, d| acc.wrapping_mul(8).wrapping_add(d - b'0')),
            );
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mounts the calling process sees.
pub fn read_self() -> io::Result<Vec<MountEntry>> {
    // The kernel renders the whole table on read: thousands of lines on a busy node.
    crate::blocking::run(|| Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?)))
}

/// The mount that `path` lives on: the last-mounted entry whose mount point is the
/// longest prefix of `path`. `path` should be canonical.
pub fn containing_mount<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.mount_point))
        .max_by_key(|(index, e)| (e.mount_point.components().count(), *index))
        .map(|(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 22 0:30 / /tmp rw,nosuid shared:15 - tmpfs tmpfs rw
301 35 8:1 /srv/data /tmp/task/local/data ro,relatime master:1 - ext4 /dev/vda rw
302 35 8:1 /srv/my\\040dir /tmp/task/local/with\\040space rw,relatime - ext4 /dev/vda rw
";

    #[test]
    fn parses_propagation_tags_and_escapes() {
        let entries = parse(SAMPLE);
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].shared_group(), Some(1));
        assert_eq!(entries[2].master_group(), Some(1));
        assert_eq!(entries[2].shared_group(), None);
        assert!(entries[2].is_read_only());
        assert!(!entries[1].is_read_only());
        assert_eq!(
            entries[3].mount_point,
            PathBuf::from("/tmp/task/local/with space")
        );
        assert_eq!(entries[3].root, PathBuf::from("/srv/my dir"));
        assert!(entries[3].optional_fields.is_empty());
    }

    #[test]
    fn finds_the_mount_a_path_lives_on() {
        let entries = parse(SAMPLE);
        let on = |p: &str| containing_mount(&entries, Path::new(p)).unwrap().mount_id;
        assert_eq!(on("/var/lib"), 22);
        assert_eq!(on("/tmp/x"), 35);
        assert_eq!(on("/tmp/task/local/data/file"), 301);
        // A sibling with a common string prefix is not inside the mount.
        assert_eq!(on("/tmpfoo"), 22);
    }
}
