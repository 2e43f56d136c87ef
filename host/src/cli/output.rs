//! How events and times look on a terminal.

use crate::model::events::AllocEvent;

pub(super) fn print_event(event: &AllocEvent) {
    println!(
        "    {}  {}  {}  {:<15} {}",
        clock(event.event.time_ms),
        event.alloc_name,
        event.task,
        event.event.kind.to_string(),
        event.event.message
    );
}

/// `HH:MM:SS.mmm` UTC.
pub(super) fn clock(time_ms: u64) -> String {
    let seconds = time_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
        time_ms % 1000
    )
}
