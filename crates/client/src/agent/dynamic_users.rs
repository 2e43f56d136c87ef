//! The agent's dynamic users' pool ([`berth_sys::process::dynamic_users`]): resumed from the
//! state store, every change kept there, and its ids leased host-wide.

use std::sync::Arc;

/// The dynamic users' pool, as the store kept it, keeping every change there.
pub(super) fn pool(
    range: std::ops::RangeInclusive<u32>,
    store: &Arc<berth_state::StateStore>,
    data_dir: &std::path::Path,
) -> berth_sys::process::dynamic_users::DynamicUsers {
    use berth_state::RecordTable;
    use berth_sys::process::dynamic_users::{DynamicUsers, LeaseDir, PoolRecord};
    const KEY: &str = "pool";
    let record = store
        .record::<PoolRecord>(RecordTable::DynamicUsers, KEY)
        .unwrap_or_else(|error| {
            // The ids restored allocs hold are still claimed; only the order of the
            // others is lost.
            tracing::error!(%error, "the dynamic users' release order is unreadable; starting afresh");
            None
        });
    let store = store.clone();
    let pool = DynamicUsers::resume(
        range,
        record,
        Box::new(move |record| {
            if let Err(error) = store.put_record(RecordTable::DynamicUsers, KEY, record) {
                tracing::error!(%error, "keeping the dynamic users' release order");
            }
        }),
    );
    match LeaseDir::open(std::path::Path::new(DYNAMIC_USER_LEASES), data_dir) {
        Ok(leases) => pool.with_leases(Box::new(leases)),
        Err(error) => {
            tracing::warn!(dir = DYNAMIC_USER_LEASES, %error,
                "dynamic user ids are not leased host-wide: another agent of this host with \
                 an overlapping user {{ dynamic_range }} may hand out the same ids");
            pool
        }
    }
}

/// Where the agents of a host lease the dynamic user ids they hand out.
const DYNAMIC_USER_LEASES: &str = "/run/berth/dynamic-users";
