//! A group's own network: its namespace ([`netns`]) and the CNI plugins that attach it
//! to a network ([`cni`]), Nomad's bridge among them.

pub mod cni;
pub mod netns;
