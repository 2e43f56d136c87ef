//! The agent config's `user` block: Nomad's `denylist` and `checked_drivers`, and the
//! `dynamic_range` tasks of confining drivers take their own ids from.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

/// Nomad's `user.denylist` and `user.checked_drivers` (client config): a task of a
/// checked driver may not run as a denied user. The defaults are Nomad's, so `exec`
/// tasks are refused `root` unless the operator says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPolicy {
    pub denylist: Vec<String>,
    pub checked_drivers: Vec<String>,
    /// `dynamic_range`: the uids and gids of `exec` tasks whose job names no user (one
    /// per task, one per alloc for `/alloc`); no host user or group may hold one.
    pub dynamic_range: std::ops::RangeInclusive<u32>,
    /// `subordinate_base`: where the blocks of subordinate ids start that tasks on an
    /// image have in their user namespaces (`image { userns = "private" }`): the task
    /// with dynamic uid `u` has the 65536 from `base + (u - first) * 65536`.
    pub subordinate_base: u32,
}

/// `user { subordinate_base }` when the operator sets none: Nomad's default range's
/// blocks end at 1,655,359,999, below 2^31 - 1.
pub const DEFAULT_SUBORDINATE_BASE: u32 = 1_000_000_000;

impl UserPolicy {
    /// Every subordinate id a task may be given: one block per id of the dynamic range
    /// (`None` when that passes [`MAX_DYNAMIC_ID`]).
    pub fn subordinate_ids(&self) -> Option<std::ops::RangeInclusive<u32>> {
        let ids = u64::from(*self.dynamic_range.end() - *self.dynamic_range.start()) + 1;
        let last = u64::from(self.subordinate_base) + ids * u64::from(NAMESPACE_IDS) - 1;
        (last <= u64::from(MAX_DYNAMIC_ID)).then_some(self.subordinate_base..=last as u32)
    }

    /// The first of the subordinate ids of the task with dynamic uid `uid`; `None` for a
    /// uid outside the range (one a restored alloc took under another config), whose
    /// block no check at start covered.
    pub fn subordinate_block(&self, uid: u32) -> Option<u32> {
        if !self.dynamic_range.contains(&uid) {
            return None;
        }
        let index = uid.checked_sub(*self.dynamic_range.start())?;
        let first = u64::from(self.subordinate_base) + u64::from(index) * u64::from(NAMESPACE_IDS);
        u32::try_from(first).ok()
    }
}

use berth_sys::process::user_namespace::NAMESPACE_IDS;

/// `user { dynamic_range }` when the operator sets none (Nomad's default).
pub const DEFAULT_DYNAMIC_RANGE: std::ops::RangeInclusive<u32> = 80_000..=89_999;

/// Parses `"80000-89999"`; refuses 0 (root), reversed and half ranges.
fn dynamic_range(text: &str) -> Option<std::ops::RangeInclusive<u32>> {
    let (first, last) = text.split_once('-')?;
    let first: u32 = first.trim().parse().ok()?;
    let last: u32 = last.trim().parse().ok()?;
    (first != 0 && first <= last && last <= MAX_DYNAMIC_ID).then_some(first..=last)
}

/// The highest id a dynamic range may hold: uid_t is 32 bits, but `-1` (4294967295)
/// means "unchanged" to setuid(2) and chown(2), and many programs treat ids past
/// 2^31 - 1 as negative.
pub const MAX_DYNAMIC_ID: u32 = i32::MAX as u32;

impl Default for UserPolicy {
    fn default() -> Self {
        UserPolicy {
            denylist: vec!["root".into(), "Administrator".into()],
            checked_drivers: vec!["exec".into(), "docker".into(), "java".into(), "qemu".into()],
            dynamic_range: DEFAULT_DYNAMIC_RANGE,
            subordinate_base: DEFAULT_SUBORDINATE_BASE,
        }
    }
}

/// `private_user_namespaces`: tasks on images get subordinate ids (`image { userns }`),
/// so `subordinate_base` must hold them.
pub(super) fn user_policy(
    block: &BlockNode,
    private_user_namespaces: bool,
    problems: &mut Vec<Problem>,
) -> UserPolicy {
    let mut settings = Fields::new(
        &block.body,
        "config.user".into(),
        block.at,
        &[
            "denylist",
            "checked_drivers",
            "dynamic_range",
            "subordinate_base",
        ],
    );
    let defaults = UserPolicy::default();
    let mut list = |name: &'static str, default: Vec<String>| {
        if settings.attr(name).is_some() {
            settings.string_list(name, problems)
        } else {
            default
        }
    };
    let denylist = list("denylist", defaults.denylist);
    let checked_drivers = list("checked_drivers", defaults.checked_drivers);
    let range = settings.string("dynamic_range", problems);
    let dynamic_range = match range.as_deref().map(|r| (r, dynamic_range(r))) {
        None => defaults.dynamic_range,
        Some((_, Some(range))) => range,
        Some((text, None)) => {
            let at = settings.attr("dynamic_range").map_or(block.at, |v| v.at);
            settings.problem(
                problems,
                "dynamic_range",
                at,
                format!(
                    "{text:?} is not a range of uids: expected \"<first>-<last>\" \
                     with 0 < first <= last <= {MAX_DYNAMIC_ID}, as \"80000-89999\""
                ),
            );
            defaults.dynamic_range
        }
    };
    let subordinate_base = settings
        .number("subordinate_base", u64::from(MAX_DYNAMIC_ID), problems)
        .map_or(defaults.subordinate_base, |n| n as u32);
    let policy = UserPolicy {
        denylist,
        checked_drivers,
        dynamic_range,
        subordinate_base,
    };
    let overlaps = policy.subordinate_ids().is_some_and(|ids| {
        ids.start() <= policy.dynamic_range.end() && policy.dynamic_range.start() <= ids.end()
    });
    if private_user_namespaces && (policy.subordinate_ids().is_none() || overlaps) {
        let ids = u64::from(*policy.dynamic_range.end() - *policy.dynamic_range.start()) + 1;
        settings.problem_with(
            problems,
            "subordinate_base",
            format!(
                "{subordinate_base} cannot hold the subordinate ids of tasks on images: each of \
                 the {ids} ids of dynamic_range gets a block of {NAMESPACE_IDS} from it, which \
                 must end at or below {MAX_DYNAMIC_ID} and not overlap dynamic_range; narrow \
                 dynamic_range, choose another base, or set image {{ userns = \"host\" }}"
            ),
        );
    }
    settings.finish(problems);
    policy
}
