//! What one render may spend: steps (actions, loop turns, function calls, and each
//! element a function walks or makes), time, bytes of output, and bytes of values
//! made. Every function is charged before it does its work, so that no single call
//! (a `join` of a billion integers, a `sprig_uniq` of a million) runs past the budget
//! inside one step.

use std::time::Instant;

use crate::CallError;
use crate::exec::{Limits, RenderError};

pub(crate) struct Budget {
    pub limits: Limits,
    steps: u64,
    made: usize,
    started: Instant,
    /// What ran out inside a function: the render's error, where the function's own
    /// says only that it stopped.
    pub exceeded: Option<RenderError>,
}

impl Budget {
    pub fn new(limits: &Limits) -> Budget {
        Budget {
            limits: limits.clone(),
            steps: 0,
            made: 0,
            started: Instant::now(),
            exceeded: None,
        }
    }

    pub fn max_output(&self) -> usize {
        self.limits.max_output
    }

    fn spend(&mut self, steps: u64, check_clock: bool) -> Result<(), RenderError> {
        self.steps = self.steps.saturating_add(steps);
        if self.steps > self.limits.max_steps {
            return Err(RenderError::TooManySteps {
                limit: self.limits.max_steps,
            });
        }
        if check_clock && self.started.elapsed() > self.limits.max_time {
            return Err(RenderError::TooLong {
                limit: self.limits.max_time,
            });
        }
        Ok(())
    }

    /// One step of the template itself; the clock is read every 256.
    pub fn step(&mut self) -> Result<(), RenderError> {
        let check_clock = (self.steps + 1).is_multiple_of(256);
        self.spend(1, check_clock)
    }

    /// `steps` of a function's work, before it does it; the clock is read each time
    /// the count passes a multiple of 256.
    pub fn charge(&mut self, steps: u64) -> Result<(), CallError> {
        let check_clock = self.steps / 256 != self.steps.saturating_add(steps) / 256;
        self.spend(steps, check_clock)
            .map_err(|error| self.stop(error))
    }

    /// `steps` as a count of elements.
    pub fn charge_elements(&mut self, elements: usize) -> Result<(), CallError> {
        self.charge(u64::try_from(elements).unwrap_or(u64::MAX))
    }

    /// Bytes of values a function made (kept or not: what a render makes in all).
    pub fn made(&mut self, bytes: usize) -> Result<(), RenderError> {
        self.made = self.made.saturating_add(bytes);
        if self.made > self.limits.max_memory {
            return Err(RenderError::TooMuchMemory {
                limit: self.limits.max_memory,
            });
        }
        Ok(())
    }

    /// Bytes of values a function is about to make, refused before it makes them.
    pub fn will_make(&mut self, bytes: usize) -> Result<(), CallError> {
        if self.made.saturating_add(bytes) > self.limits.max_memory {
            return Err(self.stop(RenderError::TooMuchMemory {
                limit: self.limits.max_memory,
            }));
        }
        Ok(())
    }

    /// Bytes a function makes, counted as it makes them (a copy of a shared string
    /// counts again).
    pub fn take(&mut self, bytes: usize) -> Result<(), CallError> {
        self.will_make(bytes)?;
        self.made = self.made.saturating_add(bytes);
        Ok(())
    }

    /// A string of `len` bytes a function is about to make, checked against the
    /// output limit (no one string may be larger than a whole render).
    pub fn string_of(&mut self, len: usize) -> Result<(), CallError> {
        if len > self.limits.max_output {
            return Err(self.stop(RenderError::TooLarge {
                limit: self.limits.max_output,
            }));
        }
        Ok(())
    }

    fn stop(&mut self, error: RenderError) -> CallError {
        let message = error.to_string();
        self.exceeded = Some(error);
        CallError(message)
    }
}
